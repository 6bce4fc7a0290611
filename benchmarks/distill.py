"""Distillation on vs off (issue 14): the same recipes, same seeds, with and without `prune.finetune.distill`.

For each recipe (default: the 50% and 75% MiniLM recipes with 1,500 examples per step), this script derives its
twin with distillation switched the other way (`distill: null`, output `<output_dir>_nodistill`, for a recipe that
distils; alpha 0.7, T 2, output `<output_dir>_distill`, for one that does not, as the 75% recipe now), runs
both through `benchmarks/finetuned.py`'s `finished_report` (a finished run is reused; --rerun starts over) and
prints one row per run: test accuracy of the original and the pruned model with the paired McNemar p, wall time
without the shared base fine-tune (and its ratio to the distillation-off run), every int8 variant with its
validation gate verdict (Δ in points vs fp32), and the run's recommendation.

Usage: python benchmarks/distill.py [--recipes R ...] [--rerun]
       python benchmarks/distill.py --runs OFF_DIR ON_DIR [OFF_DIR ON_DIR ...]   (finished runs, nothing run)
  → prints a Markdown table and writes benchmarks/results/distill.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from finetuned import finished_report, summarise  # noqa: E402

DEFAULT_RECIPES = ["minilm_rt_50pct", "minilm_rt_75pct"]


ON = {"alpha": 0.7, "temperature": 2.0}  # the settings the distilling recipes use


def twin(recipe: Path) -> tuple[Path, bool]:
    """Write, under runs/, the copy of `recipe` with distillation switched the other way (`distill: null` for a
    recipe that distils, `ON` for one that does not); return its path and whether the twin distils."""
    data = yaml.safe_load(recipe.read_text())
    distils = data["prune"]["finetune"].get("distill") is not None
    suffix = "_nodistill" if distils else "_distill"
    data["name"] = f"{data['name']}{suffix}"
    data["output_dir"] = f"{data['output_dir']}{suffix}"
    data["prune"]["finetune"]["distill"] = None if distils else dict(ON)
    path = ROOT / "runs" / f"{data['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, not distils


def row(name: str, report: dict) -> dict:
    """`finetuned.summarise` plus distillation, int8 gate verdicts and the recommendation."""
    out = summarise(name, report)
    out["distillation"] = report.get("distillation")
    out["int8"] = {
        variant: {"status": info.get("status"), **{k: info.get("gate", {}).get(k) for k in ("accuracy", "drop")}}
        for variant, info in report.get("export", {}).items()
        if variant.startswith("int8")
    }
    out["int8_test_accuracy_by_variant"] = {
        k.removeprefix("onnx-"): v.get("accuracy")
        for k, v in report.get("bench", {}).get("summary", {}).items()
        if k.startswith("onnx-int8")
    }
    out["recommendation"] = (report.get("recommendation") or {}).get("variant")
    # Whichever run comes first also fine-tunes the shared base model: leave that out of the comparison.
    out["run_seconds"] = round(report["seconds"] - report["base_finetune"].get("seconds", 0))
    return out


COLUMNS = {  # header → alignment
    "recipe": "---",
    "removed": "---:",
    "distillation": "---",
    "original": "---:",
    "pruned": "---:",
    "Δ": "---:",
    "McNemar p": "---:",
    "wall time (s)": "---:",
    "int8 gate (val Δ)": "---",
    "recommended": "---",
}


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(COLUMNS.values()) + "|"]
    for r in rows:
        gates = ", ".join(f"{k}: {v['status']} ({-100 * (v['drop'] or 0):+.2f})" for k, v in r["int8"].items())
        ratio = f" ({r['wall_time_ratio']:.2f}×)" if "wall_time_ratio" in r else ""
        cells = [
            r["recipe"],
            f"{r['fraction_removed']:.0%}",
            "on" if r["distillation"] else "off",
            *(f"{r[k]:.2f}" for k in ("original_test_accuracy", "pruned_test_accuracy")),
            f"{-r['drop_points']:+.2f}",
            f"{r['mcnemar_p']:.3g}",
            f"{r['run_seconds']}{ratio}",
            gates or "–",
            r["recommendation"] or "–",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def on_and_off(name: str, rerun: bool) -> list[dict]:
    """Rows of the recipe and of its twin, distillation off first; wall-time ratio on the distilling one."""
    recipe = ROOT / "recipes" / f"{name}.yaml"
    other, other_distils = twin(recipe)
    runs = {other_distils: (other.stem, other), not other_distils: (name, recipe)}
    off, on = (row(label, finished_report(path, rerun)) for label, path in (runs[False], runs[True]))
    on["wall_time_ratio"] = on["run_seconds"] / max(off["run_seconds"], 1)
    return [off, on]


def pair_of_runs(off_dir: Path, on_dir: Path) -> list[dict]:
    """Rows of two finished runs of the same recipe and seed, distillation off and on (named by their directory)."""
    off, on = (row(d.name, json.loads((d / "report.json").read_text())) for d in (off_dir, on_dir))
    on["wall_time_ratio"] = on["run_seconds"] / max(off["run_seconds"], 1)
    return [off, on]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=DEFAULT_RECIPES, help="recipe names under recipes/")
    parser.add_argument("--rerun", action="store_true", help="run every recipe again (--force) even if finished")
    parser.add_argument("--runs", nargs="+", type=Path, help="finished run directories, in off/on pairs")
    args = parser.parse_args()
    if args.runs:
        if len(args.runs) % 2:
            parser.error("--runs: expected pairs of run directories (distillation off, then on)")
        pairs = zip(args.runs[::2], args.runs[1::2], strict=True)
        rows = [r for off, on in pairs for r in pair_of_runs(off, on)]
    else:
        rows = [r for name in args.recipes for r in on_and_off(name, args.rerun)]
    out = ROOT / "benchmarks" / "results" / "distill.json"
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"{table(rows)}\nwrote {out}")


if __name__ == "__main__":
    main()
