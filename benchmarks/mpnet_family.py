"""Issue 37's figures from a finished run with a reference: the MPNet-base family (or one member) against MiniLM-L6.

Reads the run's `report.json` (through `compressor.report.schema.RunReport`; a one-target run is a family of one, as
recipes/mpnet_rt_7x_last.yaml's) and the `/usr/bin/time -v` log of the run, and prints, each against the issue's goal:
- wall time (≤ 90 min from an empty cache; `--time-log`) and peak RSS;
- per member: target, speed-up its budget check measured (the bench's, in a run made before the check), within 10%
  of the target or not, test accuracy, and the layer-drop baseline at its FLOPs (the member ahead, McNemar's p);
- per reference point (PyTorch, int8): the most accurate member at equal or higher measured speed and by how many
  points it beats the reference (the goal: ≥ 1.0 point, in PyTorch and after int8 on both sides), with McNemar's p;
- `compressor pick --max-drop 1.0` on the frontier.
Writes the figures with the CPU (its int8 features) and the run's commit to `--out`.

Usage (after `compressor run recipes/mpnet_rt_family.yaml` under `/usr/bin/time -v ... 2> LOG`, machine to itself):
    .venv/bin/python benchmarks/mpnet_family.py --run-dir runs/mpnet_rt_family --time-log LOG \
        --else-running "nothing" → benchmarks/results/mpnet_family.json
    .venv/bin/python benchmarks/mpnet_family.py --run-dir runs/mpnet_rt_7x_last --time-log LOG \
        --else-running "..." --out benchmarks/results/mpnet_7x_last.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts (base_run, family), after the packages

from base_run import read_time_log  # noqa: E402
from family import write_result  # noqa: E402
from provenance import commit  # noqa: E402

from compressor.bench.frontier import pick  # noqa: E402
from compressor.core.machine import cpu_summary  # noqa: E402
from compressor.report.schema import RunReport  # noqa: E402

GOALS = {"wall_min": 90.0, "within": 0.10, "beats_reference_points": 1.0, "pick_max_drop": 1.0}


def time_log(path: str | None) -> dict:
    """Wall seconds and peak RSS (MB) from the run's `/usr/bin/time -v` log (`base_run.read_time_log`); None
    without one."""
    if path is None:
        return {"wall_s": None, "peak_rss_mb": None}
    measured = read_time_log(Path(path))
    return {"wall_s": measured["wall_s"], "peak_rss_mb": measured["peak_rss_kb"] / 1024}


def member_rows(report: RunReport) -> list[dict]:
    """Per member: target, measured speed-up, within 10%, test accuracy, the layer-drop baseline's."""
    out = []
    for m in report.members():
        base = m.baseline or {}
        out.append({
            "label": m.label, "target": m.target, "step": m.step,
            "measured_speedup": m.budget.measured_speedup if m.budget else None,
            "within_10pct": m.budget.within_10pct if m.budget else None,
            "test_accuracy": m.pruned.test.accuracy, "heads": m.pruned.heads_left, "ffn_neurons": m.pruned.ffn_neurons,
            "layers": m.pruned.layers, "flop_ratio": m.pruned.flop_ratio,
            "layer_drop_accuracy": base.get("baseline_accuracy"),
            "member_minus_layer_drop_points": None if not base else 100 * base["pruned_minus_baseline"],
            "layer_drop_mcnemar_p": base.get("mcnemar_p"),
        })  # fmt: skip
    return out


def reference_rows(report: RunReport) -> list[dict]:
    """Per reference point: the best member at ≥ its speed (any runtime, same runtime), points and p."""
    rows = []
    for e in (report.family or report).versus_references or []:
        rows.append({k: e[k] for k in ("name", "runtime", "speedup", "accuracy", "best", "best_same_runtime")})
    return rows


def step_rows(report: RunReport) -> list[dict]:
    """Per pruning step: its measured speed-up, the members it closed, what it gave back (a landing past a member's
    target: units, or a whole layer) and its seconds."""
    rows = []
    for step in report.steps or []:
        given = [a for a in step.get("allocation", []) if a.get("kind") in ("given back", "layer given back")]
        row = {k: step.get(k) for k in ("step", "measured_speedup", "members", "seconds")}
        rows.append(row | {"given_back": given})
    return rows


def _p(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _best(best: dict | None) -> str:
    if best is None:
        return "none as fast"
    pts = f"{best['points']:+.2f} points, p {_p(best['mcnemar_p'])}"
    return f"{best['name']} {best['speedup']:.2f}x {100 * best['accuracy']:.2f} ({pts})"


def show(figures: dict) -> str:
    """The printed figures, each against its goal."""
    lines, wall = [], figures["wall"]["wall_s"]
    if wall is not None:
        met = "met" if wall / 60 <= GOALS["wall_min"] else "MISSED"
        if figures.get("cache_at_start", "empty") != "empty":  # the goal is from an empty cache
            met = f"not comparable: the cache held {figures['cache_at_start']}"
        rss = figures["wall"]["peak_rss_mb"]
        lines.append(
            f"wall time {wall / 60:.1f} min (goal ≤ {GOALS['wall_min']:.0f} min: {met}), peak RSS {rss:.0f} MB"
        )
    lines.append(f"fine-tunes in {figures['mixed_precision']}; original test accuracy "
                 f"{100 * figures['original_accuracy']:.2f}")  # fmt: skip
    for step in figures["steps"]:
        for given in step["given_back"]:
            lines.append(f"  step {step['step']} measured {given['measured_before']:.2f}x, gave back {given['units']} "
                         f"units, then {step['measured_speedup']:.2f}x")  # fmt: skip
    for m in figures["members"]:
        base, diff = m["layer_drop_accuracy"], m["member_minus_layer_drop_points"]
        vs = "–" if base is None else f"{100 * base:.2f} ({diff:+.2f}, p {_p(m['layer_drop_mcnemar_p'])})"
        speed = f"{m['measured_speedup'] or 0:.2f}x measured (within 10%: {m['within_10pct']})"
        lines.append(f"  member {m['label']}: {speed}, test {100 * m['test_accuracy']:.2f}, layer-drop {vs}")
    for r in figures["references"]:
        for key in ("best", "best_same_runtime"):
            head = f"  reference {r['name']} {r['speedup']:.2f}x {100 * r['accuracy']:.2f}"
            lines.append(f"{head} — {key}: {_best(r[key])}")
    chosen = figures["pick_1pt"]
    what = "none" if chosen is None else f"{chosen['name']} {chosen['speedup']:.2f}x {100 * chosen['accuracy']:.2f}"
    lines.append(f"pick --max-drop 1.0: {what}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default=str(ROOT / "runs" / "mpnet_rt_family"))
    parser.add_argument("--time-log", help="the /usr/bin/time -v log of the run")
    parser.add_argument("--else-running", required=True, help="what else ran on the machine meanwhile")
    parser.add_argument("--commit", help="the commit the run ran at (default: this checkout's HEAD)")
    parser.add_argument("--cache", default="empty", help="what COMPRESSOR_CACHE held when the run started")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mpnet_family.json"))
    args = parser.parse_args(argv)
    report = RunReport.read(Path(args.run_dir) / "report.json")
    rows = [r.dump() for r in report.frontier_rows()]
    figures = {
        "command": f"compressor run recipes/{report.name}.yaml",
        "cache_at_start": args.cache,
        "commit": args.commit or commit(),
        "cpu": cpu_summary(),
        "else_running": args.else_running,
        "goals": GOALS,
        "wall": time_log(args.time_log),
        "mixed_precision": report.mixed_precision or "no",  # what the fine-tunes ran in
        "timings": report.timings,
        "steps": step_rows(report),
        "original_accuracy": report.original.test.accuracy,
        "members": member_rows(report),
        "references": reference_rows(report),
        "pick_1pt": pick(rows, GOALS["pick_max_drop"]),
        "frontier": rows,
    }
    print(show(figures))
    write_result(figures, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
