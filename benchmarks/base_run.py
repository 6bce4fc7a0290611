"""Issue 29's base-size figures: `compressor run recipes/mpnet_rt_2x.yaml` from an empty cache, against the goals.

With `--run` it runs the recipe itself in a child process, with `COMPRESSOR_CACHE` set to a new empty directory (so
the run unpacks the built-in, fine-tunes the base and measures its latency table), and takes the wall time and the
child's peak RSS (`getrusage`). Without it, it reads a finished run's directory, and the wall time and peak RSS from
the `/usr/bin/time -v` log of that run (`--time-log`). Either way it prints, each against the issue's goal:
- wall time (≤ 60 min from an empty cache) and peak RSS;
- the pruned model on PyTorch at the budget's batch: speed-up measured by the run's bench, test drop (≤ 1.0 point)
  with McNemar's p against the original;
- ONNX int8: speed-up (≥ 4×) and test drop (≤ 1.5 points), with its own validation gate and smoothing;
- pruned against the layer-drop baseline at its FLOPs (ahead), with McNemar's p;
- where the time went (the run's phase table), the pruned shape and the per-step log.

Usage (the machine to yourself, after `make setup-base`):
    .venv/bin/python benchmarks/base_run.py --run --else-running "nothing"
  or, for a run already made under `/usr/bin/time -v ... 2> LOG`:
    .venv/bin/python benchmarks/base_run.py --run-dir runs/mpnet_rt_2x --time-log LOG --else-running "..."
  → prints the figures and writes benchmarks/results/mpnet_rt_2x.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compressor.core.machine import cpu_summary  # noqa: E402

RECIPE = ROOT / "recipes" / "mpnet_rt_2x.yaml"
GOALS = {"wall_min": 60.0, "pytorch": (2.0, 1.0), "int8": (4.0, 1.5)}  # (speed-up at least, drop at most)


def run_recipe(recipe: Path, log: Path) -> dict:
    """Run `recipe` with an empty cache in a child process: its wall seconds and peak RSS (kB)."""
    with tempfile.TemporaryDirectory(prefix="compressor-cache-") as cache:
        env = {**os.environ, "COMPRESSOR_CACHE": cache}
        start = time.perf_counter()
        with log.open("w") as out:
            done = subprocess.run(
                [sys.executable, "-m", "compressor", "run", str(recipe)], cwd=ROOT, env=env, stdout=out, stderr=out
            )
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"compressor run failed (exit {done.returncode}); log: {log}")
    return {"wall_s": round(wall, 1), "peak_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}


def read_time_log(path: Path) -> dict:
    """Wall seconds and peak RSS (kB) from a GNU `/usr/bin/time -v` log."""
    text = path.read_text(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    if rss is None or wall is None:
        raise SystemExit(f"{path}: no /usr/bin/time -v summary (expected 'Maximum resident set size' and 'Elapsed')")
    seconds = 0.0
    for part in wall.group(1).split(":"):
        seconds = 60 * seconds + float(part)
    return {"wall_s": round(seconds, 1), "peak_rss_kb": int(rss.group(1))}


def _row(frontier: list[dict], name: str) -> dict:
    row = next((r for r in frontier if r["name"] == name), None)
    if row is None:
        return {}
    keys = ("speedup", "accuracy", "drop_points", "mcnemar_p", "rejected")
    return {k: (round(row[k], 4) if isinstance(row[k], float) else row[k]) for k in keys}


def _verdict(row: dict, goal: tuple[float, float]) -> dict:
    speed, drop = goal
    met = bool(row) and row["speedup"] >= speed and row["drop_points"] <= drop and not row.get("rejected")
    return {**row, "goal": f">= {speed}x within {drop} points", "met": met}


def figures(report: dict, wall: dict) -> dict:
    """The issue's figures from a run's report.json and its wall time / peak RSS."""
    frontier = report.get("frontier") or []
    int8 = report.get("export", {}).get("int8", {})
    baseline = report.get("baseline") or {}
    pruned = report["pruned"]
    steps = report.get("steps", [])
    return {
        "wall": {**wall, "goal_min": GOALS["wall_min"], "met": wall["wall_s"] <= 60 * GOALS["wall_min"]},
        "timings": report.get("timings"),
        "original_test_accuracy": report["original"]["test"]["accuracy"],
        "pytorch": _verdict(_row(frontier, "pytorch-pruned"), GOALS["pytorch"]),
        "onnx_fp32": _row(frontier, "onnx-fp32"),
        "int8": _verdict(_row(frontier, "onnx-int8"), GOALS["int8"])
        | {"gate": int8.get("gate"), "smoothing": int8.get("smoothing")},
        "layer_drop": {
            **_row(frontier, "pytorch-layer-drop"),
            "pruned_minus_baseline_points": None
            if "pruned_minus_baseline" not in baseline
            else round(100 * baseline["pruned_minus_baseline"], 2),
            "mcnemar_p": baseline.get("mcnemar_p"),
            "layers_dropped": baseline.get("layers_dropped"),
        },
        "budget": report.get("budget"),
        "pruned": {
            k: pruned.get(k) for k in ("heads", "heads_per_layer", "ffn_neurons_per_layer", "parameters", "flop_ratio")
        },  # fmt: skip
        "steps": [
            {k: s.get(k) for k in ("step", "goal", "expected_speedup", "measured_speedup", "val_after_finetune")}
            for s in steps
        ],
        "recommendation": report.get("recommendation"),
    }


def print_figures(f: dict) -> None:
    w = f["wall"]
    print(f"wall {w['wall_s'] / 60:.1f} min (goal <= {w['goal_min']:.0f}: {'met' if w['met'] else 'MISSED'}), "
          f"peak RSS {w['peak_rss_kb'] / 1e6:.2f} GB")  # fmt: skip
    print(f"original test accuracy {100 * f['original_test_accuracy']:.2f}%")
    for name in ("pytorch", "int8"):
        r = f[name]
        change = -(r.get("drop_points") or 0)
        verdict = "met" if r["met"] else "MISSED"
        speed, p = r.get("speedup") or 0, r.get("mcnemar_p")
        print(f"{name}: {speed:.2f}x at {change:+.2f} points (p {p}), goal {r['goal']}: {verdict}")
    print("int8 gate:", json.dumps(f["int8"]["gate"]))
    print("layer-drop:", json.dumps(f["layer_drop"]))
    print("timings:", json.dumps(f["timings"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run the recipe now with an empty cache")
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--run-dir", default=str(ROOT / "runs" / "mpnet_rt_2x"))
    parser.add_argument("--time-log", help="the /usr/bin/time -v log of the run (without --run)")
    parser.add_argument("--else-running", required=True, help="what else ran on the machine meanwhile")
    parser.add_argument("--commit", help="the commit the run ran at (default: this checkout's HEAD)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mpnet_rt_2x.json"))
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if args.run:
        wall = run_recipe(Path(args.recipe), run_dir.parent / f"{run_dir.name}.log")
    elif args.time_log:
        wall = read_time_log(Path(args.time_log))
    else:
        parser.error("--time-log: expected the run's /usr/bin/time -v log, or --run to run it here")
    report = json.loads((run_dir / "report.json").read_text())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result = {
        "command": f"compressor run {Path(args.recipe).relative_to(ROOT)} (COMPRESSOR_CACHE empty)",
        "commit": args.commit or head.stdout.strip(),
        "cache_at_start": "empty (the built-in is unpacked, the base fine-tuned and the latency table measured)",
        "cpu": cpu_summary(),
        "else_running": args.else_running,
        **figures(report, wall),
    }
    print_figures(result)
    from family import write_result

    write_result(result, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
