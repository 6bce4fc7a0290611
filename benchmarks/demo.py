"""Spine figures: `make demo` wall time from a fresh clone and an empty cache, where the time went, accuracy
before/after pruning, batch-32 speed-up; with the CPU and the machine's load next to every figure.

"Fresh" means both a fresh clone of this repository (a temporary directory, so nothing from the working tree's venv
is reused; pip's package cache is, as on any machine that installed Python packages before) and an empty
`COMPRESSOR_CACHE` (set here to a new directory, so the base fine-tune runs: a warm cache hides it).
Run it with the machine to yourself: the load average before and after is recorded to show what else ran.
Usage: python benchmarks/demo.py [--keep DIR]  → prints and writes benchmarks/results/demo.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compressor.core.machine import cpu_summary  # noqa: E402


def timed_make(target: str, clone: Path, env: dict, log: Path) -> float:
    """Run `make TARGET` in the clone; its wall seconds (the log goes to `log`; a failure stops the benchmark)."""
    start = time.perf_counter()
    done = subprocess.run(["make", target], cwd=clone, env=env, capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"make {target} failed (exit {done.returncode}); log: {log}")
    return time.perf_counter() - start


def summary(report: dict) -> dict:
    """The figures of one demo report: accuracy before/after, heads, FLOPs, the stage-time table, the benchmark."""
    original, pruned = report["original"]["test"]["accuracy"], report["pruned"]["test"]["accuracy"]
    keys = ("accuracy", "agreement", "speedup", "headline_speedup", "headline_batch", "headline_seq_len")
    bench = {name: {k: row.get(k) for k in keys} for name, row in report.get("bench", {}).get("summary", {}).items()}
    if not bench:
        raise SystemExit("report.json has no benchmark summary")
    recommendation = report.get("recommendation") or {}
    return {
        "run_seconds": round(report["seconds"], 1),
        "stage_seconds": report.get("timings", {}),
        "original_test_accuracy": original,
        "pruned_test_accuracy": pruned,
        "accuracy_drop_points": round(100 * (original - pruned), 2),
        "heads_left": report["pruned"]["heads_left"],
        "flop_ratio": report["pruned"]["flop_ratio"],
        "recommendation": {k: recommendation.get(k) for k in ("variant", "speedup", "not_recommended")},
        "bench": bench,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="clone here instead of a temporary directory")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="compressor-demo-"))
    clone, cache = work / "compressor", work / "cache"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    cache.mkdir()
    env = {**os.environ, "COMPRESSOR_CACHE": str(cache)}
    load_before = os.getloadavg()
    setup = timed_make("setup", clone, env, work / "setup.log")  # `make demo` = setup + run: both are timed
    cache_state = "empty" if not any(cache.iterdir()) else "not empty"
    run = timed_make("demo", clone, env, work / "demo.log")
    report = json.loads((clone / "runs" / "minilm_rt_50pct" / "report.json").read_text())
    result = {
        "make_demo_wall_s": round(setup + run, 1),
        "setup_s": round(setup, 1),
        "demo_after_setup_s": round(run, 1),
        "fresh": {"clone": True, "commit": commit, "compressor_cache_at_start": cache_state},
        "cpu": cpu_summary(),
        "load_average_1min": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        **summary(report),
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "benchmarks" / "results" / "demo.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}; logs in {work}")


if __name__ == "__main__":
    main()
