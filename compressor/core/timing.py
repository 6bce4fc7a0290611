"""Timing primitives shared by the latency tables (pruning) and the benchmark: intra-op threads and a
call timed to a minimum duration; ONNX Runtime's default thread count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch


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
