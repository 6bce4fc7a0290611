"""Timing shared by the latency tables (pruning) and the benchmark: intra-op threads, a call timed to a minimum
duration (`Visit`), the interleaved rotating rounds both measure with (`Rounds`: each round timed again when other
processes took the CPU during it, `core.contention`; a call leaving the rounds once its paired ratio is settled), and
ONNX Runtime's default thread count.

The protocol is a schedule the caller drives: it iterates the visits and makes each call itself, so the stage that
owns what is timed (a benchmark candidate, a latency-table block) is never called back from here.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Generic, TypeVar

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


class Visit(Generic[K]):
    """One visit of one call in the timing protocol, driven by the caller: iterate it and make the call once per step.

    It keeps the fastest call's seconds (`seconds`) of at least `min_calls` calls lasting `min_time_s` together, and
    how many calls it took (`calls`). The minimum, as `timeit` recommends: on a shared machine other processes only
    ever add time to a call, so the fastest call is the best estimate of the cost of the code itself; spread comes
    from the rounds instead. A warm-up visit (`timed` False) is `min_calls` calls, kept nowhere.

    The caller makes the call itself (`for _ in visit: predict(batch)`), rather than handing it to the protocol, so
    the stage that owns what is timed keeps control: no callback climbs back into it from `core`.
    """

    def __init__(self, key: K, min_time_s: float, min_calls: int, timed: bool = True) -> None:
        self.key, self.min_time_s, self.min_calls, self.timed = key, min_time_s, min_calls, timed
        self.seconds = float("inf")
        self.calls = 0

    def __iter__(self) -> Iterator[None]:
        self.seconds, self.calls = float("inf"), 0
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            yield
            t1 = time.perf_counter()
            self.seconds, self.calls = min(self.seconds, t1 - t0), self.calls + 1
            if t1 - start >= self.min_time_s and self.calls >= self.min_calls:
                return


def time_call(fn: Callable[[], object], min_time_s: float, min_calls: int = 3) -> tuple[float, int]:
    """Fastest seconds per call of `fn` over one `Visit` (called until `min_time_s` has passed and at least
    `min_calls` times). Returns (seconds, calls)."""
    visit = Visit(None, min_time_s, min_calls)
    for _ in visit:
        fn()
    return visit.seconds, visit.calls


MIN_ROUNDS = 3  # rounds every call gets before its ratio may be called settled
STOPPING_NOTE = (
    "a candidate stops being timed at a shape after {} rounds or more once the 95% interval of its paired ratio to "
    "the reference is within ±{:.0%} of it, or lies wholly below 1 (slower than the reference: never a recommended "
    "speed-up); the reference is timed while any candidate of its shape is"
)


def log_ratio_interval(ratios: Sequence[float]) -> tuple[float, float]:
    """The mean log of paired per-round ratios (at least two) and the half-width of its 95% t-interval.

    Logs, because a ratio's errors multiply; a t-interval, because the rounds are few."""
    import numpy as np
    from scipy import stats

    logs = np.log(np.asarray(ratios, dtype=float))
    return float(logs.mean()), float(stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / np.sqrt(len(logs)))


def settled_ratio(ratios: Sequence[float], precision: float, min_rounds: int = MIN_ROUNDS) -> bool:
    """Whether paired per-round speed-ups `ratios` need no more rounds: at least `min_rounds` of them, and the 95%
    t-interval of their mean log (`log_ratio_interval`) is within ±`precision` (relative) or wholly below 1."""
    if len(ratios) < max(2, min_rounds):
        return False
    mean, half = log_ratio_interval(ratios)
    return bool(half <= math.log1p(precision) or mean + half < 0.0)


class Rounds(Generic[K]):
    """Seconds per call of each of `groups`' keys, one figure per round (`per_round`): the timing protocol of the
    benchmark and of the latency tables, as a schedule of `Visit`s the caller drives.

        rounds = Rounds([["a", "b"]], rounds=5, min_time_s=0.5)
        for visit in rounds:
            for _ in visit:
                calls[visit.key]()
        rounds.per_round  # {"a": [s, s, s, s, s], "b": [...]}

    Every key is first visited `warmup` times, untimed. Then each round visits every key once, group by group, and
    inside a group in an order rotated one further every round, so slow drift of a shared machine (thermal, other
    processes) spreads over all of them instead of favouring the ones timed first; a visit keeps the fastest of at
    least `min_calls` calls lasting `min_time_s` together. Ratios between keys are best taken round by round, figures
    over rounds as medians. `desc` shows a progress bar over the rounds. A round during which other processes kept
    more of the CPU busy than `quiet` allows (default `Quiet()`) is visited again once they are gone, within its
    limits, and the log says so.

    With `reference` (`{key: the key it is compared with}`) and `precision`, `rounds` is a maximum: after each round,
    a key whose paired ratio to its reference is settled (`settled_ratio`) leaves the rounds after it, and a reference
    once every key compared with it has; a key's list may then be shorter than `rounds`, and its i-th figure was still
    timed in the same round as every other key's i-th.
    """

    def __init__(
        self,
        groups: Sequence[Sequence[K]],
        rounds: int,
        min_time_s: float,
        min_calls: int = 3,
        warmup: int = 1,
        desc: str | None = None,
        quiet: Quiet | None = None,
        reference: Mapping[K, K] | None = None,
        precision: float | None = None,
    ) -> None:
        self.groups = [list(group) for group in groups]
        self.rounds, self.min_time_s, self.min_calls, self.warmup = rounds, min_time_s, min_calls, warmup
        self.desc, self.quiet = desc, Quiet() if quiet is None else quiet
        self.reference = dict(reference or {}) if precision is not None else {}
        self.precision = precision
        self.per_round: dict[K, list[float]] = {key: [] for group in self.groups for key in group}
        self.done: set[K] = set()

    def __iter__(self) -> Iterator[Visit[K]]:
        keys = [key for group in self.groups for key in group]
        if self.warmup > 0:
            for key in keys:
                yield Visit(key, 0.0, self.warmup, timed=False)
        for r in tqdm(range(self.rounds), desc=self.desc, leave=False, disable=self.desc is None):
            visits = yield from self._alone(r)
            for visit in visits:
                self.per_round[visit.key].append(visit.seconds)
            self.done |= self._settled()
            if len(self.done) == len(self.per_round):
                break
        if (line := self.quiet.summary(self.rounds)) is not None:
            log.log(logging.WARNING if self.quiet.contended else logging.INFO, line)

    def _round(self, r: int) -> Iterator[Visit[K]]:
        """Round `r`'s visits: group by group, each group's keys not yet settled in an order rotated `r` places."""
        for group in self.groups:
            for key in _rotated([k for k in group if k not in self.done], r):
                yield Visit(key, self.min_time_s, self.min_calls)

    def _alone(self, r: int) -> Generator[Visit[K], None, list[Visit[K]]]:
        """Round `r`, visited again (after waiting for the CPU) while other processes kept more than `quiet.cores`
        busy during it, as long as `quiet` allows; a round that still had them beside it is kept, counted. Returns
        the visits of the round kept."""
        quiet = self.quiet
        while True:
            before = snapshot()
            visits = []
            for visit in self._round(r):
                yield visit
                visits.append(visit)
            load = others_cores(before, snapshot())
            if quiet.calm(load):
                return visits
            quiet.loads.append(load)
            if len(quiet.loads) == 1:
                then = "waiting for the CPU" if quiet.max_wait_s > 0 else "not waiting ($COMPRESSOR_TIMING_WAIT_S is 0)"
                log.info("timing: other processes kept %.1f cores busy during a round; %s", load, then)
            if not quiet.retry():
                quiet.contended += 1
                return visits

    def _settled(self) -> set[K]:
        """The keys whose paired ratio to their reference is settled, and each reference once every key compared
        with it is."""
        if not self.reference:
            return set()
        done = set(self.done)
        for key, ref in self.reference.items():
            times = self.per_round[key]
            paired = self.per_round[ref][: len(times)]
            if key not in done and settled_ratio([r / t for r, t in zip(paired, times, strict=True)], self.precision):
                done.add(key)
        for ref in set(self.reference.values()):
            if all(key in done for key, r in self.reference.items() if r == ref):
                done.add(ref)
        return done


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
