"""Benchmark: quality and throughput of an original model and its pruned / exported variants.

Everything here works on *candidates*: a name, a `predict(batch) -> logits` function, size on disk, FLOPs per example
and heads per layer. PyTorch models and ONNX variants become candidates through `pytorch_candidate` and
`onnx_candidate`, so the measuring code never knows which runtime it times.

Design choices, and why:
- Throughput rounds are *interleaved*: every round visits every (sequence length, batch size) shape and, inside it,
  every candidate in a rotating order, so slow drift of a shared machine (other jobs, thermal state) hits all
  variants alike. Within a round a variant's time is its fastest of several calls (other processes only ever add
  time); across rounds times and speed-ups (computed per round, paired) are summarised by median, inter-quartile
  range and min–max. Results are keyed `[variant][str(seq_len)][str(batch_size)]` (report schema 2).
- Inputs are synthetic token ids of exactly each sequence length with an all-ones attention mask: timing must not
  depend on how a particular batch happens to be padded. FLOPs, and so the FLOP-ideal ratio, are per length (the
  attention scores grow with its square, the projections linearly).
- Quality uses the same tokenised batches for every candidate; accuracy gets a 95% Wilson interval and each
  candidate is compared with the reference on the *same examples* (exact McNemar test on the discordant pairs and a
  paired interval for the accuracy difference), which separates a real loss from sampling noise.
- Peak memory is the growth of the process's resident-set high-water mark (VmHWM, reset through
  /proc/self/clear_refs) above its resident size while a candidate is timed: tracemalloc cannot see PyTorch's or
  ONNX Runtime's allocators. It is taken in every round (same rotating order as the timing) and the median over
  rounds reported. Caveat: all variants share one process, so memory an earlier measurement left resident
  (allocator caches, ONNX Runtime arenas) is not counted again; the figure is a lower bound of a variant's working
  set and depends somewhat on what ran before it, which the rotation and the median even out but do not remove.
- The bench output directory is written atomically (`compressor.atomic.directory`): a killed run leaves the previous
  complete output or none, never half of one.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from scipy import stats
from torch import nn

from compressor import atomic
from compressor.errors import UserError

SCHEMA_VERSION = 2  # 2: throughput/speed-ups keyed [variant][seq_len][batch]; several sequence lengths
BENCH_FILES = ("report.json", "report.md", "throughput_vs_batch.png", "accuracy_vs_speedup.png", "heads_per_layer.png")
LAYOUT = "throughput[variant][seq_len][batch_size], speedups[variant][seq_len][batch_size]"
Batch = dict[str, torch.Tensor]
INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Candidate:
    """One thing to benchmark.

    predict: logits (numpy, [batch, labels]) for one tokenised batch; it ignores keys its model does not take.
    size_bytes: weights on disk. flops_per_example: encoder FLOPs at the first (headline) sequence length (None if
    unknown); flops_by_seq_len: encoder FLOPs per sequence length, when known for several.
    threads: intra-op threads of its runtime when fixed at construction (ONNX Runtime sessions), else None.
    """

    name: str
    predict: Callable[[Batch], np.ndarray]
    size_bytes: int
    flops_per_example: int | None
    kind: Literal["pytorch", "onnx"]
    heads_per_layer: list[int] | None = None
    vocab_size: int | None = None
    threads: int | None = None
    extra: dict = field(default_factory=dict)
    flops_by_seq_len: dict[int, int] = field(default_factory=dict)

    def flops_at(self, seq_len: int, headline_seq_len: int) -> int | None:
        """Encoder FLOPs per example at `seq_len`; `flops_per_example` alone counts as the headline length's."""
        if self.flops_by_seq_len:
            return self.flops_by_seq_len.get(seq_len)
        return self.flops_per_example if seq_len == headline_seq_len else None


# ---------------------------------------------------------------------------------------------------- candidates


def _dir_size(path: Path, patterns: Sequence[str]) -> int:
    return sum(f.stat().st_size for pattern in patterns for f in path.glob(pattern) if f.is_file())


def _lengths(seq_lens: int | Sequence[int]) -> list[int]:
    return [int(seq_lens)] if isinstance(seq_lens, int) else [int(s) for s in seq_lens]


def pytorch_candidate(
    name: str, model: nn.Module, seq_lens: int | Sequence[int], model_dir: str | Path | None = None
) -> Candidate:
    """A PyTorch classifier as a candidate (eval mode, `torch.inference_mode`).

    FLOPs are computed at each of `seq_lens` (one int or several; the first is the headline length). Size is the
    safetensors weight files of `model_dir` when given, else the in-memory parameter bytes.
    """
    from compressor.cost import encoder_flops
    from compressor.layout import present_heads

    model = model.eval()
    accepted = set(inspect.signature(model.forward).parameters)
    keys = tuple(k for k in INPUT_KEYS if k in accepted)

    def predict(batch: Batch) -> np.ndarray:
        with torch.inference_mode():
            return model(**{k: batch[k] for k in keys if k in batch}).logits.float().numpy()

    size = _dir_size(Path(model_dir), ["*.safetensors"]) if model_dir is not None else 0
    if size == 0:
        size = sum(p.numel() * p.element_size() for p in model.parameters())
    flops = {s: int(encoder_flops(model, s)) for s in _lengths(seq_lens)}
    return Candidate(
        name=name,
        predict=predict,
        size_bytes=int(size),
        flops_per_example=next(iter(flops.values())),
        kind="pytorch",
        heads_per_layer=[len(h) for h in present_heads(model)],
        vocab_size=int(model.get_input_embeddings().num_embeddings),
        flops_by_seq_len=flops,
    )


def onnx_candidate(
    name: str,
    variant_dir: str | Path,
    threads: int | None = None,
    flops_per_example: int | Mapping[int, int] | None = None,
    heads_per_layer: list[int] | None = None,
) -> Candidate:
    """An exported ONNX variant (a directory written by `compressor.export`) as a candidate.

    ONNX Runtime fixes its intra-op thread count when the session is created, so `threads` is given here; left
    None, ONNX Runtime picks its default and the candidate records that count (`ort_default_threads`).
    FLOPs and heads are those of the PyTorch model it was exported from (FLOPs as one int for the headline length
    or `{seq_len: flops}`, e.g. the PyTorch candidate's `flops_by_seq_len`); pass them to get FLOP-ideal ratios.
    """
    try:
        from compressor.export import OnnxClassifier
    except ImportError as err:
        raise UserError(f"onnx: ONNX benchmarking needs compressor.export.OnnxClassifier ({err})") from None
    variant_dir = Path(variant_dir)
    if not variant_dir.is_dir():
        raise FileNotFoundError(f"onnx: variant directory '{variant_dir}' not found")
    classifier = OnnxClassifier(variant_dir, threads)
    names = getattr(classifier, "input_names", None)
    keys = tuple(k for k in INPUT_KEYS if names is None or k in names)

    def predict(batch: Batch) -> np.ndarray:
        return np.asarray(classifier({k: batch[k] for k in keys if k in batch}))

    size = getattr(classifier, "size_bytes", None) or _dir_size(variant_dir, ["*.onnx", "*.onnx_data"])
    by_seq = {int(k): int(v) for k, v in flops_per_example.items()} if isinstance(flops_per_example, Mapping) else {}
    return Candidate(
        name=name,
        predict=predict,
        size_bytes=int(size),
        flops_per_example=next(iter(by_seq.values())) if by_seq else flops_per_example,
        kind="onnx",
        heads_per_layer=heads_per_layer,
        threads=threads if threads is not None else ort_default_threads(),
        extra={} if threads is not None else {"threads_note": ORT_DEFAULT_NOTE},
        flops_by_seq_len=by_seq,
    )


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


# ---------------------------------------------------------------------------------------------------- throughput


def set_threads(threads: int | None) -> int:
    """Set PyTorch's intra-op threads (when given) and return the count in effect."""
    if threads is not None:
        if threads < 1:
            raise UserError(f"bench.threads: expected a positive thread count, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


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


def _spread(values: Sequence[float]) -> dict:
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    lo, hi = float(min(values)), float(max(values))
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "min": lo, "max": hi}


def _check_names(candidates: Sequence[Candidate]) -> None:
    names = [c.name for c in candidates]
    if not names:
        raise UserError("bench: no candidates to benchmark")
    if len(set(names)) != len(names):
        raise UserError(f"bench: candidate names must be unique, got {names}")


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
) -> dict:
    """Interleaved timing of every candidate at every (sequence length, batch size).

    After `warmup` calls per candidate and shape, each round visits every sequence length, inside it every batch
    size, and inside that every candidate (order rotated each round) for at least `min_time_s` and `min_calls`
    calls; the fastest call's seconds of each round are kept (medians are taken over rounds). The peak-RSS growth
    is taken around each of those measurements too, so it sees the same rotating order, and reported as the median
    over rounds (see the module docstring for what it does not count).
    Returns {"setup": ..., "results": {name: {str(seq_len): {str(batch): {...}}}}} with per-round seconds,
    median/IQR/min/max of ms per batch and examples/s, and the peak-RSS growth (median and per round).
    """
    _check_names(candidates)
    if not batch_sizes or any(b < 1 for b in batch_sizes) or len(set(batch_sizes)) != len(batch_sizes):
        raise UserError(f"bench.batch_sizes: expected distinct positive batch sizes, got {list(batch_sizes)}")
    lengths = _lengths(seq_lens)
    if not lengths or any(s < 1 for s in lengths) or len(set(lengths)) != len(lengths):
        raise UserError(f"bench.seq_lens: expected distinct positive sequence lengths, got {lengths}")
    used_threads = set_threads(threads)
    vocab = min([c.vocab_size for c in candidates if c.vocab_size] or [100])
    shapes = [(s, b) for s in lengths for b in batch_sizes]
    inputs = {(s, b): synthetic_batch(b, s, vocab, seed + b + 1000 * (s - lengths[0])) for s, b in shapes}
    per_round = {c.name: {shape: [] for shape in shapes} for c in candidates}
    memory: dict[str, dict[tuple[int, int], list[int | None]]] = {c.name: {sh: [] for sh in shapes} for c in candidates}
    for shape in shapes:
        for c in candidates:
            for _ in range(warmup):
                c.predict(inputs[shape])
    order = list(candidates)
    for r in range(rounds):
        rotated = order[r % len(order) :] + order[: r % len(order)]
        for shape in shapes:
            for c in rotated:
                timed: list[float] = []

                def run(c=c, shape=shape, timed=timed) -> None:
                    timed.append(time_call(lambda: c.predict(inputs[shape]), min_time_s, min_calls)[0])

                memory[c.name][shape].append(peak_rss_delta(run))
                per_round[c.name][shape].append(timed[0])
    results: dict[str, dict[str, dict[str, dict]]] = {}
    for c in candidates:
        results[c.name] = {str(s): {} for s in lengths}
        for s, b in shapes:
            secs = per_round[c.name][(s, b)]
            mem = memory[c.name][(s, b)]
            known = [m for m in mem if m is not None]
            results[c.name][str(s)][str(b)] = {
                "seconds_per_round": secs,
                "ms_per_batch": _spread([1000 * x for x in secs]),
                "examples_per_s": _spread([b / x for x in secs]),
                "peak_rss_delta_bytes": int(np.median(known)) if known else None,
                "peak_rss_delta_bytes_per_round": mem,
            }
    thread_notes = {c.name: c.extra["threads_note"] for c in candidates if "threads_note" in c.extra}
    for c in candidates:
        if c.kind == "onnx" and c.threads is None:
            thread_notes[c.name] = ORT_DEFAULT_NOTE
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
        "torch_threads": used_threads,
        "candidate_threads": {
            c.name: (used_threads if c.kind != "onnx" else c.threads or ort_default_threads()) for c in candidates
        },
        "candidate_threads_notes": thread_notes,
        "memory": "peak_rss_delta_bytes: median over rounds of the growth of the process's resident-set high-water "
        "mark while the variant was timed (rotating order); memory left resident by earlier measurements in the "
        "same process is not counted again, so it is a lower bound and only roughly comparable across variants",
        "seed": seed,
    }
    return {"setup": setup, "results": results}


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
                ref = results[reference][s][b]["seconds_per_round"]
                ratios = [r / x for r, x in zip(ref, row["seconds_per_round"], strict=True)]
                out[name][s][b] = {"per_round": ratios, **_spread(ratios)}
    return out


# ---------------------------------------------------------------------------------------------------- quality


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (scipy's implementation)."""
    if n == 0:
        return (float("nan"), float("nan"))
    ci = stats.binomtest(correct, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def mcnemar_exact(candidate_correct: np.ndarray, reference_correct: np.ndarray) -> dict:
    """Exact McNemar test: under H0 the discordant pairs split 50/50 (two-sided binomial test)."""
    better = int(np.sum(candidate_correct & ~reference_correct))
    worse = int(np.sum(~candidate_correct & reference_correct))
    p = 1.0 if better + worse == 0 else float(stats.binomtest(better, better + worse, 0.5).pvalue)
    return {"candidate_only_correct": better, "reference_only_correct": worse, "p_value": p}


def paired_difference_interval(better: int, worse: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Normal-approximation interval for accuracy(candidate) − accuracy(reference) on the same n examples."""
    if n == 0:
        return (float("nan"), float("nan"))
    diff = (better - worse) / n
    var = ((better + worse) - (better - worse) ** 2 / n) / n**2
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    half = z * max(var, 0.0) ** 0.5
    return diff - half, diff + half


def _inputs(batch: Batch) -> Batch:
    return {k: v for k, v in batch.items() if k in INPUT_KEYS}


def collect_logits(candidate: Candidate, batches: Sequence[Batch]) -> np.ndarray:
    return np.concatenate([np.asarray(candidate.predict(_inputs(b)), dtype=np.float32) for b in batches])


def measure_quality(candidates: Sequence[Candidate], batches: Sequence[Batch], reference: str) -> dict:
    """Accuracy (95% Wilson CI) of every candidate on the same batches, and paired comparison with `reference`.

    Batches are tokenised dicts with `labels` (without labels only agreement and logit differences are reported).
    Per candidate: accuracy, interval, agreement with the reference's predictions, max |Δlogit|, exact McNemar
    p-value and a 95% interval for the accuracy difference.
    """
    from compressor.metrics import load_metric

    _check_names(candidates)
    names = [c.name for c in candidates]
    if reference not in names:
        raise UserError(f"bench: reference '{reference}' is not among the candidates {names}")
    if not batches:
        raise UserError("bench: no evaluation batches (expected at least one tokenised batch)")
    has_labels = all("labels" in b for b in batches)
    labels = np.concatenate([b["labels"].numpy() for b in batches]) if has_labels else None
    logits = {c.name: collect_logits(c, batches) for c in candidates}
    preds = {name: x.argmax(-1) for name, x in logits.items()}
    n = int(len(preds[reference]))
    metric = load_metric("accuracy")
    out: dict[str, dict] = {}
    for c in candidates:
        p = preds[c.name]
        row: dict = {
            "n": n,
            "agreement": float(np.mean(p == preds[reference])),
            "max_abs_logit_diff": float(np.max(np.abs(logits[c.name] - logits[reference]))),
        }
        if labels is not None:
            correct = int(np.sum(p == labels))
            acc = metric.compute(predictions=p.tolist(), references=labels.tolist())["accuracy"]
            low, high = wilson_interval(correct, n)
            test = mcnemar_exact(p == labels, preds[reference] == labels)
            better, worse = test["candidate_only_correct"], test["reference_only_correct"]
            d_low, d_high = paired_difference_interval(better, worse, n)
            row |= {
                "accuracy": float(acc),
                "accuracy_ci95": [low, high],
                "accuracy_delta": float(acc) - float(np.mean(preds[reference] == labels)),
                "accuracy_delta_ci95": [d_low, d_high],
                "mcnemar": test,
            }
        out[c.name] = row
    return {"reference": reference, "n": n, "has_labels": has_labels, "results": out}


# ---------------------------------------------------------------------------------------------------- combine


def headline_batch(batch_sizes: Sequence[int]) -> int:
    """The batch size the summary quotes: 32, else the largest measured below 32, else the smallest measured."""
    below = [b for b in batch_sizes if b <= 32]
    return max(below) if below else min(batch_sizes)


def machine_info() -> dict:
    import onnxruntime
    import transformers

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def summarize(candidates: Sequence[Candidate], throughput: dict, quality: dict | None, reference: str) -> dict:
    """Per candidate: size, heads, FLOPs and ratios vs the reference, measured and FLOP-ideal, per sequence length
    (and batch size); the one headline figure is at the headline batch and the first sequence length."""
    speedups = paired_speedups(throughput, reference)
    by_name = {c.name: c for c in candidates}
    ref = by_name[reference]
    setup = throughput["setup"]
    lengths = setup["seq_lens"]
    seq, head = str(lengths[0]), str(headline_batch(setup["batch_sizes"]))
    summary = {}
    for c in candidates:
        flops = {str(s): c.flops_at(s, lengths[0]) for s in lengths}
        ref_flops = {str(s): ref.flops_at(s, lengths[0]) for s in lengths}
        ideal = {s: ref_flops[s] / flops[s] if ref_flops[s] and flops[s] else None for s in flops}
        speed = {s: {b: row["median"] for b, row in rows.items()} for s, rows in speedups[c.name].items()}
        entry = {
            "kind": c.kind,
            "size_bytes": c.size_bytes,
            "size_ratio": ref.size_bytes / c.size_bytes if c.size_bytes else None,
            "flops_per_example": flops[seq],
            "flops_per_example_by_seq_len": flops,
            "flop_ideal_speedup": ideal[seq],
            "flop_ideal_speedup_by_seq_len": ideal,
            "heads_per_layer": c.heads_per_layer,
            "heads": sum(c.heads_per_layer) if c.heads_per_layer is not None else None,
            "speedup": speed,
            "speedup_iqr": {
                s: {b: [row["q1"], row["q3"]] for b, row in rows.items()} for s, rows in speedups[c.name].items()
            },
            "headline_seq_len": int(seq),
            "headline_batch": int(head),
            "headline_speedup": speed[seq][head],
            "speedup_over_ideal": speed[seq][head] / ideal[seq] if ideal[seq] else None,
        }
        if quality is not None:
            q = quality["results"][c.name]
            entry |= {k: q.get(k) for k in ("accuracy", "accuracy_ci95", "accuracy_delta", "agreement")}
            entry["mcnemar_p"] = q.get("mcnemar", {}).get("p_value")
        summary[c.name] = entry
    return summary


def bench(
    candidates: Sequence[Candidate],
    batches: Sequence[Batch] | None,
    spec,
    out_dir: str | Path | None,
    reference: str = "pytorch-original",
) -> dict:
    """Quality (when `batches` are given) and throughput per `spec` (a `compressor.recipe.BenchSpec`), with ratios
    against `reference`; writes report.json, report.md and plots into `out_dir` when given (atomically: the whole
    directory is replaced, so it must be empty or hold only an earlier benchmark's files). Returns the result."""
    _check_names(candidates)
    if reference not in [c.name for c in candidates]:
        raise UserError(f"bench: reference '{reference}' is not among the candidates {[c.name for c in candidates]}")
    if out_dir is not None:
        check_out_dir(out_dir)  # before minutes of measuring
    set_threads(spec.threads)
    quality = measure_quality(candidates, batches, reference) if batches else None
    throughput = measure_throughput(
        candidates,
        spec.batch_sizes,
        spec.seq_lens,
        rounds=spec.rounds,
        warmup=spec.warmup,
        min_time_s=spec.min_time_s,
        threads=spec.threads,
    )
    result = {
        "schema_version": SCHEMA_VERSION,
        "reference": reference,
        "machine": machine_info(),
        "setup": throughput["setup"],
        "summary": summarize(candidates, throughput, quality, reference),
        "quality": quality,
        "throughput": throughput["results"],
        "speedups": paired_speedups(throughput, reference),
    }
    if out_dir is not None:
        result["files"] = [str(p) for p in write_bench_report(result, out_dir)]
    return result


# ---------------------------------------------------------------------------------------------------- report


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _quality_md(result: dict) -> list[str]:
    q = result["quality"]
    if q is None:
        return ["No evaluation data was given; quality was not measured.", ""]
    ref = q["reference"]
    lines = [
        f"{q['n']} examples, the same batches for every variant. Δ and McNemar compare each variant with `{ref}` "
        "on the same examples; p ≥ 0.05 means the difference is within noise.",
        "",
        "| variant | accuracy (%) | 95% CI | Δ vs ref (points) | 95% CI of Δ | agreement (%) | max abs Δlogit | "
        "McNemar p |",
        "|---|---:|---|---:|---|---:|---:|---:|",
    ]
    for name, row in q["results"].items():
        if q["has_labels"]:
            ci, dci = row["accuracy_ci95"], row["accuracy_delta_ci95"]
            acc = f"{_pct(row['accuracy'])} | {_pct(ci[0])}–{_pct(ci[1])} | {100 * row['accuracy_delta']:+.2f} | "
            acc += f"{100 * dci[0]:+.2f} to {100 * dci[1]:+.2f}"
            p = _f(row["mcnemar"]["p_value"], ".3g")
        else:
            acc, p = "– | – | – | –", "–"
        lines.append(f"| {name} | {acc} | {_pct(row['agreement'])} | {row['max_abs_logit_diff']:.2e} | {p} |")
    return lines + [""]


def _throughput_md(result: dict) -> list[str]:
    setup, ref = result["setup"], result["reference"]
    lines = []
    for seq in setup["seq_lens"]:
        for b in setup["batch_sizes"]:
            lines += [
                f"### Sequence length {seq}, batch {b}",
                "",
                "| variant | examples/s (median) | IQR | ms/batch (median) | min–max ms | speed-up vs ref | IQR | "
                "FLOP-ideal | measured / ideal | peak RSS growth (MB) |",
                "|---|---:|---|---:|---|---:|---|---:|---:|---:|",
            ]
            for name, per_seq in result["throughput"].items():
                row, sp = per_seq[str(seq)][str(b)], result["speedups"][name][str(seq)][str(b)]
                eps, ms = row["examples_per_s"], row["ms_per_batch"]
                ideal = result["summary"][name]["flop_ideal_speedup_by_seq_len"][str(seq)]
                mem = row["peak_rss_delta_bytes"]
                lines.append(
                    f"| {name} | {eps['median']:.1f} | {eps['q1']:.1f}–{eps['q3']:.1f} | {ms['median']:.2f} | "
                    f"{ms['min']:.2f}–{ms['max']:.2f} | {sp['median']:.3f}× | {sp['q1']:.3f}–{sp['q3']:.3f} | "
                    f"{_f(ideal, '.3f')} | {_f(sp['median'] / ideal if ideal else None, '.3f')} | "
                    f"{_f(mem / 1e6 if mem is not None else None, '.1f')} |"
                )
            lines.append("")
    lines += [
        f"Speed-ups are per-round ratios of seconds per batch against `{ref}` (paired within a round). The FLOP-ideal "
        "ratio is that of encoder FLOPs at the table's sequence length.",
        "",
        f"Peak RSS growth: {MEMORY_CAVEAT}",
    ]
    return lines + [""]


MEMORY_CAVEAT = (
    "how far the process's resident-set high-water mark rose above its resident size while the variant was timed, "
    "median over the rounds (variants visited in a rotating order). All variants run in one process, so memory an "
    "earlier measurement left resident (allocator caches, ONNX Runtime arenas) is not counted again: this is a lower "
    "bound of a variant's working set that still depends somewhat on what ran before it; compare orders of "
    "magnitude, not small differences."
)


def _size_md(result: dict) -> list[str]:
    lengths = result["setup"]["seq_lens"]
    flop_cols = " | ".join(f"encoder FLOPs / example at {s} tokens" for s in lengths)
    lines = [
        f"| variant | kind | size on disk (MB) | size ratio | heads | heads per layer | {flop_cols} |",
        "|---|---|---:|---:|---:|---|" + "---:|" * len(lengths),
    ]
    for name, s in result["summary"].items():
        hpl = " ".join(map(str, s["heads_per_layer"])) if s["heads_per_layer"] is not None else "–"
        by_seq = s["flops_per_example_by_seq_len"]
        flops = " | ".join(f"{by_seq[str(t)]:,}" if by_seq[str(t)] else "–" for t in lengths)
        lines.append(
            f"| {name} | {s['kind']} | {s['size_bytes'] / 1e6:.1f} | {_f(s['size_ratio'], '.2f')}× | "
            f"{_f(s['heads'], 'd')} | {hpl} | {flops} |"
        )
    return lines + [""]


def render_bench_md(result: dict) -> str:
    """Markdown tables for a `bench` result (pure function of the dict, so it can be re-rendered from JSON)."""
    setup, m, ref = result["setup"], result["machine"], result["reference"]
    head, seq = headline_batch(setup["batch_sizes"]), setup["seq_lens"][0]
    lines = [
        "# Benchmark",
        "",
        f"Reference: `{ref}`. Sequence lengths {setup['seq_lens']} (synthetic ids, no padding); batch sizes "
        f"{setup['batch_sizes']}; every length at every batch size. {setup['rounds']} interleaved rounds (each the "
        f"fastest call of ≥ {setup.get('min_calls', 1)} calls and ≥ {setup['min_time_s']} s) after "
        f"{setup['warmup']} warm-up calls; PyTorch threads {setup['torch_threads']}; threads per variant "
        f"{setup['candidate_threads']}.",
    ]
    for name, note in setup.get("candidate_threads_notes", {}).items():
        lines.append(f"Threads of `{name}`: {note}.")
    lines += [
        f"Machine: {m['processor']}, {m['cpu_count']} CPUs, load average at the end {m['load_average']}; "
        f"torch {m['torch']}, onnxruntime {m['onnxruntime']}. Absolute times depend on the machine and its load; "
        "compare ratios.",
        "",
        f"## Summary (batch {head}, sequence length {seq})",
        "",
        "| variant | accuracy (%) | Δ vs ref (points) | McNemar p | speed-up | FLOP-ideal | size ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in result["summary"].items():
        delta = None if s.get("accuracy_delta") is None else f"{100 * s['accuracy_delta']:+.2f}"
        lines.append(
            f"| {name} | {_pct(s.get('accuracy'))} | {delta or '–'} | {_f(s.get('mcnemar_p'), '.3g')} | "
            f"{s['headline_speedup']:.3f}× | {_f(s['flop_ideal_speedup'], '.3f')} | {_f(s['size_ratio'], '.2f')}× |"
        )
    lines += ["", "## Quality", "", *_quality_md(result), "## Throughput", "", *_throughput_md(result)]
    lines += ["## Size and heads", "", *_size_md(result)]
    lines += ["## Plots", "", "![throughput](throughput_vs_batch.png)", ""]
    lines += ["![accuracy vs speed-up](accuracy_vs_speedup.png)", "", "![heads per layer](heads_per_layer.png)", ""]
    return "\n".join(lines)


def _save(fig, ax, path: Path) -> Path:
    """Finish a benchmark figure the same way for every plot: grid, legend, tight layout, PNG, closed."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def _plot_throughput(result: dict, path: Path) -> Path:
    """Examples/s vs batch size: one colour per variant, one line style and marker per sequence length."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    sizes, lengths = result["setup"]["batch_sizes"], result["setup"]["seq_lens"]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, per_seq) in enumerate(result["throughput"].items()):
        for j, seq in enumerate(lengths):
            rows = per_seq[str(seq)]
            med = [rows[str(b)]["examples_per_s"]["median"] for b in sizes]
            low = [rows[str(b)]["examples_per_s"]["q1"] for b in sizes]
            high = [rows[str(b)]["examples_per_s"]["q3"] for b in sizes]
            colour = colours[i % len(colours)]
            label = name if len(lengths) == 1 else f"{name}, {seq} tokens"
            style = {"ls": LINE_STYLES[j % len(LINE_STYLES)], "marker": MARKERS[j % len(MARKERS)]}
            ax.plot(sizes, med, color=colour, label=label, **style)
            ax.fill_between(sizes, low, high, color=colour, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("examples / s (median, IQR band)")
    if len(lengths) > 1:
        ax.set_yscale("log")
    which = "length" if len(lengths) == 1 else "lengths"
    ax.set_title(f"Throughput at sequence {which} {', '.join(map(str, lengths))}")
    return _save(fig, ax, path)


def _plot_accuracy_speedup(result: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    head, seq = str(headline_batch(result["setup"]["batch_sizes"])), str(result["setup"]["seq_lens"][0])
    for name, s in result["summary"].items():
        sp = result["speedups"][name][seq][head]
        acc = s.get("accuracy")
        y = 100 * acc if acc is not None else 100 * s.get("agreement", float("nan"))
        ci = s.get("accuracy_ci95")
        yerr = [[y - 100 * ci[0]], [100 * ci[1] - y]] if ci else None
        xerr = [[sp["median"] - sp["q1"]], [sp["q3"] - sp["median"]]]
        ax.errorbar(sp["median"], y, xerr=xerr, yerr=yerr, fmt="o", capsize=3, label=name)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(f"speed-up vs {result['reference']} at batch {head}, {seq} tokens (median, IQR)")
    has_acc = result["quality"] is not None and result["quality"]["has_labels"]
    ax.set_ylabel("accuracy (%), 95% CI" if has_acc else "agreement with reference (%)")
    ax.set_title("Accuracy vs speed-up")
    return _save(fig, ax, path)


def _plot_heads(result: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = {}
    for name, s in result["summary"].items():
        hpl = s["heads_per_layer"]
        if hpl is not None and tuple(hpl) not in {tuple(v) for v in rows.values()}:
            rows[name] = hpl
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    width = 0.8 / max(len(rows), 1)
    for i, (name, hpl) in enumerate(rows.items()):
        ax.bar(np.arange(len(hpl)) + i * width, hpl, width=width, label=name)
    if rows:
        n_layers = len(next(iter(rows.values())))
        ax.set_xticks(np.arange(n_layers) + width * (len(rows) - 1) / 2, [str(i) for i in range(n_layers)])
    ax.set_xlabel("layer")
    ax.set_ylabel("attention heads left")
    ax.set_title("Heads left per layer")
    if rows:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def check_out_dir(out_dir: str | Path) -> Path:
    """Refuse an output directory that holds anything but an earlier benchmark's files (`BENCH_FILES`): the bench
    report replaces the whole directory, so it must never be pointed at a directory with other contents."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"bench output: '{out}' is a file; expected a directory for report.json, report.md and plots")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in BENCH_FILES)
        if other:
            shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
            raise UserError(
                f"bench output: '{out}' holds other files ({shown}); expected an empty directory or an earlier "
                "benchmark's output (it is replaced as a whole)"
            )
    return out


def write_bench_report(result: dict, out_dir: str | Path) -> list[Path]:
    """Write report.json (versioned), report.md and three PNG plots as the directory `out_dir`; returns the paths.

    The directory is built aside and swapped in (`compressor.atomic.directory`): readers, and a killed run, see the
    previous complete output or the new one, never a mix.
    """
    import matplotlib

    matplotlib.use("Agg")
    out = check_out_dir(out_dir)
    payload = {k: v for k, v in result.items() if k != "files"}
    payload["schema_version"] = SCHEMA_VERSION
    with atomic.directory(out) as tmp:
        (tmp / "report.json").write_text(json.dumps(payload, indent=2, default=str))
        (tmp / "report.md").write_text(render_bench_md(payload))
        _plot_throughput(payload, tmp / "throughput_vs_batch.png")
        _plot_accuracy_speedup(payload, tmp / "accuracy_vs_speedup.png")
        _plot_heads(payload, tmp / "heads_per_layer.png")
    return [out / name for name in BENCH_FILES]
