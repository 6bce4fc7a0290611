"""How steady the budget check's verdict is: a finished run's members timed alone against the original on the
budget's runtime (`compressor.bench.paired_check`, what a run now decides "within 10%" with), repeated, beside the
run's own figure (its bench's, for a run made before the check) and each member's step timing.

A family's bench times every candidate in each round, so on a shared machine minutes pass between a member's visit
and the original's; the budget check times the two alone. This script repeats the check `--repeats` times on the
same models, so the spread between repeats (the machine's drift over minutes) shows beside the spread within one.

Usage (machine to itself):
    .venv/bin/python benchmarks/budget_check.py --run runs/mpnet_rt_family --repeats 3 --else-running "nothing" \
        → benchmarks/results/budget_check.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402
from retime_family import candidates, original_dir, points, targets  # noqa: E402

from compressor import bench  # noqa: E402
from compressor.core.outdir import RESOLVED_FILE  # noqa: E402
from compressor.pruning.budget import within_target  # noqa: E402
from compressor.recipe import BudgetSpec, Recipe, load_recipe  # noqa: E402
from compressor.report.schema import RunReport  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "budget_check.json"


def pairs(report: RunReport, run: Path, seq_len: int) -> list[tuple[str, object, object]]:
    """Each member on the budget's runtime, as a candidate, with the original on that runtime (the PyTorch original,
    or its export to the budget's ONNX or OpenVINO variant)."""
    goal, on = targets(report)
    rows = [r for r in points(report, run, [on]) if r["role"] in ("member", "original")]
    first, *built = candidates(rows, run, original_dir(report, None), seq_len)
    by_name = {r["name"]: c for r, c in zip(rows, built, strict=True)}
    original = first if on == "pytorch" else next(by_name[r["name"]] for r in rows if r["role"] == "original")
    members = [r for r in rows if r["role"] == "member" and r["model"] in goal]
    return [(r["model"], by_name[r["name"]], original) for r in sorted(members, key=lambda r: goal[r["model"]])]


def load_run(run: Path) -> tuple[RunReport, Recipe, BudgetSpec]:
    """A finished run's report, resolved recipe and speed-up budget."""
    recipe = load_recipe(run / RESOLVED_FILE)
    return RunReport.read(run / "report.json"), recipe, recipe.prune.resolved_budget


def check_parser(doc: str, out: Path) -> argparse.ArgumentParser:
    """The arguments of a script that checks a finished run's members: `--run`, `--rounds` (per check),
    `--else-running`, `--out` (default `out`); the script adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7, help="rounds per check (prune.budget.check_rounds)")
    parser.add_argument("--else-running", default="", help="what else ran on the machine while measuring")
    parser.add_argument("--out", type=Path, default=out)
    return parser


def print_row(r: dict) -> None:
    s = r["speedup"]
    print(f"repeat {r['repeat']} {r['member']}: {s['median']:.2f}x (IQR {s['q1']:.2f}-{s['q3']:.2f}) vs {r['vs']}, "
          f"within 10% of {r['target']:g}x: {r['within_10pct']}; the run's report {r['run_report_speedup'] or 0:.2f}x, "
          f"at its step {r['at_step_speedup'] or 0:.2f}x", flush=True)  # fmt: skip


def main() -> None:
    parser = check_parser(__doc__, RESULTS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-time-s", type=float, default=None, help="default: the run's bench.min_time_s")
    args = parser.parse_args()
    report, recipe, budget = load_run(args.run)
    batch, seq, min_time = budget.batch_size, budget.seq_len, args.min_time_s or recipe.bench.min_time_s
    members = pairs(report, args.run, seq)
    at_step = {s.get("step"): s.get("measured_speedup") for s in report.dump().get("steps", [])}
    sections = {m.label: m for m in report.members()}
    started, rows = time.perf_counter(), []
    for repeat in range(args.repeats):
        for label, member, original in members:
            check = bench.paired_check(member, original, batch, seq, args.rounds, min_time)
            target = sections[label].target
            rows.append({
                "repeat": repeat, "member": label, "target": target, "vs": check["vs"],
                "speedup": {k: check[k] for k in ("median", "q1", "q3", "min", "max")}, "per_round": check["per_round"],
                "within_10pct": within_target(check["median"], target),
                "run_report_speedup": sections[label].budget.measured_speedup if sections[label].budget else None,
                "at_step_speedup": at_step.get(sections[label].step),
            })  # fmt: skip
            print_row(rows[-1])
    result = {
        "figure": f"each member's budget check, {args.repeats} repeats x {args.rounds} rounds, batch {batch} x {seq}",
        "run": args.run.name,
        "runtime": budget.runtime,
        **measured_on(args.else_running, started),
        "min_time_s": min_time,
        "rows": rows,
    }
    write_result(result, args.out)


if __name__ == "__main__":
    main()
