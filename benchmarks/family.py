"""Issue 30's figures from a finished family run and a finished one-target run (nothing is re-run or re-timed
except the test predictions the McNemar comparison between the two runs needs).

Reads `<family>/report.json` and `<single>/report.json` and prints, each against the issue's goal:
- wall time: the family run's over the one-target run's (both runs' phase tables say what each spent where; run
  them in the same cache state: both with the base fine-tune and latency table cached, or both cold);
- per member: target, speed-up measured by the family's own bench (PyTorch, at the budget's batch and length, vs
  the PyTorch original), within 10% or not, test accuracy and drop, McNemar p vs the original;
- the member at the single run's target vs the single run's model: test accuracies and McNemar's exact test on the
  same test examples (both saved models are loaded and predict the test split here);
- the frontier against the alternatives: at each member's measured speed, member − layer-drop baseline (p); at or
  above the speed of the original's own int8, the most accurate member int8 and whether it is within 1.0 point;
- the stretch goals: a member ≥ 3× on PyTorch within 0.5 point; an int8 variant ≥ 6× within 1.0 point.

The other members are compared with one-target runs of the family's own recipe at their target (`--compare`):
`--write-singles DIR --targets 1.5 2 4` writes those recipes (the family recipe with one value, and as many steps as
the family's schedule takes to reach that target, so each runs the same per-step budget the member had).

Usage (the lead's machine, machine to itself, the runs one after another):
    .venv/bin/compressor run recipes/minilm_rt_3x.yaml
    .venv/bin/compressor run recipes/minilm_rt_family.yaml
    .venv/bin/python benchmarks/family.py --write-singles runs/singles --targets 1.5 2 4
    for t in 1.5x 2x 4x; do .venv/bin/compressor run runs/singles/$t.yaml; done
    .venv/bin/python benchmarks/family.py --family runs/minilm_rt_family --single runs/minilm_rt_3x \
        --compare runs/minilm_rt_family_single_1.5x runs/minilm_rt_family_single_2x runs/minilm_rt_family_single_4x \
        --else-running "..."
  → prints the figures and writes benchmarks/results/family.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compressor.core.machine import cpu_summary  # noqa: E402

WALL_GOAL = 1.5  # the family run costs at most this multiple of the one-target run
SPEED_TOLERANCE = 0.10
INT8_GOAL_POINTS = 1.0
STRETCH = {"pytorch": (3.0, 0.5), "int8": (6.0, 1.0)}  # (speed-up at least, drop at most in points)


def _load(run: Path) -> dict:
    path = run / "report.json"
    if not path.exists():
        raise SystemExit(f"family: {path} not found; run the recipe first")
    return json.loads(path.read_text())


def members(report: dict) -> list[dict]:
    """Per member: target, measured speed-up, within 10%, accuracy, drop, McNemar p (from the frontier)."""
    rows = {r["name"]: r for r in report["family"]["frontier"]}
    out = []
    for m in report["family"]["members"]:
        point = rows.get(f"{m['label']}/pytorch", {})
        budget = m.get("budget", {})
        out.append(
            {
                "member": m["label"],
                "target": m["target"],
                "step": m["step"],
                "measured_speedup": budget.get("measured_speedup"),
                "within_10pct": budget.get("within_10pct"),
                "accuracy": point.get("accuracy"),
                "drop_points": point.get("drop_points"),
                "mcnemar_p": point.get("mcnemar_p"),
                "heads_left": m["pruned"]["heads_left"],
                "ffn_neurons": m["pruned"].get("ffn_neurons"),
                "baseline_accuracy": (m.get("baseline") or {}).get("baseline_accuracy"),
                "minus_baseline_points": None
                if "baseline" not in m
                else round(100 * m["baseline"]["pruned_minus_baseline"], 2),
                "baseline_p": (m.get("baseline") or {}).get("mcnemar_p"),
                "int8": _variant(rows, m["label"], "onnx-int8"),
            }
        )
    return out


def _variant(rows: dict, label: str, runtime: str) -> dict | None:
    r = rows.get(f"{label}/{runtime}")
    if r is None:
        return None
    keys = ("speedup", "accuracy", "drop_points", "mcnemar_p", "rejected", "pareto")
    return {k: r[k] for k in keys}


def against_alternatives(report: dict) -> dict:
    """The frontier against the original's own int8 and the layer-drop baselines."""
    rows = report["family"]["frontier"]
    original_int8 = next((r for r in rows if r["name"] == "onnx-int8-original"), None)
    out = {"original_int8": None if original_int8 is None else _pick(original_int8)}
    if original_int8 is not None:
        faster = [r for r in rows if r["role"] == "member" and r["runtime"] == "onnx-int8" and not r["rejected"]
                  and (r["speedup"] or 0) >= original_int8["speedup"]]  # fmt: skip
        best = max(faster, key=lambda r: r["accuracy"], default=None)
        out["best_member_int8_at_or_above"] = None if best is None else _pick(best)
        out["int8_goal_met"] = best is not None and best["drop_points"] <= INT8_GOAL_POINTS
    beats = [m for m in report["family"]["members"] if "baseline" in m]
    out["every_member_beats_layer_drop"] = bool(beats) and all(
        m["baseline"]["pruned_minus_baseline"] > 0 for m in beats
    )
    return out


def _pick(row: dict) -> dict:
    return {k: row[k] for k in ("name", "speedup", "accuracy", "drop_points", "mcnemar_p")}


def stretch(report: dict) -> dict:
    rows = [r for r in report["family"]["frontier"] if r["role"] == "member" and not r["rejected"]]
    out = {}
    for kind, (speed, drop) in STRETCH.items():
        runtime = "pytorch" if kind == "pytorch" else "onnx-int8"
        hits = [r for r in rows if r["runtime"] == runtime and r["speedup"] >= speed and r["drop_points"] <= drop]
        out[kind] = {"goal": f">= {speed}x within {drop} points", "met_by": [_pick(r) for r in hits]}
    return out


def compare_member(family_dir: Path, single_dir: Path, family: dict, single: dict) -> dict:
    """The member at the single run's target vs the single run's model, on the same test examples."""
    from compressor.bench.quality import mcnemar_exact
    from compressor.recipe import load_recipe
    from compressor.recovery.evaluate import predict
    from compressor.sources import load_task_data
    from compressor.sources.batches import tokenize
    from compressor.surgery.checkpoint import load_pruned

    target = single["budget"]["value"]
    member = next((m for m in family["family"]["members"] if m["target"] == target), None)
    if member is None:
        return {"target": target, "note": "the family has no member at the single run's target"}
    recipe = load_recipe(family_dir / "recipe.resolved.yaml")  # the test split and length the run used
    data = load_task_data(recipe.data)
    models = {
        "family": load_pruned(family_dir / "members" / member["label"] / "model"),
        "single": load_pruned(single_dir / "model"),
    }
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(single_dir / "model")
    test = tokenize(data.test, tokenizer, data.text_fields, recipe.data.max_length)
    right = {}
    for name, model in models.items():
        logits, labels = predict(model.eval(), test, tokenizer)
        right[name] = (logits.argmax(-1) == labels).numpy()
    result = mcnemar_exact(right["family"], right["single"])
    return {
        "target": target,
        "member": member["label"],
        "family_accuracy": float(right["family"].mean()),
        "single_accuracy": float(right["single"].mean()),
        "family_minus_single_points": round(100 * float(right["family"].mean() - right["single"].mean()), 2),
        "mcnemar_p": result["p_value"],
        "n": int(len(right["family"])),
        "family_measured_speedup": member.get("budget", {}).get("measured_speedup"),
        "single_measured_speedup": single["budget"].get("measured_speedup"),
    }


def write_singles(family_recipe: Path, targets: list[float], out_dir: Path) -> list[Path]:
    """One-target recipes from the family's: value `t`, the steps the family's schedule takes to reach `t`, and
    their own name and output directory (`runs/<family name>_single_<label>`)."""
    import yaml

    from compressor.pipeline.members import member_label
    from compressor.pruning.selection import family_amounts
    from compressor.recipe import load_recipe
    from compressor.recipe.yamlio import read_yaml

    recipe, raw = load_recipe(family_recipe), read_yaml(family_recipe)
    budget = recipe.prune.resolved_budget
    scale = "speedup" if budget.kind == "speedup" else recipe.prune.schedule
    _, ends = family_amounts(budget.targets, recipe.prune.steps, scale)
    written = []
    for target in targets:
        if target not in budget.targets:
            raise SystemExit(f"--targets: {target} is not one of the family's targets {budget.targets}")
        label = member_label(budget, target)
        single = {**raw, "name": f"{recipe.name}_single_{label}", "output_dir": f"runs/{recipe.name}_single_{label}"}
        single["prune"] = {**raw["prune"], "steps": ends[budget.targets.index(target)] + 1}
        single["prune"]["budget"] = {k: v for k, v in raw["prune"]["budget"].items() if k != "values"} | {
            "value": target
        }
        path = out_dir / f"{label}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(single, sort_keys=False))
        load_recipe(path)  # refuse to write a recipe that does not validate
        written.append(path)
    return written


def _cache_state(report: dict) -> str:
    timings = report.get("timings", {})
    return "base fine-tune run" if "base fine-tune" in timings else "base fine-tune cached"


def figures(family_dir: Path, single_dir: Path, compare: list[Path] = ()) -> dict:
    family, single = _load(family_dir), _load(single_dir)
    ratio = family["seconds"] / single["seconds"]
    return {
        "family_run": family_dir.name,
        "single_run": single_dir.name,
        "wall": {
            "family_s": round(family["seconds"], 1),
            "single_s": round(single["seconds"], 1),
            "ratio": round(ratio, 3),
            "goal": f"<= {WALL_GOAL}",
            "met": ratio <= WALL_GOAL,
            "family_cache": _cache_state(family),
            "single_cache": _cache_state(single),
            "family_timings": family.get("timings"),
            "single_timings": single.get("timings"),
        },
        "original_accuracy": family["original"]["test"]["accuracy"],
        "members": members(family),
        "member_vs_single": [
            compare_member(family_dir, run, family, report)
            for run, report in [(single_dir, single), *((c, _load(c)) for c in compare)]
        ],
        "alternatives": against_alternatives(family),
        "stretch": stretch(family),
        "pick_at_max_drop": family["family"].get("pick") and _pick(family["family"]["pick"]),
        "machine": family.get("bench", {}).get("machine"),
    }


def print_figures(f: dict) -> None:
    w = f["wall"]
    verdict = "met" if w["met"] else "MISSED"
    print(
        f"wall: family {w['family_s']:.0f} s ({w['family_cache']}) / single {w['single_s']:.0f} s "
        f"({w['single_cache']}) = {w['ratio']:.2f}x (goal {w['goal']}: {verdict})"
    )
    print("member | target | measured | within 10% | acc | drop | p | − layer-drop (p) | int8 speed / drop")
    for m in f["members"]:
        int8 = m["int8"] or {}
        print(
            f"{m['member']} | {m['target']} | {m['measured_speedup'] or 0:.2f}x | {m['within_10pct']} | "
            f"{100 * (m['accuracy'] or 0):.2f} | {m['drop_points'] or 0:+.2f} | {m['mcnemar_p'] or 0:.3g} | "
            f"{m['minus_baseline_points']} ({m['baseline_p'] or 0:.3g}) | "
            f"{int8.get('speedup') or 0:.2f}x / {int8.get('drop_points') or 0:+.2f}"
        )
    for row in f["member_vs_single"]:
        print("member vs one-target run:", json.dumps(row))
    print("alternatives:", json.dumps(f["alternatives"]))
    print("stretch:", json.dumps(f["stretch"]))
    print("pick at the recipe's max_drop:", json.dumps(f["pick_at_max_drop"]))


def write_result(result: dict, out: Path) -> None:
    """Write a benchmark's result JSON to `out` and say where (relative to the repository when inside it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="runs/minilm_rt_family")
    parser.add_argument("--single", default="runs/minilm_rt_3x", help="the one-target run the wall time is against")
    parser.add_argument("--compare", nargs="*", default=[], help="more one-target runs to compare members with")
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "minilm_rt_family.yaml"))
    parser.add_argument("--write-singles", metavar="DIR", help="write one-target recipes for --targets and stop")
    parser.add_argument("--targets", nargs="*", type=float, default=[])
    parser.add_argument("--else-running", help="what else ran on the machine during the runs")
    parser.add_argument("--commit", help="the commit the runs ran at (default: this checkout's HEAD)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "family.json"))
    args = parser.parse_args(argv)
    if args.write_singles:
        for path in write_singles(Path(args.recipe), args.targets, Path(args.write_singles)):
            print(f"wrote {path}: run it with compressor run {path}")
        return 0
    if not args.else_running:
        parser.error("--else-running: expected what else ran on the machine during the runs")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result = {
        "commit": args.commit or head.stdout.strip(),
        "cpu": cpu_summary(),
        "else_running": args.else_running,
        **figures(Path(args.family), Path(args.single), [Path(c) for c in args.compare]),
    }
    print_figures(result)
    write_result(result, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
