"""Timing shared by the latency tables (pruning) and the benchmark: intra-op threads, a call timed to a minimum
duration, the interleaved rotating rounds both measure with (each timed again when other processes took the CPU
during it: `core.contention`), and ONNX Runtime's default thread count.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from tqdm.auto import tqdm

from compressor.core.contention import Quiet, others_cores, snapshot

log = logging.getLogger("compressor")

K = TypeVar("K", bound=Hashable)


def set_threads(threads: int | None) -> int:
    """Set PyTorch's intra-op threads (when given) and return the count in effect."""
    if threads is not None:  # positive: checked by `BenchSpec`
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def time_call(fn: Callable[[], object], min_time_s: float, min_calls: int = 3) -> tuple[float, int]:
    """Fastest seconds per call of `fn`, called until `min_time_s` has passed and at least `min_calls` times.

    The minimum, as `timeit` recommends: on a shared machine other processes only ever add time to a call, so the
    fastest call is the best estimate of the cost of the code itself. Spread comes from the rounds instead.
    Returns (seconds, calls).
    """
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if t1 - start >= min_time_s and len(times) >= min_calls:
            return min(times), len(times)


def _alone(run_round: Callable[[], dict[K, float]], quiet: Quiet) -> dict[K, float]:
    """One round's seconds per call, timed again (after waiting for the CPU) while other processes kept more than
    `quiet.cores` busy during it, as long as `quiet` allows; a round that still had them beside it is kept, counted."""
    while True:
        before = snapshot()
        seconds = run_round()
        load = others_cores(before, snapshot())
        if quiet.calm(load):
            return seconds
        quiet.loads.append(load)
        if len(quiet.loads) == 1:
            then = "waiting for the CPU" if quiet.max_wait_s > 0 else "not waiting ($COMPRESSOR_TIMING_WAIT_S is 0)"
            log.info("timing: other processes kept %.1f cores busy during a round; %s", load, then)
        if not quiet.retry():
            quiet.contended += 1
            return seconds


def timed_rounds(
    calls: Mapping[K, Callable[[], object]],
    rounds: int,
    min_time_s: float,
    min_calls: int = 3,
    warmup: int = 1,
    groups: Sequence[Sequence[K]] | None = None,
    visit: Callable[[K, Callable[[], float]], float] | None = None,
    desc: str | None = None,
    quiet: Quiet | None = None,
    settled: Callable[[Mapping[K, list[float]]], set[K]] | None = None,
) -> dict[K, list[float]]:
    """Seconds per call of each of `calls`, one figure per round: the timing protocol of the benchmark and of the
    latency table.

    Every call is first run `warmup` times. Then each round visits every call once, group by group (`groups`,
    default: all calls in one group), and inside a group in an order rotated one further every round, so slow drift
    of a shared machine (thermal, other processes) spreads over all of them instead of favouring the ones timed
    first; a visit keeps the fastest of at least `min_calls` calls lasting `min_time_s` together (`time_call`).
    Ratios between calls are best taken round by round, figures over rounds as medians. `visit(key, measure)`, when
    given, runs each visit's `measure()` (returning its seconds) and returns them, to observe something around it
    (the benchmark's peak memory). `desc` shows a progress bar over the rounds. A round during which other processes
    kept more of the CPU busy than `quiet` allows (default `Quiet()`) is timed again once they are gone, within its
    limits, and the log says so. `settled(per_round)`, when given, is asked after every round which calls need no
    more rounds (their figure is known well enough): they are left out of the rounds after it, so a call's list may
    be shorter than `rounds`, and its i-th figure was still timed in the same round as every other call's i-th.
    """
    groups = [list(group) for group in groups] if groups is not None else [list(calls)]
    quiet = Quiet() if quiet is None else quiet
    for key in (key for group in groups for key in group):
        for _ in range(warmup):
            calls[key]()
    per_round: dict[K, list[float]] = {key: [] for group in groups for key in group}

    done: set[K] = set()

    def one_round(r: int) -> dict[K, float]:
        seconds = {}
        for group in groups:
            for key in _rotated([k for k in group if k not in done], r):

                def measure(key: K = key) -> float:
                    return time_call(calls[key], min_time_s, min_calls)[0]

                seconds[key] = visit(key, measure) if visit is not None else measure()
        return seconds

    for r in tqdm(range(rounds), desc=desc, leave=False, disable=desc is None):
        for key, value in _alone(lambda r=r: one_round(r), quiet).items():
            per_round[key].append(value)
        if settled is not None:
            done |= settled(per_round)
            if len(done) == len(per_round):
                break
    if (line := quiet.summary(rounds)) is not None:
        log.log(logging.WARNING if quiet.contended else logging.INFO, line)
    return per_round


def _rotated(keys: list, r: int) -> list:
    """`keys` rotated `r` places: the order a round `r` visits them in."""
    shift = r % len(keys) if keys else 0
    return keys[shift:] + keys[:shift]


ORT_DEFAULT_NOTE = "not set: ONNX Runtime's default, one intra-op thread per physical core"


def ort_default_threads() -> int:
    """The intra-op thread count ONNX Runtime uses when none is set: one per physical core of the machine.

    ONNX Runtime does not report it (SessionOptions keeps 0), so it is counted here from the CPU topology
    (distinct package/core pairs of /sys/devices/system/cpu); with onnxruntime 1.32 on Linux this matches the
    threads a default session starts, whatever the process's CPU affinity. Falls back to `os.cpu_count()`.
    """
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            continue
    return len(cores) or os.cpu_count() or 1
