"""Recovery settings at a fixed per-step budget (issue 14): which fine-tune keeps quality at 50% and 75% of heads.

For each recipe (default: the demo's 50% recipe and the 75% one, both with 1,500 recovery examples per step), this
script derives one variant per setting in `SETTINGS` (recovery learning rate, distillation on/off, the step
schedule), each under `runs/recovery/<recipe>_<setting>`, runs it with `compressor run` (export and analysis off,
a one-round bench for the test-split McNemar test; a finished run is reused) and prints one row per run: the
validation accuracy after the last step's fine-tune, the test accuracy with its paired McNemar p against the
original, and the wall time without the shared base fine-tune.

The setting a recipe should ship is the one with the best *validation* accuracy (marked "chosen"); the test column
is printed for every row but plays no part in the choice.

Usage: python benchmarks/recovery.py [--recipes R ...] [--settings S ...] [--rerun]
  → prints a Markdown table and writes benchmarks/results/recovery.json (rows of earlier sweeps are kept; a
    recipe and setting run again replace their row)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from finetuned import finished_report  # noqa: E402

DEFAULT_RECIPES = ["minilm_rt_50pct", "minilm_rt_75pct"]
DISTILL = {"alpha": 0.7, "temperature": 2.0}
HIDDEN = {**DISTILL, "hidden_weight": 1.0}  # plus layer-wise hidden-state MSE (TinyBERT's weight)
SETTINGS: dict[str, dict] = {  # name → changes to prune / prune.finetune (distill None switches it off)
    "lr5e-5": {"finetune": {"lr": 5.0e-5, "distill": None}},
    "lr5e-5_distill": {"finetune": {"lr": 5.0e-5, "distill": DISTILL}},
    "lr1e-4": {"finetune": {"lr": 1.0e-4, "distill": None}},
    "lr1e-4_distill": {"finetune": {"lr": 1.0e-4, "distill": DISTILL}},
    "lr1e-4_geometric": {"schedule": "geometric", "finetune": {"lr": 1.0e-4, "distill": None}},
    "lr5e-5_hidden": {"finetune": {"lr": 5.0e-5, "distill": HIDDEN}},
    "lr1e-4_hidden": {"finetune": {"lr": 1.0e-4, "distill": HIDDEN}},
    # the same 1,500 examples per step over more, smaller steps (so more recovery in total)
    "lr5e-5_distill_6steps": {"steps": 6, "finetune": {"lr": 5.0e-5, "distill": DISTILL}},
    "lr5e-5_9steps": {"steps": 9, "finetune": {"lr": 5.0e-5, "distill": None}},
}


def variant(recipe: Path, name: str, changes: dict) -> Path:
    """Write `recipe` with `changes` applied to its `prune` section under runs/recovery/; return its path."""
    data = yaml.safe_load(recipe.read_text())
    prune = data["prune"]
    for key, value in changes.items():
        if key == "finetune":
            prune["finetune"] = {**prune["finetune"], **copy.deepcopy(value)}
        else:
            prune[key] = value
    data["name"] = f"{data['name']}_{name}"
    data["output_dir"] = f"runs/recovery/{data['name']}"
    data["export"] = {"enabled": False}
    data["analysis"] = {"enabled": False}
    data["bench"] = {**data.get("bench", {}), "batch_sizes": [32], "rounds": 1}
    path = ROOT / "runs" / "recovery" / f"{data['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def row(recipe: str, setting: str, report: dict) -> dict:
    """The figures of one run: last-step validation, test accuracy and McNemar p, wall time without the base."""
    original = 100 * report["original"]["test"]["accuracy"]
    pruned = 100 * report["pruned"]["test"]["accuracy"]
    last = report["steps"][-1]
    return {
        "recipe": recipe,
        "setting": setting,
        "heads_left": report["pruned"]["heads_left"],
        "val_after_last_step": (last.get("val_after_finetune") or {}).get("accuracy"),
        "original_test_accuracy": round(original, 2),
        "pruned_test_accuracy": round(pruned, 2),
        "delta_points": round(pruned - original, 2),
        "mcnemar_p": report.get("bench", {}).get("summary", {}).get("pytorch-pruned", {}).get("mcnemar_p"),
        "run_seconds": round(report["seconds"] - report["base_finetune"].get("seconds", 0)),
    }


def choose(rows: list[dict]) -> None:
    """Mark, per recipe, the setting with the best validation accuracy after its last step."""
    for recipe in {r["recipe"] for r in rows}:
        mine = [r for r in rows if r["recipe"] == recipe and r["val_after_last_step"] is not None]
        best = max(mine, key=lambda r: r["val_after_last_step"], default=None)
        for r in mine:
            r["chosen_by_validation"] = r is best


def table(rows: list[dict]) -> str:
    head = "| recipe | setting | heads left | val (last step) | test | Δ vs original | McNemar p | s | chosen |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        p, val = r["mcnemar_p"], r["val_after_last_step"]
        lines.append(
            f"| {r['recipe']} | {r['setting']} | {r['heads_left']} | {'–' if val is None else f'{val:.4f}'} |"
            f" {r['pruned_test_accuracy']:.2f} | {r['delta_points']:+.2f} | {'–' if p is None else f'{p:.3g}'} |"
            f" {r['run_seconds']} | {'yes' if r.get('chosen_by_validation') else ''} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=DEFAULT_RECIPES, help="recipe names under recipes/")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--rerun", action="store_true", help="run every variant again (--force) even if finished")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "recovery.json")
    args = parser.parse_args()
    rows = json.loads(args.out.read_text()) if args.out.exists() else []  # earlier sweeps' rows are kept
    for setting in args.settings:
        for recipe in args.recipes:
            path = variant(ROOT / "recipes" / f"{recipe}.yaml", setting, SETTINGS[setting])
            new = row(recipe, setting, finished_report(path, args.rerun))
            rows = [r for r in rows if (r["recipe"], r["setting"]) != (recipe, setting)] + [new]
            choose(rows)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rows, indent=2) + "\n")  # after every run: a partial sweep is kept
            print(table(rows), flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
