"""CI regression check: speed-up ratios and agreement of a small pruned BERT against a committed baseline.

A random-init BERT (4 layers × 8 heads, hidden 256, FFN 512) loses 16 of its 32 heads by a fixed plan. One run
measures, on this machine, ratios only — pruned/original PyTorch throughput and ONNX/PyTorch throughput of the
pruned model — plus agreement of predictions on seeded synthetic batches:
pruned vs masked original (must be exact), pruned vs original, ONNX vs PyTorch. Each is compared with
benchmarks/baseline_ci.json under its tolerance; only a change in the bad direction fails (exit 1).
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
}


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
        result = bench.bench(timed, None, spec, out)
    sp = result["speedups"]
    metrics = {
        "speedup_pruned_vs_original_b32": sp["pytorch-pruned"][str(HEADLINE)]["median"],
        "speedup_pruned_vs_original_b1": sp["pytorch-pruned"]["1"]["median"],
        "agreement_pruned_vs_original": agree["pytorch-pruned|pytorch-original"],
        "agreement_pruned_vs_masked": agree["pytorch-pruned|pytorch-masked"],
        "agreement_onnx_vs_pytorch": agree["onnx-fp32|pytorch-pruned"],
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


def compare(metrics: dict, baseline: dict) -> tuple[list[str], bool]:
    """Table lines and overall verdict: each baseline metric must not move in the bad direction beyond tolerance."""
    lines = [f"{'metric':40s} {'baseline':>9s} {'now':>9s} {'limit':>9s}  verdict"]
    ok = True
    for name, ref in baseline["metrics"].items():
        value, tol = metrics.get(name), ref.get("tolerance", {})
        limit = ref["value"] * (1 - tol.get("relative", 0.0)) - tol.get("absolute", 0.0)
        if value is None:
            verdict, ok = "MISSING (fail)", False
            shown = "–"
        else:
            shown = f"{value:9.4f}"
            if value < limit:
                verdict, ok = "REGRESSION", False
            elif value > ref["value"] * (1 + tol.get("relative", 0.0)) + tol.get("absolute", 0.0):
                verdict = "better (consider --update-baseline)"
            else:
                verdict = "ok"
        lines.append(f"{name:40s} {ref['value']:9.4f} {shown:>9s} {limit:9.4f}  {verdict}")
    for name in sorted(set(metrics) - set(baseline["metrics"])):
        lines.append(f"{name:40s} {'–':>9s} {metrics[name]:9.4f} {'–':>9s}  not in baseline")
    return lines, ok


def new_baseline(metrics: dict, result: dict) -> dict:
    return {
        "format": 1,
        "description": "benchmarks/bench_ci.py: ratios and agreements only (absolute times are machine-specific)",
        "config": {"layers": LAYERS, "heads": HEADS, "hidden": HIDDEN, "ffn": FFN, "seq_len": SEQ_LEN, "plan": PLAN},
        "flop_ideal_speedup": result["summary"]["pytorch-pruned"]["flop_ideal_speedup"],
        "measured_on": {k: result["machine"][k] for k in ("processor", "cpu_count", "torch", "onnxruntime")},
        "threads": result["setup"]["torch_threads"],
        "metrics": {
            name: {"value": round(value, 4), "direction": "higher", "tolerance": TOLERANCES[name]}
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
    start = time.perf_counter()
    metrics, result = measure(args.threads, args.rounds, args.out)
    ideal = result["summary"]["pytorch-pruned"]["flop_ideal_speedup"]
    for name, rows in result["throughput"].items():
        row = rows[str(HEADLINE)]
        print(f"{name:18s} batch {HEADLINE}: {row['examples_per_s']['median']:8.1f} examples/s (context only)")
    print(f"FLOP-ideal pruned/original speed-up: {ideal:.3f}; threads {result['setup']['torch_threads']}")
    if args.update_baseline:
        args.baseline.write_text(json.dumps(new_baseline(metrics, result), indent=2) + "\n")
        print(f"baseline written: {args.baseline}")
        return 0
    if not args.baseline.exists():
        print(f"error: no baseline at {args.baseline}; run with --update-baseline first", file=sys.stderr)
        return 1
    lines, ok = compare(metrics, json.loads(args.baseline.read_text()))
    print("\n".join(lines))
    print(f"bench-ci: {'PASS' if ok else 'FAIL'} in {time.perf_counter() - start:.0f} s (report: {args.out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
