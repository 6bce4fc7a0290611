"""Quantize-only on ONNX Runtime and OpenVINO beside PyTorch, paired in one process (issue 38 point 1).

On the demo's task-tuned MiniLM-L6 (the cached base fine-tune of `--recipe`; a run directory's own recipe with
`--run`), the original is exported with `compressor.deploy.export.export_onnx` to ONNX Runtime fp32 and dynamic int8
(the recipe's `export.int8` settings: smoothing, weight range, gate), OpenVINO fp32 (IR of the same fp32 graph) and
OpenVINO int8 (`nncf.quantize`, `ModelType.TRANSFORMER`, calibrated on the recipe's training examples, gated like
ORT's int8). With `--run`, every member of the run (a one-target run's pruned model, or each family member) is
exported and measured the same way. Then `compressor.bench.bench` measures, in one process, test accuracy of every
candidate and its paired speed-up over PyTorch fp32 of the original (interleaved rounds, rotating order) at
`--batch` x `--seq`. Each int8 figure is printed and saved with the CPU's int8 features (AVX2 / AVX-512 / VNNI /
AMX, `compressor.core.machine.cpu_summary`): OpenVINO's int8 kernels pay only with VNNI or AMX.

Usage (the lead's machine, machine to itself):
    .venv/bin/python benchmarks/openvino.py --else-running "nothing"
    .venv/bin/python benchmarks/openvino.py --run runs/minilm_rt_family --else-running "nothing"
  → prints one table and writes benchmarks/results/openvino.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
# This script is named like the package it measures: its own folder must not shadow `import openvino`.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from compressor import bench  # noqa: E402
from compressor.bench.candidates import as_sdpa, openvino_candidate  # noqa: E402
from compressor.core.machine import cpu_summary, int8_features, machine_info  # noqa: E402
from compressor.deploy.export import export_onnx  # noqa: E402
from compressor.deploy.openvino import missing  # noqa: E402
from compressor.deploy.quantize import int8_options  # noqa: E402
from compressor.recipe import BenchSpec, parse_recipe  # noqa: E402
from compressor.sources.batches import sample_batches  # noqa: E402
from compressor.surgery.checkpoint import load_pruned, save_pruned  # noqa: E402

VARIANTS = ("fp32", "int8", "openvino-fp32", "openvino-int8")  # the runtimes compared, beside PyTorch fp32
INT8 = ("int8", "openvino-int8")
LABELS = {
    "pytorch": "PyTorch fp32",
    "fp32": "ONNX Runtime fp32",
    "int8": "ONNX Runtime int8 (dynamic)",
    "openvino-fp32": "OpenVINO fp32",
    "openvino-int8": "OpenVINO int8 (NNCF)",
}


def load_run(recipe_path: Path, run_dir: Path | None, work: Path):
    """(run state, original model, [(label, model dir)] members): the recipe's data and cached base, prepared in a
    scratch output directory; members from `run_dir`'s report (none without one)."""
    from compressor.pipeline.runner import base_model, prepare

    source = run_dir / "recipe.resolved.yaml" if run_dir is not None else recipe_path
    data = yaml.safe_load(source.read_text())
    data["output_dir"] = str(work / "run")
    run = prepare(parse_recipe(data))
    original, info = base_model(run)
    if info.get("cached") is None and not run.recipe.model.task_tuned:
        raise SystemExit("openvino.py: no cached base fine-tune was found or made")
    return run, original, members_of(run_dir)


def members_of(run_dir: Path | None) -> list[tuple[str, Path]]:
    """(label, model dir) of each member of a finished run (none without one)."""
    from compressor.report.schema import RunReport

    if run_dir is None:
        return []
    return [(m.label, path) for m, path in RunReport.read(run_dir / "report.json").member_models(run_dir)]


def exported(run, model_dir: Path, out: Path) -> dict:
    """`model_dir` exported to every compared variant, int8 with the recipe's settings and gate."""
    spec = run.recipe.export
    checks = sample_batches(run.splits["validation"], run.tokenizer, 128, 32, seed=1)
    int8 = int8_options(spec.int8, VARIANTS, run.splits["train"], run.splits["validation"], run.tokenizer)
    return export_onnx(model_dir, out, list(VARIANTS), checks, spec.atol, spec.opset, int8)


def candidates_of(label: str, model, model_dir: Path, variants: dict, spec: BenchSpec) -> list:
    """PyTorch and every exported variant of one model, named `<label>/<variant>`."""
    torch_candidate = bench.pytorch_candidate(f"{label}/pytorch", model, spec.seq_lens, model_dir)
    out = [torch_candidate]
    for variant, info in variants.items():
        make = openvino_candidate if variant.startswith("openvino") else bench.onnx_candidate
        flops, heads = torch_candidate.flops_by_seq_len, torch_candidate.heads_per_layer
        out.append(make(f"{label}/{variant}", info["dir"], spec.threads, flops, heads))
    return out


def rows_of(result: dict, exports: dict[str, dict]) -> list[dict]:
    """One row per candidate: model, runtime, paired speed-up over the PyTorch original, accuracy, int8 gate."""
    rows = []
    for name, s in result["summary"].items():
        label, variant = name.split("/", 1)
        info = exports.get(label, {}).get(variant, {})
        rows.append(
            {
                "name": name,
                "model": label,
                "runtime": LABELS[variant],
                "speedup": s["headline_speedup"],
                "speedup_iqr": s["speedup_iqr"][str(s["headline_seq_len"])][str(s["headline_batch"])],
                "accuracy": s["accuracy"],
                "accuracy_delta": s["accuracy_delta"],
                "size_bytes": s["size_bytes"],
                "int8": variant in INT8,
                "status": info.get("status"),
                "gate": info.get("gate"),
            }
        )
    return sorted(rows, key=lambda r: (r["model"] != "original", -r["speedup"]))


def table(rows: list[dict], cpu: dict) -> str:
    """Markdown table; every int8 row names the CPU's int8 features."""
    features = int8_features(cpu)
    lines = [
        f"CPU: {cpu['model']}, {cpu['cores']} cores; int8 features: {features}",
        "",
        "| model | runtime | speed-up vs PyTorch fp32 original | test accuracy (%) | int8 gate |",
        "|---|---|---:|---:|---|",
    ]
    for r in rows:
        runtime = f"{r['runtime']} [CPU: {features}]" if r["int8"] else r["runtime"]
        acc = "n/a" if r["accuracy"] is None else f"{100 * r['accuracy']:.2f}"
        lines.append(f"| {r['model']} | {runtime} | {r['speedup']:.2f}× | {acc} | {r['status'] or '—'} |")
    return "\n".join(lines)


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "minilm_rt_50pct.yaml")
    parser.add_argument("--run", type=Path, default=None, help="a finished run: measure its members too")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="every runtime's intra-op threads (default: each runtime's own default, recorded)",
    )
    parser.add_argument("--else-running", default="unknown", help="what else ran on the machine, for the record")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "openvino.json")
    args = parser.parse_args(argv)
    if missing():
        raise SystemExit(f"openvino.py: {missing()}")
    spec = BenchSpec(batch_sizes=[args.batch], seq_lens=[args.seq], rounds=args.rounds, threads=args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run, original, members = load_run(args.recipe, args.run, work)
        save_pruned(original, work / "original", run.tokenizer)
        exports = {"original": exported(run, work / "original", work / "onnx-original")}
        candidates = candidates_of("original", as_sdpa(original), work / "original", exports["original"], spec)
        for label, model_dir in members:
            exports[label] = exported(run, model_dir, work / f"onnx-{label}")
            model = load_pruned(model_dir, attn_implementation="sdpa")
            candidates += candidates_of(label, model, model_dir, exports[label], spec)
        test = run.splits["test"]
        batches = sample_batches(test, run.tokenizer, len(test), 32, seed=0)
        result = bench.bench(candidates, batches, spec, None, reference="original/pytorch")
    cpu = cpu_summary()
    rows = rows_of(result, exports)
    print(table(rows, cpu))
    import nncf
    import openvino

    record = {
        "commit": commit(),
        "cpu": cpu,
        "cpu_int8_features": int8_features(cpu),
        "machine": {**machine_info(), "openvino": openvino.__version__, "nncf": nncf.__version__},
        "else_running": args.else_running,
        "recipe": str(args.recipe.relative_to(ROOT)) if args.run is None else None,
        "run": args.run.name if args.run is not None else None,
        "setup": result["setup"],
        "rows": rows,
        "exports": {
            k: {
                v: {f: i.get(f) for f in ("status", "gate", "weights", "size_bytes", "max_abs_diff")}
                for v, i in e.items()
            }
            for k, e in exports.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
