"""Benchmark: quality and throughput of an original model and its pruned / exported variants.

Everything here works on *candidates*: a name, a `predict(batch) -> logits` function, size on disk, FLOPs per example
and heads per layer. PyTorch models and ONNX variants become candidates through `pytorch_candidate` and
`onnx_candidate`, so the measuring code never knows which runtime it times.

Design choices, and why:
- Throughput rounds are *interleaved*: every round visits every batch size and, inside it, every candidate in a
  rotating order, so slow drift of a shared machine (other jobs, thermal state) hits all variants alike. Within a
  round a variant's time is its fastest of several calls (other processes only ever add time); across rounds
  times and speed-ups (computed per round, paired) are summarised by median, inter-quartile range and min–max.
- Inputs are synthetic token ids of exactly `seq_len` with an all-ones attention mask: timing must not depend on how
  a particular batch happens to be padded.
- Quality uses the same tokenised batches for every candidate; accuracy gets a 95% Wilson interval and each
  candidate is compared with the reference on the *same examples* (exact McNemar test on the discordant pairs and a
  paired interval for the accuracy difference), which separates a real loss from sampling noise.
- Peak memory is the growth of the process's resident-set high-water mark (VmHWM, reset through
  /proc/self/clear_refs) while a candidate runs: tracemalloc cannot see PyTorch's or ONNX Runtime's allocators.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from scipy import stats
from torch import nn

from compressor import atomic
from compressor.errors import UserError

SCHEMA_VERSION = 1
Batch = dict[str, torch.Tensor]
INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Candidate:
    """One thing to benchmark.

    predict: logits (numpy, [batch, labels]) for one tokenised batch; it ignores keys its model does not take.
    size_bytes: weights on disk. flops_per_example: encoder FLOPs at the benchmark's seq_len (None if unknown).
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


# ---------------------------------------------------------------------------------------------------- candidates


def _dir_size(path: Path, patterns: Sequence[str]) -> int:
    return sum(f.stat().st_size for pattern in patterns for f in path.glob(pattern) if f.is_file())


def pytorch_candidate(name: str, model: nn.Module, seq_len: int, model_dir: str | Path | None = None) -> Candidate:
    """A PyTorch classifier as a candidate (eval mode, `torch.inference_mode`).

    Size is the safetensors weight files of `model_dir` when given, else the in-memory parameter bytes.
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
    return Candidate(
        name=name,
        predict=predict,
        size_bytes=int(size),
        flops_per_example=int(encoder_flops(model, seq_len)),
        kind="pytorch",
        heads_per_layer=[len(h) for h in present_heads(model)],
        vocab_size=int(model.get_input_embeddings().num_embeddings),
    )


def onnx_candidate(
    name: str,
    variant_dir: str | Path,
    threads: int | None = None,
    flops_per_example: int | None = None,
    heads_per_layer: list[int] | None = None,
) -> Candidate:
    """An exported ONNX variant (a directory written by `compressor.export`) as a candidate.

    ONNX Runtime fixes its intra-op thread count when the session is created, so `threads` is given here.
    FLOPs and heads are those of the PyTorch model it was exported from; pass them to get FLOP-ideal ratios.
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
    return Candidate(
        name=name,
        predict=predict,
        size_bytes=int(size),
        flops_per_example=flops_per_example,
        kind="onnx",
        heads_per_layer=heads_per_layer,
        threads=threads,
    )


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
    """Bytes by which the process's peak resident set grows above its current size while `fn` runs."""
    if not _reset_peak():
        return None
    before = _status_kb("VmRSS")
    fn()
    peak = _status_kb("VmHWM")
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
    seq_len: int,
    rounds: int = 5,
    warmup: int = 2,
    min_time_s: float = 0.5,
    threads: int | None = None,
    seed: int = 0,
    min_calls: int = 3,
) -> dict:
    """Interleaved timing of every candidate at every batch size.

    Per round, per batch size, every candidate runs (order rotated each round) for at least `min_time_s` and
    `min_calls` calls; the fastest call's seconds of each round are kept (medians are taken over rounds).
    Returns {"setup": ..., "results": {name: {str(batch): {...}}}} with per-round seconds, median/IQR/min/max of
    ms per batch and examples/s, and the peak-RSS growth while running.
    """
    _check_names(candidates)
    if any(b < 1 for b in batch_sizes) or not batch_sizes:
        raise UserError(f"bench.batch_sizes: expected positive batch sizes, got {list(batch_sizes)}")
    used_threads = set_threads(threads)
    vocab = min([c.vocab_size for c in candidates if c.vocab_size] or [100])
    inputs = {b: synthetic_batch(b, seq_len, vocab, seed + b) for b in batch_sizes}
    per_round: dict[str, dict[int, list[float]]] = {c.name: {b: [] for b in batch_sizes} for c in candidates}
    memory: dict[str, dict[int, int | None]] = {c.name: {} for c in candidates}
    for b in batch_sizes:  # warm-up, and the memory peak of a fresh run at each batch size
        for c in candidates:
            memory[c.name][b] = peak_rss_delta(lambda c=c, b=b: [c.predict(inputs[b]) for _ in range(max(warmup, 1))])
    order = list(candidates)
    for r in range(rounds):
        rotated = order[r % len(order) :] + order[: r % len(order)]
        for b in batch_sizes:
            for c in rotated:
                seconds, _ = time_call(lambda c=c, b=b: c.predict(inputs[b]), min_time_s, min_calls)
                per_round[c.name][b].append(seconds)
    results = {}
    for c in candidates:
        results[c.name] = {}
        for b in batch_sizes:
            secs = per_round[c.name][b]
            ms = _spread([1000 * s for s in secs])
            eps = _spread([b / s for s in secs])
            results[c.name][str(b)] = {
                "seconds_per_round": secs,
                "ms_per_batch": ms,
                "examples_per_s": eps,
                "peak_rss_delta_bytes": memory[c.name][b],
            }
    setup = {
        "batch_sizes": list(batch_sizes),
        "seq_len": seq_len,
        "rounds": rounds,
        "warmup": warmup,
        "min_time_s": min_time_s,
        "min_calls": min_calls,
        "torch_threads": used_threads,
        "candidate_threads": {c.name: (c.threads if c.kind == "onnx" else used_threads) for c in candidates},
        "seed": seed,
    }
    return {"setup": setup, "results": results}


def paired_speedups(throughput: dict, reference: str) -> dict:
    """Per candidate and batch size: speed-up vs `reference` (reference seconds / candidate seconds) per round."""
    results = throughput["results"]
    if reference not in results:
        raise UserError(f"bench: reference '{reference}' is not among the candidates {sorted(results)}")
    out: dict[str, dict[str, dict]] = {}
    for name, per_batch in results.items():
        out[name] = {}
        for b, row in per_batch.items():
            ref = results[reference][b]["seconds_per_round"]
            ratios = [r / s for r, s in zip(ref, row["seconds_per_round"], strict=True)]
            out[name][b] = {"per_round": ratios, **_spread(ratios)}
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
    """The batch size the summary quotes: 32 when measured, else the largest measured."""
    return 32 if 32 in batch_sizes else max(batch_sizes)


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
    """Per candidate: size, heads, FLOPs, ratios vs the reference (measured per batch size and FLOP-ideal)."""
    speedups = paired_speedups(throughput, reference)
    by_name = {c.name: c for c in candidates}
    ref = by_name[reference]
    head = str(headline_batch(throughput["setup"]["batch_sizes"]))
    summary = {}
    for c in candidates:
        ideal = ref.flops_per_example / c.flops_per_example if ref.flops_per_example and c.flops_per_example else None
        speed = {b: row["median"] for b, row in speedups[c.name].items()}
        entry = {
            "kind": c.kind,
            "size_bytes": c.size_bytes,
            "size_ratio": ref.size_bytes / c.size_bytes if c.size_bytes else None,
            "flops_per_example": c.flops_per_example,
            "flop_ideal_speedup": ideal,
            "heads_per_layer": c.heads_per_layer,
            "heads": sum(c.heads_per_layer) if c.heads_per_layer is not None else None,
            "speedup": speed,
            "speedup_iqr": {b: [row["q1"], row["q3"]] for b, row in speedups[c.name].items()},
            "headline_batch": int(head),
            "headline_speedup": speed[head],
            "speedup_over_ideal": speed[head] / ideal if ideal else None,
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
    against `reference`; writes report.json, report.md and plots into `out_dir` when given. Returns the result."""
    _check_names(candidates)
    if reference not in [c.name for c in candidates]:
        raise UserError(f"bench: reference '{reference}' is not among the candidates {[c.name for c in candidates]}")
    set_threads(spec.threads)
    quality = measure_quality(candidates, batches, reference) if batches else None
    throughput = measure_throughput(
        candidates,
        spec.batch_sizes,
        spec.seq_len,
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
    for b in setup["batch_sizes"]:
        lines += [
            f"### Batch {b}",
            "",
            "| variant | examples/s (median) | IQR | ms/batch (median) | min–max ms | speed-up vs ref | IQR | "
            "FLOP-ideal | measured / ideal | peak RSS growth (MB) |",
            "|---|---:|---|---:|---|---:|---|---:|---:|---:|",
        ]
        for name, rows in result["throughput"].items():
            row, sp, s = rows[str(b)], result["speedups"][name][str(b)], result["summary"][name]
            eps, ms = row["examples_per_s"], row["ms_per_batch"]
            ideal = s["flop_ideal_speedup"]
            mem = row["peak_rss_delta_bytes"]
            lines.append(
                f"| {name} | {eps['median']:.1f} | {eps['q1']:.1f}–{eps['q3']:.1f} | {ms['median']:.2f} | "
                f"{ms['min']:.2f}–{ms['max']:.2f} | {sp['median']:.3f}× | {sp['q1']:.3f}–{sp['q3']:.3f} | "
                f"{_f(ideal, '.3f')} | {_f(sp['median'] / ideal if ideal else None, '.3f')} | "
                f"{_f(mem / 1e6 if mem is not None else None, '.1f')} |"
            )
        lines.append("")
    lines.append(f"Speed-ups are per-round ratios of seconds per batch against `{ref}` (paired within a round).")
    return lines + [""]


def _size_md(result: dict) -> list[str]:
    lines = [
        "| variant | kind | size on disk (MB) | size ratio | heads | heads per layer | encoder FLOPs / example |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    for name, s in result["summary"].items():
        hpl = " ".join(map(str, s["heads_per_layer"])) if s["heads_per_layer"] is not None else "–"
        flops = f"{s['flops_per_example']:,}" if s["flops_per_example"] else "–"
        lines.append(
            f"| {name} | {s['kind']} | {s['size_bytes'] / 1e6:.1f} | {_f(s['size_ratio'], '.2f')}× | "
            f"{_f(s['heads'], 'd')} | {hpl} | {flops} |"
        )
    return lines + [""]


def render_bench_md(result: dict) -> str:
    """Markdown tables for a `bench` result (pure function of the dict, so it can be re-rendered from JSON)."""
    setup, m, ref = result["setup"], result["machine"], result["reference"]
    head = headline_batch(setup["batch_sizes"])
    lines = [
        "# Benchmark",
        "",
        f"Reference: `{ref}`. Sequence length {setup['seq_len']} (synthetic ids, no padding); batch sizes "
        f"{setup['batch_sizes']}; {setup['rounds']} interleaved rounds (each the fastest call of ≥ "
        f"{setup.get('min_calls', 1)} calls and ≥ {setup['min_time_s']} s) after "
        f"{setup['warmup']} warm-up calls; PyTorch threads {setup['torch_threads']}; threads per variant "
        f"{setup['candidate_threads']}.",
        f"Machine: {m['processor']}, {m['cpu_count']} CPUs, load average at the end {m['load_average']}; "
        f"torch {m['torch']}, onnxruntime {m['onnxruntime']}. Absolute times depend on the machine and its load; "
        "compare ratios.",
        "",
        f"## Summary (batch {head})",
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


def _plot_throughput(result: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    sizes = result["setup"]["batch_sizes"]
    for name, rows in result["throughput"].items():
        med = [rows[str(b)]["examples_per_s"]["median"] for b in sizes]
        low = [rows[str(b)]["examples_per_s"]["q1"] for b in sizes]
        high = [rows[str(b)]["examples_per_s"]["q3"] for b in sizes]
        ax.plot(sizes, med, marker="o", label=name)
        ax.fill_between(sizes, low, high, alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("examples / s (median, IQR band)")
    ax.set_title(f"Throughput at sequence length {result['setup']['seq_len']}")
    return _save(fig, ax, path)


def _plot_accuracy_speedup(result: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    head = str(headline_batch(result["setup"]["batch_sizes"]))
    for name, s in result["summary"].items():
        sp = result["speedups"][name][head]
        acc = s.get("accuracy")
        y = 100 * acc if acc is not None else 100 * s.get("agreement", float("nan"))
        ci = s.get("accuracy_ci95")
        yerr = [[y - 100 * ci[0]], [100 * ci[1] - y]] if ci else None
        xerr = [[sp["median"] - sp["q1"]], [sp["q3"] - sp["median"]]]
        ax.errorbar(sp["median"], y, xerr=xerr, yerr=yerr, fmt="o", capsize=3, label=name)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(f"speed-up vs {result['reference']} at batch {head} (median, IQR)")
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
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_bench_report(result: dict, out_dir: str | Path) -> list[Path]:
    """Write report.json (versioned), report.md and three PNG plots into `out_dir`; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {k: v for k, v in result.items() if k != "files"}
    payload["schema_version"] = SCHEMA_VERSION
    paths = [out / "report.json", out / "report.md"]
    atomic.write_text(paths[0], json.dumps(payload, indent=2, default=str))
    atomic.write_text(paths[1], render_bench_md(payload))
    paths.append(_plot_throughput(payload, out / "throughput_vs_batch.png"))
    paths.append(_plot_accuracy_speedup(payload, out / "accuracy_vs_speedup.png"))
    paths.append(_plot_heads(payload, out / "heads_per_layer.png"))
    return paths
