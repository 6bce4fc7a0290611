"""A member's speed against a reference model's on the same runtime, the two timed alone: is the pruned model as
fast as the small model it is compared with?

A family's bench times every candidate in each round, and on a noisy machine the member and the reference swap
places between one bench and the next. This script takes the member and the reference from a finished run's
frontier and times them against each other with `compressor.bench.paired_check` (the two alone, interleaved rounds),
on each runtime asked, `--repeats` times. A ratio above 1 means the member is the faster; the accuracy difference on
test is the frontier's.

Usage (machine to itself):
    .venv/bin/python benchmarks/versus_reference.py --run runs/mpnet_rt_family --member 7x --reference minilm-l6 \
        --runtimes pytorch,openvino-int8,onnx-int8 --else-running "nothing" → benchmarks/results/versus_reference.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from budget_check import load_run  # noqa: E402
from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402
from retime_family import candidates, original_dir, points  # noqa: E402

from compressor import bench  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "versus_reference.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--member", required=True, help="a member's label, e.g. 7x")
    parser.add_argument("--reference", required=True, help="a reference's model name on the frontier, e.g. minilm-l6")
    parser.add_argument("--runtimes", default="pytorch")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--else-running", default="", help="what else ran on the machine while measuring")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    report, recipe, budget = load_run(args.run)
    min_time = recipe.bench.min_time_s
    wanted = {args.member, args.reference}
    rows = [r for r in points(report, args.run, args.runtimes.split(",")) if r["model"] in wanted]
    rows = [r for r in rows if r["role"] in ("member", "reference")]
    _, *built = candidates(rows, args.run, original_dir(report, None), budget.seq_len)
    by = {(r["runtime"], r["role"]): (r, c) for r, c in zip(rows, built, strict=True)}
    started, out = time.perf_counter(), []
    for repeat in range(args.repeats):
        for rt in args.runtimes.split(","):
            if (rt, "member") not in by or (rt, "reference") not in by:
                print(f"{rt}: the member or the reference has no point on it; skipped")
                continue
            (m_row, member), (r_row, reference) = by[(rt, "member")], by[(rt, "reference")]
            check = bench.paired_check(member, reference, budget.batch_size, budget.seq_len, args.rounds, min_time)
            points_ahead = 100 * (m_row["accuracy"] - r_row["accuracy"])
            out.append({
                "repeat": repeat, "runtime": rt, "member": m_row["name"], "reference": r_row["name"],
                "member_speed_vs_reference": {k: check[k] for k in ("median", "q1", "q3", "min", "max")},
                "per_round": check["per_round"], "points_ahead": points_ahead,
            })  # fmt: skip
            spread = f"IQR {check['q1']:.2f}-{check['q3']:.2f}"
            print(f"repeat {repeat} {rt}: {m_row['name']} runs {check['median']:.2f}x {r_row['name']}'s speed "
                  f"({spread}), {points_ahead:+.2f} points on test", flush=True)  # fmt: skip
    result = {
        "figure": f"{args.member} vs {args.reference}, the two alone, {args.rounds} rounds x {args.repeats} repeats",
        "run": args.run.name,
        "batch_size": budget.batch_size,
        "seq_len": budget.seq_len,
        **measured_on(args.else_running, started),
        "rows": out,
    }
    write_result(result, args.out)


if __name__ == "__main__":
    main()
