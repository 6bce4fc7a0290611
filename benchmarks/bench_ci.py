"""CI regression check: speed-up ratios and agreement of a small pruned BERT against a committed baseline.

A random-init BERT (4 layers × 8 heads, hidden 256, FFN 512) loses 16 of its 32 heads by a fixed plan. One run
measures, on this machine, ratios only — pruned/original PyTorch throughput and ONNX/PyTorch throughput of the
pruned model — plus agreement of predictions on seeded synthetic batches:
pruned vs masked original (must be exact), pruned vs original, ONNX vs PyTorch. Quality goes through bench's
labelled path (accuracy, Wilson interval, McNemar test): the labels are the original's own predictions, so the
original scores 1.0 and `accuracy_pruned` is deterministic. Each metric is compared with
benchmarks/baseline_ci.json under its tolerance and `direction` (higher or lower is better); only a change in the
bad direction fails (exit 1; an invalid baseline exits 2).
Absolute times are printed for context but never compared: they belong to the machine, not the code.

Usage: python benchmarks/bench_ci.py [--update-baseline] [--threads 1] [--out runs/bench-ci]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from compressor import bench
from compressor.checkpoint import load_pruned, save_pruned
from compressor.export import export_onnx
from compressor.masking import gated
from compressor.recipe import BenchSpec
from compressor.selection import plan_to_mask
from compressor.surgery import pruned_copy

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "benchmarks" / "baseline_ci.json"
PLAN = {0: [0, 1], 1: [0, 2, 4, 5, 6, 7], 2: [1, 3, 5, 7], 3: [0, 1, 2, 3]}  # 16 of 32 heads, uneven on purpose
LAYERS, HEADS, HIDDEN, FFN, VOCAB = 4, 8, 256, 512, 1000
SEQ_LEN, BATCH_SIZES, HEADLINE = 128, [1, 8, 32], 32
# Default tolerances written into a new baseline: speed ratios may drop 20% (CI runners are noisy and differ),
# agreement with the masked model must stay exact, the others may move by a few examples.
TOLERANCES = {
    "speedup_pruned_vs_original_b32": {"relative": 0.20},
    "speedup_pruned_vs_original_b1": {"relative": 0.20},
    "speedup_onnx_vs_pytorch_pruned_b32": {"relative": 0.20},
    "agreement_pruned_vs_masked": {"absolute": 0.0},
    "agreement_pruned_vs_original": {"absolute": 0.01},
    "agreement_onnx_vs_pytorch": {"absolute": 0.004},
    "accuracy_pruned": {"absolute": 0.01},
}
# Metrics where lower is better (written as direction "lower" into a new baseline); all current ones are "higher".
LOWER_IS_BETTER: frozenset[str] = frozenset()
DIRECTIONS = ("higher", "lower")


def build_models(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(original, pruned) with SDPA attention, the implementation users deploy."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=SEQ_LEN,
        num_labels=2,
    )
    original = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa").eval()
    return original, pruned_copy(original, PLAN).eval()


def synthetic_eval_batches(n: int = 512, batch: int = 32, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Seeded random token ids with varied lengths (right padding), as a data loader would give them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n // batch):
        ids = torch.randint(5, VOCAB, (batch, SEQ_LEN), generator=g)
        lengths = torch.randint(8, SEQ_LEN + 1, (batch,), generator=g)
        mask = (torch.arange(SEQ_LEN)[None, :] < lengths[:, None]).long()
        out.append({"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(mask)})
    return out


def labelled_by(reference: bench.Candidate, batches: list) -> list[dict[str, torch.Tensor]]:
    """Copies of `batches` with `labels` = `reference`'s own predictions (deterministic for a seeded model)."""
    return [{**b, "labels": torch.as_tensor(bench.collect_logits(reference, [b]).argmax(-1))} for b in batches]


def masked_candidate(original: torch.nn.Module) -> bench.Candidate:
    """The original with the plan's heads gated off: the physically pruned model must reproduce it exactly."""
    gates = plan_to_mask(PLAN, torch.ones(LAYERS, HEADS, dtype=torch.bool)).float()

    def predict(batch):
        with torch.inference_mode(), gated(original, gates):
            return original(**batch).logits.numpy()

    return bench.Candidate("pytorch-masked", predict, 0, None, "pytorch")


def onnx_candidate(model_dir: Path, work: Path, batches: list, threads: int, pruned: bench.Candidate):
    """The pruned model's fp32 ONNX export (parity-checked on two batches) as a candidate."""
    exported = export_onnx(model_dir, work / "onnx", ["fp32"], batches[:2])
    return bench.onnx_candidate(
        "onnx-fp32", exported["fp32"]["dir"], threads, pruned.flops_per_example, pruned.heads_per_layer
    )


def measure(threads: int, rounds: int, out: Path | None) -> tuple[dict, dict]:
    """Run the benchmark once; returns (metrics compared with the baseline, full bench result)."""
    bench.set_threads(threads)
    original, pruned = build_models()
    batches = synthetic_eval_batches()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        orig_dir = save_pruned(original, work / "original")
        pruned_dir = save_pruned(pruned, work / "pruned", original=original, seq_len=SEQ_LEN)
        pruned = load_pruned(pruned_dir, attn_implementation="sdpa")  # what users load
        timed = [
            bench.pytorch_candidate("pytorch-original", original, SEQ_LEN, orig_dir),
            bench.pytorch_candidate("pytorch-pruned", pruned, SEQ_LEN, pruned_dir),
        ]
        timed.append(onnx_candidate(pruned_dir, work, batches, threads, timed[1]))
        pairs = [("pytorch-pruned", "pytorch-original"), ("pytorch-pruned", "pytorch-masked")]
        agree = agreements([*timed, masked_candidate(original)], batches, [*pairs, ("onnx-fp32", "pytorch-pruned")])
        spec = BenchSpec(
            batch_sizes=BATCH_SIZES, seq_len=SEQ_LEN, rounds=rounds, warmup=2, min_time_s=0.3, threads=threads
        )
        result = bench.bench(timed, labelled_by(timed[0], batches), spec, out)
    sp = {name: rows[str(SEQ_LEN)] for name, rows in result["speedups"].items()}  # [name][seq_len][batch]
    metrics = {
        "speedup_pruned_vs_original_b32": sp["pytorch-pruned"][str(HEADLINE)]["median"],
        "speedup_pruned_vs_original_b1": sp["pytorch-pruned"]["1"]["median"],
        "agreement_pruned_vs_original": agree["pytorch-pruned|pytorch-original"],
        "agreement_pruned_vs_masked": agree["pytorch-pruned|pytorch-masked"],
        "agreement_onnx_vs_pytorch": agree["onnx-fp32|pytorch-pruned"],
        "accuracy_pruned": result["quality"]["results"]["pytorch-pruned"]["accuracy"],
    }
    per_round = zip(
        sp["onnx-fp32"][str(HEADLINE)]["per_round"], sp["pytorch-pruned"][str(HEADLINE)]["per_round"], strict=True
    )
    metrics["speedup_onnx_vs_pytorch_pruned_b32"] = float(np.median([o / p for o, p in per_round]))
    return metrics, result


def agreements(candidates: list[bench.Candidate], batches: list, pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Share of examples on which two candidates predict the same class, for each (a, b) pair."""
    by_name = {c.name: c for c in candidates}
    preds = {c.name: bench.collect_logits(c, batches).argmax(-1) for c in candidates}
    return {f"{a}|{b}": float(np.mean(preds[a] == preds[b])) for a, b in pairs if a in by_name and b in by_name}


def _bounds(name: str, ref: dict) -> tuple[str, float, float]:
    """(direction, limit, better-than) for one baseline entry: beyond `limit` in the bad direction is a regression,
    beyond `better-than` in the good one is worth a new baseline. Raises ValueError naming the metric if invalid."""
    direction = ref.get("direction")
    if direction not in DIRECTIONS:
        raise ValueError(f"baseline metric {name!r}: direction {direction!r}, expected 'higher' or 'lower'")
    tol = ref.get("tolerance", {})
    unknown = set(tol) - {"relative", "absolute"}
    if unknown:
        raise ValueError(f"baseline metric {name!r}: unknown tolerance {sorted(unknown)}, expected relative/absolute")
    value, rel, absolute = ref.get("value"), tol.get("relative", 0.0), tol.get("absolute", 0.0)
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (value, rel, absolute)):
        raise ValueError(f"baseline metric {name!r}: value and tolerances must be numbers, got {ref!r}")
    low, high = value * (1 - rel) - absolute, value * (1 + rel) + absolute
    return (direction, low, high) if direction == "higher" else (direction, high, low)


def check_baseline(baseline: dict) -> None:
    """Raise ValueError (naming the metric) for an entry `compare` cannot judge; run before the slow measurement."""
    if not isinstance(baseline, dict) or not isinstance(baseline.get("metrics"), dict) or not baseline["metrics"]:
        raise ValueError("no 'metrics' object (expected {name: {value, direction, tolerance}})")
    for name, ref in baseline["metrics"].items():
        if not isinstance(ref, dict):
            raise ValueError(f"baseline metric {name!r}: expected an object with value, direction, tolerance")
        _bounds(name, ref)


def compare(metrics: dict, baseline: dict) -> tuple[list[str], bool]:
    """Table lines and overall verdict: each baseline metric must not move in its bad direction (`direction`:
    'higher' or 'lower' is better) beyond its tolerance. Raises ValueError (naming the metric) for a bad entry."""
    lines = [f"{'metric':40s} {'baseline':>9s} {'now':>9s} {'limit':>9s}  verdict"]
    ok = True
    for name, ref in baseline["metrics"].items():
        direction, limit, better = _bounds(name, ref)
        value = metrics.get(name)
        sign = 1.0 if direction == "higher" else -1.0  # compare as "higher is better"
        if value is None:
            verdict, ok = "MISSING (fail)", False
            shown = "–"
        else:
            shown = f"{value:9.4f}"
            if sign * value < sign * limit:
                verdict, ok = "REGRESSION", False
            elif sign * value > sign * better:
                verdict = "better (consider --update-baseline)"
            else:
                verdict = "ok"
        arrow = "≥" if direction == "higher" else "≤"
        lines.append(f"{name:40s} {ref['value']:9.4f} {shown:>9s} {arrow}{limit:8.4f}  {verdict}")
    for name in sorted(set(metrics) - set(baseline["metrics"])):
        lines.append(f"{name:40s} {'–':>9s} {metrics[name]:9.4f} {'–':>9s}  not in baseline")
    return lines, ok


def run_context(result: dict) -> dict:
    """What a baseline records about the run besides the metrics (the only bench-result keys it reads)."""
    return {
        "flop_ideal_speedup": result["summary"]["pytorch-pruned"]["flop_ideal_speedup"],
        "measured_on": {k: result["machine"][k] for k in ("processor", "cpu_count", "torch", "onnxruntime")},
        "threads": result["setup"]["torch_threads"],
    }


def new_baseline(metrics: dict, context: dict) -> dict:
    """A baseline for `metrics` (tolerances from TOLERANCES, directions from LOWER_IS_BETTER); `context` from
    `run_context`."""
    return {
        "format": 1,
        "description": "benchmarks/bench_ci.py: ratios, agreements and accuracy only (absolute times are "
        "machine-specific)",
        "config": {"layers": LAYERS, "heads": HEADS, "hidden": HIDDEN, "ffn": FFN, "seq_len": SEQ_LEN, "plan": PLAN},
        **context,
        "metrics": {
            name: {
                "value": round(value, 4),
                "direction": "lower" if name in LOWER_IS_BETTER else "higher",
                "tolerance": TOLERANCES[name],
            }
            for name, value in metrics.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--update-baseline", action="store_true", help="write this run's ratios as the new baseline")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1 keeps ratios stable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-ci", help="bench report directory")
    args = parser.parse_args()
    baseline = None
    if not args.update_baseline:  # a missing or invalid baseline fails now, not after minutes of timing
        if not args.baseline.exists():
            print(f"error: no baseline at {args.baseline}; run with --update-baseline first", file=sys.stderr)
            return 1
        try:
            baseline = json.loads(args.baseline.read_text())
            check_baseline(baseline)
        except ValueError as exc:  # json.JSONDecodeError included
            print(f"error: {args.baseline}: {exc}", file=sys.stderr)
            return 2
    start = time.perf_counter()
    metrics, result = measure(args.threads, args.rounds, args.out)
    context = run_context(result)
    ideal = context["flop_ideal_speedup"]
    for name, rows in result["throughput"].items():
        row = rows[str(SEQ_LEN)][str(HEADLINE)]
        print(f"{name:18s} batch {HEADLINE}: {row['examples_per_s']['median']:8.1f} examples/s (context only)")
    print(f"FLOP-ideal pruned/original speed-up: {ideal:.3f}; threads {context['threads']}")
    if args.update_baseline:
        args.baseline.write_text(json.dumps(new_baseline(metrics, context), indent=2) + "\n")
        print(f"baseline written: {args.baseline}")
        return 0
    lines, ok = compare(metrics, baseline)
    print("\n".join(lines))
    print(f"bench-ci: {'PASS' if ok else 'FAIL'} in {time.perf_counter() - start:.0f} s (report: {args.out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
