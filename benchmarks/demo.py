"""Spine figures: `make demo` wall time from a fresh clone, accuracy before/after pruning, batch-32 speed-up.

Clones this repository into a temporary directory (so nothing from the working tree's venv or caches is reused
except pip's package cache), runs `make demo` with an empty compressor cache, and reads the run's report.
Usage: python benchmarks/demo.py [--keep DIR]  → prints and writes benchmarks/results/demo.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="clone here instead of a temporary directory")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="compressor-demo-"))
    clone = work / "compressor"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "COMPRESSOR_CACHE": str(work / "cache")}
    start = time.perf_counter()
    done = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (work / "demo.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"make demo failed (exit {done.returncode}); log: {work / 'demo.log'}")
    report = json.loads((clone / "runs" / "minilm_rt_50pct" / "report.json").read_text())
    result = {
        "make_demo_wall_s": round(wall, 1),
        "run_seconds": round(report["seconds"], 1),
        "original_test_accuracy": report["original"]["test"]["accuracy"],
        "pruned_test_accuracy": report["pruned"]["test"]["accuracy"],
        "accuracy_drop_points": round(
            100 * (report["original"]["test"]["accuracy"] - report["pruned"]["test"]["accuracy"]), 2
        ),
        "heads_left": report["pruned"]["heads_left"],
        "flop_ratio": report["pruned"]["flop_ratio"],
    }
    keys = (
        "accuracy",
        "agreement",
        "speedup",
        "headline_speedup",
        "headline_batch",
        "headline_seq_len",
        "flop_ideal_speedup",
    )
    result["bench"] = {
        name: {k: row.get(k) for k in keys} for name, row in report.get("bench", {}).get("summary", {}).items()
    }
    if not result["bench"]:
        raise SystemExit(f"report.json has no benchmark summary: {clone / 'runs' / 'minilm_rt_50pct' / 'report.json'}")
    print(json.dumps(result, indent=2))
    out = ROOT / "benchmarks" / "results" / "demo.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
