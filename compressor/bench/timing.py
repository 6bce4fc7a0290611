"""Throughput: interleaved, rotating timing rounds over synthetic batches, peak memory, paired speed-ups."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from compressor.bench.candidates import Batch, Candidate, check_names, lengths_of
from compressor.core.errors import UserError
from compressor.core.timing import (
    MIN_ROUNDS,
    ORT_DEFAULT_NOTE,
    STOPPING_NOTE,
    Rounds,
    Visit,
    ort_default_threads,
    set_threads,
)

log = logging.getLogger("compressor")

LAYOUT = "throughput[variant][seq_len][batch_size], speedups[variant][seq_len][batch_size]"


def synthetic_batch(batch_size: int, seq_len: int, vocab_size: int, seed: int) -> Batch:
    """Random token ids (avoiding the first ids, which are special tokens) of exactly `seq_len`, no padding."""
    g = torch.Generator().manual_seed(seed)
    low = min(5, vocab_size - 1)
    ids = torch.randint(low, vocab_size, (batch_size, seq_len), generator=g)
    ones = torch.ones(batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": ones, "token_type_ids": torch.zeros_like(ones)}


def _status_kb(key: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _reset_peak() -> bool:
    """Reset the resident-set high-water mark (Linux); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_delta(fn: Callable[[], object]) -> int | None:
    """Bytes by which the process's peak resident set grows above its current size while `fn` runs.

    `fn` always runs; None where the peak cannot be reset or read (not Linux).
    """
    reset = _reset_peak()
    before = _status_kb("VmRSS") if reset else None
    fn()
    peak = _status_kb("VmHWM") if reset else None
    if before is None or peak is None:
        return None
    return max(0, peak - before) * 1024


def _spread(values: Sequence[float]) -> dict:
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    lo, hi = float(min(values)), float(max(values))
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "min": lo, "max": hi}


def measure_throughput(
    candidates: Sequence[Candidate],
    batch_sizes: Sequence[int],
    seq_lens: int | Sequence[int],
    rounds: int = 5,
    warmup: int = 2,
    min_time_s: float = 0.5,
    threads: int | None = None,
    seed: int = 0,
    min_calls: int = 3,
    desc: str = "bench rounds",
    precision: float | None = None,
    reference: str | None = None,
) -> dict:
    """Interleaved timing of every candidate at every (sequence length, batch size), by `core.timing.Rounds`.

    After `warmup` calls per candidate and shape, each round visits every sequence length, inside it every batch
    size, and inside that every candidate (order rotated each round) for at least `min_time_s` and `min_calls`
    calls; the fastest call's seconds of each round are kept (medians are taken over rounds). The peak-RSS growth
    is taken around each of those measurements too, so it sees the same rotating order, and reported as the median
    over rounds (see the module docstring for what it does not count).
    Returns {"setup": ..., "results": {name: {str(seq_len): {str(batch): {...}}}}} with per-round seconds,
    median/IQR/min/max of ms per batch and examples/s, and the peak-RSS growth (median and per round); `desc` names
    the progress bar over the rounds. With `precision` and `reference`, `rounds` is a maximum: a candidate stops
    being timed at a shape once its paired ratio to `reference` is settled (`core.timing.settled_ratio`), and the
    reference once every other candidate at that shape has. The protocol's settings are keyword arguments (not a
    `BenchSpec`) because `compressor bench`, the run's bench, the budget check and the benchmarks/ scripts each call
    it with their own.
    """
    check_names(candidates)
    lengths = lengths_of(seq_lens)  # batch sizes and lengths are checked by `BenchSpec`
    used_threads = set_threads(threads)
    vocab = min([c.vocab_size for c in candidates if c.vocab_size] or [100])
    shapes = [(s, b) for s in lengths for b in batch_sizes]
    inputs = {(s, b): synthetic_batch(b, s, vocab, seed + b + 1000 * (s - lengths[0])) for s, b in shapes}
    memory: dict[tuple[str, tuple[int, int]], list[int | None]] = {}
    predict = {(c.name, shape): c.predict for shape in shapes for c in candidates}
    groups = [[(c.name, shape) for c in candidates] for shape in shapes]  # every shape's candidates, rotated
    log.info("bench: timing %d candidates at %d shapes, %d rounds", len(candidates), len(shapes), rounds)
    stopping = precision is not None and reference is not None
    compared = {(c.name, shape): (reference, shape) for shape in shapes for c in candidates if c.name != reference}
    schedule = Rounds(
        groups, rounds, min_time_s, min_calls, warmup, desc, reference=compared if stopping else None,
        precision=precision,
    )  # fmt: skip
    for visit in schedule:
        fn, batch = predict[visit.key], inputs[visit.key[1]]
        run = partial(_visit, visit, fn, batch)
        if visit.timed:  # the peak memory around every timed visit, so it sees the same rotating order
            memory.setdefault(visit.key, []).append(peak_rss_delta(run))
        else:
            run()
    secs = schedule.per_round
    setup = {
        "batch_sizes": list(batch_sizes),
        "seq_lens": lengths,
        "headline_seq_len": lengths[0],
        "headline_batch": headline_batch(batch_sizes),
        "layout": LAYOUT,
        "rounds": rounds,
        "warmup": warmup,
        "min_time_s": min_time_s,
        "min_calls": min_calls,
        "precision": precision,
        "stopping": STOPPING_NOTE.format(MIN_ROUNDS, precision) if stopping else None,
        "torch_threads": used_threads,
        **_threads_setup(candidates, used_threads),
        "memory": MEMORY_NOTE,
        "seed": seed,
    }
    return {"setup": setup, "results": _results(candidates, shapes, secs, memory)}


def _visit(visit: Visit, predict: Callable[[Batch], object], batch: Batch) -> None:
    """Drive one visit of the protocol: `predict(batch)` once per step."""
    for _ in visit:
        predict(batch)


MEMORY_NOTE = (
    "peak_rss_delta_bytes: median over rounds of the growth of the process's resident-set high-water mark while the "
    "variant was timed (rotating order); memory left resident by earlier measurements in the same process is not "
    "counted again, so it is a lower bound and only roughly comparable across variants"
)


def _results(candidates: Sequence[Candidate], shapes: list[tuple[int, int]], secs: dict, memory: dict) -> dict:
    """{name: {str(seq_len): {str(batch): {...}}}}: per-round seconds, the spread of ms per batch and examples/s,
    and the peak-RSS growth (median and per round) of every candidate at every shape."""
    results: dict[str, dict[str, dict[str, dict]]] = {}
    for c in candidates:
        results[c.name] = {str(s): {} for s in dict.fromkeys(s for s, _ in shapes)}
        for s, b in shapes:
            mem = memory[(c.name, (s, b))]
            known = [m for m in mem if m is not None]
            times = secs[(c.name, (s, b))]
            results[c.name][str(s)][str(b)] = {
                "seconds_per_round": times,
                "ms_per_batch": _spread([1000 * x for x in times]),
                "examples_per_s": _spread([b / x for x in times]),
                "peak_rss_delta_bytes": int(np.median(known)) if known else None,
                "peak_rss_delta_bytes_per_round": mem,
            }
    return results


def _threads_setup(candidates: Sequence[Candidate], used_threads: int) -> dict:
    """The threads each candidate ran with (PyTorch's setting, or the ONNX session's), and why where it differs."""
    notes = {c.name: c.extra["threads_note"] for c in candidates if "threads_note" in c.extra}
    for c in candidates:
        if c.kind == "onnx" and c.threads is None:
            notes[c.name] = ORT_DEFAULT_NOTE
    threads = {c.name: used_threads if c.kind == "pytorch" else c.threads or ort_default_threads() for c in candidates}
    return {"candidate_threads": threads, "candidate_threads_notes": notes}


def paired_speedups(throughput: dict, reference: str) -> dict:
    """Per candidate, sequence length and batch size: speed-up vs `reference` (reference seconds / candidate
    seconds) per round, and its median/IQR/min/max. Keyed like the throughput results: [name][seq_len][batch]."""
    results = throughput["results"]
    if reference not in results:
        raise UserError(f"bench: reference '{reference}' is not among the candidates {sorted(results)}")
    out: dict[str, dict[str, dict[str, dict]]] = {}
    for name, per_seq in results.items():
        out[name] = {}
        for s, per_batch in per_seq.items():
            out[name][s] = {}
            for b, row in per_batch.items():
                times = row["seconds_per_round"]  # a settled candidate has fewer rounds, paired with the first ones
                ref = results[reference][s][b]["seconds_per_round"][: len(times)]
                ratios = [r / x for r, x in zip(ref, times, strict=True)]
                out[name][s][b] = {"per_round": ratios, **_spread(ratios)}
    return out


def paired_check(
    candidate: Candidate,
    reference: Candidate,
    batch_size: int,
    seq_len: int,
    rounds: int,
    min_time_s: float,
    threads: int | None = None,
) -> dict:
    """`candidate`'s speed-up over `reference` with nothing else timed between them: the two alone in interleaved
    rounds at one shape, a visit keeping the fastest of calls lasting `min_time_s` (one call allowed: a base-size
    model's outlasts it), and the per-round ratios with their spread (as `paired_speedups`), `vs` naming the
    reference.

    A bench of many candidates pairs them within a round too, but a round of a base-size family's bench lasts
    minutes, and a shared machine's speed drifts between a member's visit and the original's: the verdict on a
    speed-up target is taken from this instead, as a pruning step's own check is.
    """
    throughput = measure_throughput(
        [reference, candidate], [batch_size], [seq_len], rounds, warmup=2, min_time_s=min_time_s, threads=threads,
        min_calls=1, desc=f"{candidate.name} vs {reference.name}",
    )  # fmt: skip
    row = paired_speedups(throughput, reference.name)[candidate.name][str(seq_len)][str(batch_size)]
    return {**row, "vs": reference.name}


def headline_batch(batch_sizes: Sequence[int]) -> int:
    """The batch size the summary quotes: 32, else the largest measured below 32, else the smallest measured."""
    below = [b for b in batch_sizes if b <= 32]
    return max(below) if below else min(batch_sizes)
