"""Issue 63: what each exporter costs and gives on one saved model: wall seconds and peak memory of
`compressor export --exporter NAME` (fp32 + optimised graph, parity-gated), each in a fresh process, and the fusions
of its optimised graph.

The exporters alternate within each repeat (torch.export, TorchScript, torch.export, ...) so a slow spell of the
machine falls on both. Peak memory is the child process's maximum resident set (`os.wait4`'s rusage), which
includes loading the model and the parity checks, the same for both. Writes OUT_DIR/export_paths.json, read by the
suite's `export_paths` reader (`python -m benchmarks run export_paths`).

Usage: python benchmarks/export_paths.py --model-dir runs/mpnet_width_seeds/seed-0/members/2x/model \
    --out-dir runs/bench/export_paths [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compressor.core import atomic  # noqa: E402
from compressor.core.machine import cpu_summary  # noqa: E402

EXPORTERS = ("torch.export", "torchscript")
RESULT = "export_paths.json"


def one_export(model_dir: Path, out: Path, exporter: str) -> dict:
    """One `compressor export` in a fresh process: its seconds, peak resident memory and the manifest it wrote."""
    command = [sys.executable, "-m", "compressor", "export", str(model_dir), str(out), "--variants", "fp32,optimized",
               "--exporter", exporter]  # fmt: skip
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"export with {exporter} failed:\n{child.stderr.read()[-2000:]}")
    manifest = json.loads((out / "export.json").read_text())
    optimized = manifest["optimized"]
    return {
        "exporter": manifest["fp32"]["exporter"],
        "asked": exporter,
        "seconds": round(seconds, 2),
        "peak_mb": round(usage.ru_maxrss / 1024, 1),  # Linux reports kilobytes
        "fp32_max_abs_diff": manifest["fp32"]["max_abs_diff"],
        "optimized_max_abs_diff": optimized["max_abs_diff"],
        "attention_fusion": optimized["attention_fusion"],
        "fused_ops": optimized["fused_ops"],
        "graph_nodes": {"fp32": manifest["fp32"]["graph_nodes"], "optimized": optimized["graph_nodes"]},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="a saved (pruned) model directory")
    parser.add_argument("--out-dir", type=Path, required=True, help="where export_paths.json goes")
    parser.add_argument("--repeats", type=int, default=2, help="exports per exporter, alternating")
    args = parser.parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        raise SystemExit(f"--model-dir: '{args.model_dir}' has no config.json; expected a saved model directory")
    if args.repeats < 1:
        raise SystemExit(f"--repeats: expected 1 or more, got {args.repeats}")
    work = args.out_dir / "work"
    runs = []
    for repeat in range(args.repeats):
        for exporter in EXPORTERS:
            shutil.rmtree(work, ignore_errors=True)
            runs.append({"repeat": repeat, **one_export(args.model_dir, work, exporter)})
            print(json.dumps(runs[-1]))
    shutil.rmtree(work, ignore_errors=True)
    result = {"model": args.model_dir.as_posix(), "cpu": cpu_summary(), "repeats": args.repeats, "runs": runs}
    atomic.write_text(args.out_dir / RESULT, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
