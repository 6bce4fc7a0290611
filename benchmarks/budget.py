"""Issue 15's figures from finished runs of the budget recipes (nothing is re-run or re-timed).

For each run (default `runs/minilm_rt_2x`, `runs/minilm_rt_3x` and `runs/minilm_rt_half_flops`) it reads
`report.json` and prints: the speed-up asked, predicted by the latency table and measured by the run's own bench
(PyTorch, at the budget's batch size and length, vs the PyTorch original); the test accuracy change of the pruned
model and of its ONNX int8 export with McNemar's p; the int8 speed-up vs the PyTorch original; and the pruned model
vs the layer-dropping baseline at the same FLOPs. Each figure is checked against the issue's goal for that recipe.
A FLOP budget (the half-FLOPs recipe: the FLOPs of dropping 3 of the 6 layers) asks no speed-up; its row is there
for the layer-drop comparison.

Run the recipes first (the lead's machine, ~15-25 min each on 2 cores):
    .venv/bin/compressor run recipes/minilm_rt_2x.yaml
    .venv/bin/compressor run recipes/minilm_rt_3x.yaml
    .venv/bin/compressor run recipes/minilm_rt_half_flops.yaml
Usage: .venv/bin/python benchmarks/budget.py [--runs runs/minilm_rt_2x runs/minilm_rt_3x runs/minilm_rt_half_flops]
       → prints a table and writes benchmarks/results/budget.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The goals per asked speed-up: (max accuracy drop in points of the PyTorch model, of the int8 export,
# min int8 speed-up vs the PyTorch original); None where the issue sets none.
GOALS = {2.0: (1.0, 1.5, 5.0), 3.0: (2.5, None, None)}
BUDGET_TOLERANCE = 0.10  # measured within 10% of asked
BASELINE_MARGIN_POINTS = 1.0  # pruning must beat the layer-drop baseline by this much at 3 of 6 layers' FLOPs


def _bench_row(report: dict, candidate: str) -> dict | None:
    return report.get("bench", {}).get("summary", {}).get(candidate)


def _speedup(report: dict, candidate: str, seq_len: int, batch: int) -> float | None:
    row = report.get("bench", {}).get("speedups", {}).get(candidate, {}).get(str(seq_len), {}).get(str(batch))
    return None if row is None else row["median"]


def _points(original: float | None, other: float | None) -> float | None:
    """Accuracy drop in points (positive = worse than the original)."""
    return None if original is None or other is None else round(100 * (original - other), 2)


def figures(report: dict, run: str) -> dict:
    """The issue's figures for one finished run's report, each with whether its goal is met."""
    budget, original = report["budget"], report["original"]["test"]["accuracy"]
    seq, batch = budget["seq_len"], budget["batch_size"]
    pruned, int8 = _bench_row(report, "pytorch-pruned") or {}, _bench_row(report, "onnx-int8") or {}
    speed = budget["kind"] == "speedup"
    out = {
        "run": run,
        "budget_kind": budget["kind"],
        "asked": budget["value"],  # a speed-up factor, or the fraction of FLOPs / heads removed
        "asked_speedup": budget["value"] if speed else None,
        "runtime": budget["runtime"] if speed else None,
        "batch_size": batch,
        "seq_len": seq,
        "predicted_speedup": budget.get("predicted_speedup"),
        "measured_speedup": budget.get("measured_speedup"),
        "measured_by_last_step": budget.get("measured_in_run"),  # the step's own check that corrects the table
        "step_checks": [
            {k: s.get(k) for k in ("step", "predicted_speedup", "measured_speedup", "calibration")}
            for s in report.get("steps", [])
        ],
        "budget_within_10pct": budget.get("within_10pct"),
        "original_accuracy": original,
        "pruned_accuracy": report["pruned"]["test"]["accuracy"],
        "pruned_drop_points": _points(original, report["pruned"]["test"]["accuracy"]),
        "pruned_mcnemar_p": pruned.get("mcnemar_p"),
        "int8_speedup": _speedup(report, "onnx-int8", seq, batch),
        "int8_drop_points": _points(original, int8.get("accuracy")),
        "int8_mcnemar_p": int8.get("mcnemar_p"),
        "flop_ratio": report["pruned"]["flop_ratio"],
        "units_removed": report["pruned"].get("units_removed"),
    }
    if "baseline" in report:
        base = report["baseline"]
        out["baseline"] = {
            "layers_dropped": base["layers_dropped"],
            "accuracy": base["baseline_accuracy"],
            "pruned_minus_baseline_points": round(100 * base["pruned_minus_baseline"], 2),
            "mcnemar_p": base["mcnemar_p"],
        }
    out["goals"] = _goals(out)
    return out


def _goals(f: dict) -> dict:
    """Each of the issue's goals that applies to this run: True / False (None when a figure is missing)."""
    drop, int8_drop, int8_speed = GOALS.get(f["asked_speedup"] or 0.0, (None, None, None))

    def check(value, ok):
        return None if value is None else bool(ok(value))

    goals = {"budget_within_10pct": f["budget_within_10pct"]} if f["asked_speedup"] is not None else {}
    if drop is not None:
        goals["speedup_met"] = check(f["measured_speedup"], lambda v: v >= f["asked_speedup"])
        goals["accuracy_within_goal"] = check(f["pruned_drop_points"], lambda v: v <= drop)
    if int8_drop is not None:
        goals["int8_speedup_met"] = check(f["int8_speedup"], lambda v: v >= int8_speed)
        goals["int8_accuracy_within_goal"] = check(f["int8_drop_points"], lambda v: v <= int8_drop)
    base = f.get("baseline")
    if base is not None and base["layers_dropped"] == 3:  # the comparison: 3 of MiniLM's 6 layers
        goals["beats_layer_drop_by_1pt"] = base["pruned_minus_baseline_points"] >= BASELINE_MARGIN_POINTS
    return goals


def _fmt(x, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def _asked(f: dict) -> str:
    """'2.00×' for a speed-up budget, '50% FLOPs' (or heads) removed for the others."""
    if f["asked_speedup"] is not None:
        return f"{f['asked_speedup']:.2f}×"
    return f"{f['asked']:.0%} {f['budget_kind']}"


def print_table(rows: list[dict]) -> None:
    print("| run | asked | predicted | measured | Δacc pts (p) | int8 × | int8 Δacc pts (p) | vs layer-drop pts (p) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for f in rows:
        base = f.get("baseline") or {}
        print(
            f"| {f['run']} | {_asked(f)} | {_fmt(f['predicted_speedup'])}× | "
            f"{_fmt(f['measured_speedup'])}× | {_fmt(f['pruned_drop_points'])} ({_fmt(f['pruned_mcnemar_p'], '.3g')})"
            f" | {_fmt(f['int8_speedup'])} | {_fmt(f['int8_drop_points'])} ({_fmt(f['int8_mcnemar_p'], '.3g')}) | "
            f"{_fmt(base.get('pruned_minus_baseline_points'))} ({_fmt(base.get('mcnemar_p'), '.3g')}, "
            f"{base.get('layers_dropped', '–')} layers) |"
        )
    for f in rows:
        print(f"{f['run']}: goals {f['goals']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--runs", nargs="+", default=["runs/minilm_rt_2x", "runs/minilm_rt_3x", "runs/minilm_rt_half_flops"]
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "budget.json"))
    args = parser.parse_args(argv)
    rows = []
    for run in args.runs:
        path = Path(run) / "report.json"
        if not path.exists():
            print(f"budget: {path} not found; run the recipe first", file=sys.stderr)
            return 2
        report = json.loads(path.read_text())
        if "budget" not in report:
            print(f"budget: {path} has no budget section (a run from before issue 15?)", file=sys.stderr)
            return 2
        rows.append(figures(report, Path(run).name))
    print_table(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    print(f"wrote {Path(args.out).relative_to(ROOT) if Path(args.out).is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
