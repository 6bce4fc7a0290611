"""int8 choices on a finished run: accuracy, agreement and batch-32 speed of dynamic-quantisation variants.

The run's `onnx/optimized` graph (fp32, fused attention) is quantised several ways with
`compressor.deploy.export.quantize_graph` — per-tensor weights, per-channel weights (compressor's default), per-channel
with ORT's reduced 7-bit range, and per-channel with the feed-forward output projections (the MatMul fed by GELU,
whose activations have the widest range) kept in fp32. Each variant is scored on the run's whole test split, in the
same seeded batches the run's bench stage uses, against the fp32 graph (agreement, McNemar) and against the
unpruned original's accuracy from `report.json`, then timed at batch 32 with `compressor.bench`. The run's own
`onnx/int8` (what its gate, and its fp32 fallback if the recipe allows one, shipped) is measured beside them.

Dynamic quantisation picks each activation's scale per batch, so an int8 model's predictions depend slightly on
what else is in the batch (padding included): the numbers here can differ by an example or two from a run report.

With `--sensitive N ...` it first scans where the error comes from: every node dynamic int8 quantises
(`deploy.quantize.quantized_nodes`: MatMuls, fused attention, embedding lookup) is kept in fp32 alone, and the
validation split's agreement with fp32 is measured; then variants keep the N most helpful nodes in fp32. The choice
uses the validation split only; the table scores every variant on the test split.

With `--smooth ALPHA ...` it adds activation-smoothed variants (`deploy.smoothing`, calibrated on the recipe's
training examples as a run's export is), one per smoothing scope (`--scopes`): every MatMul, "cheap" (the
feed-forward down-projections skipped) and "free" (only divisions that fold into attention); `--outlier-ratio R ...`
adds cheap and free variants that still smooth a skipped MatMul whose input has an outlier channel R times the
median.

Usage: .venv/bin/python benchmarks/int8.py [--run runs/minilm_rt_50pct] [--threads 2] [--rounds 3] [--sensitive 1 2 4]
                                           [--smooth 0.8 [--outlier-ratio 12] [--scopes all cheap free]]
       → prints a table and writes benchmarks/results/int8.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from compressor import bench  # noqa: E402
from compressor.deploy.export import ONNX_FILE, quantize_graph  # noqa: E402
from compressor.deploy.inference import OnnxClassifier  # noqa: E402
from compressor.deploy.quantize import int8_options, quantized_nodes  # noqa: E402
from compressor.deploy.smoothing import SCOPES, smooth_graph  # noqa: E402
from compressor.recipe import load_recipe  # noqa: E402
from compressor.sources import load_task_data  # noqa: E402
from compressor.sources.batches import sample_batches, tokenize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = "fp32-optimized"
SHIPPED = "int8 as the run shipped it"
SHIPPED_FIELDS = ("status", "gate", "excluded_nodes")
# Weight range pinned (not "auto") so every machine measures the same variants: "(default)" is the default on CPUs
# with VNNI; without VNNI compressor defaults to the reduced (7-bit) range (`deploy.quantize.resolve_reduce_range`).
VARIANTS: dict[str, dict] = {
    "int8 per-tensor": {"per_channel": False, "reduce_range": False},
    "int8 per-channel (default)": {"reduce_range": False},
    "int8 per-channel, reduced range": {"reduce_range": True},
    "int8 per-channel, FFN output fp32": {"keep_ffn_output": True, "reduce_range": False},
}


def ffn_output_nodes(graph_file: Path) -> list[str]:
    """Names of the MatMuls of each layer's feed-forward output projection (BERT-style `…/output/dense/MatMul`)."""
    graph = onnx.load(str(graph_file), load_external_data=False).graph
    matmuls = [n.name for n in graph.node if n.op_type == "MatMul"]
    return [name for name in matmuls if "/output/dense/" in name and "/attention/" not in name]


SCAN_BASE = {"reduce_range": False}  # the sensitivity scan starts from the 8-bit per-channel variant


def sensitivity(optimized: Path, batches: list, work: Path, threads: int) -> list[dict]:
    """For every quantizable node, the validation agreement with the fp32 graph of the default int8 variant with
    that one node kept in fp32, most helpful first: where int8's error comes from, measured (not guessed)."""
    from compressor.bench.quality import collect_logits

    def predictions(variant_dir: Path) -> np.ndarray:
        return collect_logits(bench.onnx_candidate("v", variant_dir, threads), batches).argmax(-1)

    reference = predictions(optimized)
    default = float((predictions(quantized_variant(optimized, work / "all", SCAN_BASE)) == reference).mean())
    rows = []
    for i, node in enumerate(quantized_nodes(optimized / ONNX_FILE)):
        variant = quantized_variant(optimized, work / f"n{i}", {**SCAN_BASE, "nodes_to_exclude": [node]})
        agreement = float((predictions(variant) == reference).mean())
        rows.append({"node": node, "agreement": agreement, "gain": agreement - default})
        shutil.rmtree(variant)
    return sorted(rows, key=lambda r: -r["agreement"])


def quantized_variant(source_dir: Path, dest_dir: Path, options: dict, calibration: list | None = None) -> Path:
    """A copy of an exported variant directory (config, tokenizer) with its graph quantised under `options`
    (smoothed first, on `calibration`, when they name a `smooth_alpha`)."""
    shutil.copytree(source_dir, dest_dir, ignore=shutil.ignore_patterns("*.onnx", "*.onnx_data"))
    source = source_dir / ONNX_FILE
    options = dict(options)
    if options.pop("keep_ffn_output", False):
        options["nodes_to_exclude"] = ffn_output_nodes(source)
    smoothing = [options.pop(k, None) for k in ("smooth_alpha", "smooth_scope", "smooth_outlier_ratio")]
    if smoothing[0] is not None:
        smoothed = dest_dir.with_name(dest_dir.name + "_smoothed.onnx")
        smooth_graph(source, smoothed, calibration, OnnxClassifier(source).feed, *smoothing)
        source = smoothed
    quantize_graph(source, dest_dir / ONNX_FILE, **options)
    return dest_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "minilm_rt_50pct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "int8.json")
    parser.add_argument(
        "--sensitive",
        type=int,
        nargs="*",
        default=[],
        help="also scan each node's int8 sensitivity on the validation split and add variants with the N most "
        "sensitive nodes kept in fp32 (e.g. --sensitive 1 2 4)",
    )
    parser.add_argument(
        "--smooth",
        type=float,
        nargs="*",
        default=[],
        help="also add activation-smoothed variants at these alphas, one per smoothing scope (e.g. --smooth 0.8)",
    )
    parser.add_argument(
        "--outlier-ratio",
        type=float,
        nargs="*",
        default=[],
        help="with --smooth: also a variant per ratio and skipping scope (cheap, free) that still smooths a "
        "skipped MatMul whose input has an outlier channel this strong (export.int8.smooth_outlier_ratio)",
    )
    parser.add_argument(
        "--scopes",
        nargs="+",
        choices=SCOPES,
        default=list(SCOPES),
        help="with --smooth: the smoothing scopes to build variants for (default: all of them)",
    )
    args = parser.parse_args(argv)
    if args.outlier_ratio and not args.smooth:
        parser.error("--outlier-ratio: expected --smooth ALPHA too (the ratio only picks what smoothing skips)")
    optimized = args.run / "onnx" / "optimized"
    if not (args.run / "report.json").exists() or not (optimized / ONNX_FILE).exists():
        print(f"--run: {args.run} is not a finished run with an 'optimized' ONNX export", file=sys.stderr)
        return 2
    report = json.loads((args.run / "report.json").read_text())
    recipe = load_recipe(args.run / "recipe.resolved.yaml")
    tokenizer = AutoTokenizer.from_pretrained(args.run / "model")
    task = load_task_data(recipe.data)
    test = tokenize(task.test, tokenizer, task.text_fields, recipe.data.max_length)
    batches = sample_batches(test, tokenizer, len(test), 32, seed=0)

    variants, scan = dict(VARIANTS), None
    with tempfile.TemporaryDirectory() as tmp:
        if args.sensitive:  # chosen on the validation split, scored on the test split like every other variant
            val = tokenize(task.validation, tokenizer, task.text_fields, recipe.data.max_length)
            scan = sensitivity(optimized, sample_batches(val, tokenizer, len(val), 32, seed=0), Path(tmp), args.threads)
            for n in args.sensitive:
                nodes = [r["node"] for r in scan[:n]]
                variants[f"int8 per-channel, {n} most sensitive fp32"] = {**SCAN_BASE, "nodes_to_exclude": nodes}
        candidates = [bench.onnx_candidate(REFERENCE, optimized, args.threads)]
        shipped = args.run / "onnx" / "int8"
        if (shipped / ONNX_FILE).exists():  # what the run's own gate (and fp32 fallback) shipped, as it is on disk
            candidates.append(bench.onnx_candidate(SHIPPED, shipped, args.threads))
        for alpha in args.smooth:
            for scope in args.scopes:
                options = {**SCAN_BASE, "smooth_alpha": alpha, "smooth_scope": scope}
                variants[f"int8 per-channel, smoothed α {alpha:g} ({scope})"] = options
            for ratio, scope in ((r, s) for r in args.outlier_ratio for s in args.scopes if s != "all"):
                options = {**SCAN_BASE, "smooth_alpha": alpha, "smooth_scope": scope, "smooth_outlier_ratio": ratio}
                variants[f"int8 per-channel, smoothed α {alpha:g} ({scope}, outliers ≥ {ratio:g}x)"] = options
        calibration = None
        if args.smooth:  # the training batches a run's export calibrates on (`int8_options`)
            train = tokenize(task.train, tokenizer, task.text_fields, recipe.data.max_length)
            spec = recipe.export.int8.model_copy(update={"smooth_alpha": args.smooth[0]})
            calibration = int8_options(spec, ["int8"], train, [], tokenizer).calibration
        for i, (name, options) in enumerate(variants.items()):
            variant = quantized_variant(optimized, Path(tmp) / f"v{i}", options, calibration)
            candidates.append(bench.onnx_candidate(name, variant, args.threads))
        quality = bench.measure_quality(candidates, batches, REFERENCE)
        timing = bench.measure_throughput(candidates, [32], recipe.bench.seq_len, args.rounds, threads=args.threads)
    speedups = {  # [name][seq_len][batch] → [name][batch] at the one length timed
        name: rows[str(recipe.bench.seq_len)] for name, rows in bench.paired_speedups(timing, REFERENCE).items()
    }

    original = report["original"]["test"]["accuracy"]
    rows = {}
    for c in candidates:
        q = quality["results"][c.name]
        rows[c.name] = {
            "size_mb": round(c.size_bytes / 1e6, 2),
            "test_accuracy": q["accuracy"],
            "points_vs_unpruned_original": round(100 * (q["accuracy"] - original), 2),
            "agreement_with_fp32": q["agreement"],
            "mcnemar_p_vs_fp32": q["mcnemar"]["p_value"],
            "speedup_vs_fp32_b32": speedups[c.name]["32"]["median"],
            "speedup_iqr": [speedups[c.name]["32"]["q1"], speedups[c.name]["32"]["q3"]],
        }
    result = {
        "run": args.run.name,  # the run directory's name only: results never name a path of this machine
        "unpruned_original_test_accuracy": original,
        "test_examples": quality["n"],
        "threads": args.threads,
        "rounds": args.rounds,
        "machine": bench.machine_info(),
        "rows": rows,
        "sensitivity_on_validation": scan,
        "shipped_int8": {  # the run's own int8: its gate verdict and the nodes it kept in fp32
            k: v for k, v in report.get("export", {}).get("int8", {}).items() if k in SHIPPED_FIELDS
        },
        "variant_options": variants,
    }
    print(f"{'variant':44s} {'MB':>6s} {'test acc':>8s} {'vs orig':>8s} {'agree':>7s} {'speed-up b32':>12s}")
    for name, r in rows.items():
        print(
            f"{name:44s} {r['size_mb']:6.1f} {100 * r['test_accuracy']:8.2f} {r['points_vs_unpruned_original']:+8.2f}"
            f" {100 * r['agreement_with_fp32']:7.2f} {r['speedup_vs_fp32_b32']:11.2f}×"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
