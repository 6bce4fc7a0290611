"""Pruning *with* fine-tuning between steps: accuracy lost at 50% and 75% of heads, per recipe, plus the int8 export.

Issue 7's second figure (the best criterion, `taylor`, loses ≤ 0.5 point at 50% and ≤ 1.5 points at 75% with the
spine's iterative fine-tuning) and issue 4's int8 figure (int8 pruned model within 1 point of the fine-tuned
original) come from the same runs. For each recipe, this script runs `compressor run RECIPE` unless the recipe's
output directory already holds a finished run (`report.json`; pass --rerun to start over), then reads the report:
test accuracy of the original and the pruned model, the paired McNemar p-value against the original, the ONNX
int8 variant's accuracy, and heads left per layer. All recipes share the cached base fine-tune, so their
"original" is the same model.

Usage: python benchmarks/finetuned.py [--recipes R ...] [--rerun]
  → prints a Markdown table and writes benchmarks/results/finetuned.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPES = ["minilm_rt_50pct_full", "minilm_rt_75pct_full", "minilm_rt_50pct", "minilm_rt_75pct"]
TARGETS = {0.5: 0.5, 0.75: 1.5}  # fraction of heads removed → allowed loss in points (issue 7)


def finished_report(recipe: Path, rerun: bool) -> dict:
    """The recipe's report.json, running the recipe first when it has no finished run (or when `rerun`)."""
    out = ROOT / yaml.safe_load(recipe.read_text())["output_dir"]
    if rerun or not (out / "report.json").exists():
        cmd = [sys.executable, "-m", "compressor", "run", str(recipe), *(["--force"] if rerun else [])]
        print("running:", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads((out / "report.json").read_text())


def summarise(name: str, report: dict) -> dict:
    """The figures one run contributes: accuracies in points, drops against the original, significance."""
    original = 100 * report["original"]["test"]["accuracy"]
    pruned = 100 * report["pruned"]["test"]["accuracy"]
    summary = report.get("bench", {}).get("summary", {})
    removed = 1 - report["pruned"]["heads_left"] / report["pruned"]["heads_total"]
    row = {
        "recipe": name,
        "fraction_removed": round(removed, 4),
        "heads_per_layer": report["pruned"]["heads_per_layer"],
        "finetune_optimizer_steps": report["steps"][0].get("finetune", {}).get("steps"),
        "original_test_accuracy": round(original, 2),
        "pruned_test_accuracy": round(pruned, 2),
        "drop_points": round(original - pruned, 2),
        "mcnemar_p": summary.get("pytorch-pruned", {}).get("mcnemar_p"),
        "flop_ratio": report["pruned"]["flop_ratio"],
        "run_seconds": round(report["seconds"]),
    }
    if "onnx-int8" in summary:
        int8 = 100 * summary["onnx-int8"]["accuracy"]
        row |= {
            "int8_test_accuracy": round(int8, 2),
            "int8_drop_points": round(original - int8, 2),
            "int8_mcnemar_p": summary["onnx-int8"].get("mcnemar_p"),
        }
    allowed = TARGETS.get(round(removed, 2))
    if allowed is not None:
        row["allowed_drop_points"] = allowed
        row["target_met"] = row["drop_points"] <= allowed
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| recipe | removed | fine-tune steps per pruning step | original | pruned | Δ | McNemar p | target "
        "| int8 | int8 Δ |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        target = (
            "–" if "target_met" not in r else f"≤ {r['allowed_drop_points']}: {'met' if r['target_met'] else 'missed'}"
        )
        ft_steps = r["finetune_optimizer_steps"]
        lines.append(
            f"| {r['recipe']} | {r['fraction_removed']:.0%} | {ft_steps if ft_steps is not None else '–'} | "
            f"{r['original_test_accuracy']:.2f} | {r['pruned_test_accuracy']:.2f} | {-r['drop_points']:+.2f} | "
            f"{r['mcnemar_p']:.3g} | {target} | {r.get('int8_test_accuracy', float('nan')):.2f} | "
            f"{-r.get('int8_drop_points', float('nan')):+.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=DEFAULT_RECIPES, help="recipe names under recipes/")
    parser.add_argument("--rerun", action="store_true", help="run every recipe again (--force) even if finished")
    args = parser.parse_args()
    rows = [summarise(n, finished_report(ROOT / "recipes" / f"{n}.yaml", args.rerun)) for n in args.recipes]
    print(table(rows))
    out = ROOT / "benchmarks" / "results" / "finetuned.json"
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
