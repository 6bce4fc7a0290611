"""A finished family's speed-ups re-timed with more rounds: every frontier point on the chosen runtimes, paired
against the PyTorch original in one process.

A family's own bench takes `bench.rounds` (3 in the MPNet recipe) interleaved rounds; on a noisy machine three do not
settle a speed-up (members have timed 2.7x in one round and 5.9x in the next). This script reads the run's
`report.json` frontier, loads each point's model (members, their layer-drop baselines, references, the original's
exports) from the run directory and the original from the run's cached base fine-tune (or `--original`), and times
them all together with `compressor.bench.measure_throughput` (interleaved rounds, rotating order), at the run's
batch and length unless given. Prints, per point, the paired median speed-up over the PyTorch original, its spread,
and the run's own figure beside it; for members on the budget's runtime, whether within 10% of their target.

Usage (machine to itself):
    .venv/bin/python benchmarks/retime_family.py --run runs/mpnet_rt_family --runtimes pytorch --rounds 7 \
        --else-running "nothing" → benchmarks/results/retime_family.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
# Its sibling scripts after the packages: Python puts a script's own directory first, where benchmarks/openvino.py
# would shadow the openvino package the OpenVINO candidates import.
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor import bench  # noqa: E402
from compressor.core.candidates import ORIGINAL_NAME  # noqa: E402
from compressor.pruning.budget import within_target  # noqa: E402
from compressor.pruning.deployed import as_deployed  # noqa: E402
from compressor.report.schema import RunReport  # noqa: E402
from compressor.surgery.checkpoint import load_pruned  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "retime_family.json"


def original_dir(report: RunReport, given: Path | None) -> Path:
    """The run's original: `given`, else the base fine-tune the run cached (its report names where)."""
    cached = (report.base_finetune or {}).get("cached")
    path = given or (Path(cached) if cached else None)
    if path is None or not path.is_dir():
        raise SystemExit(f"--original: expected the run's original model directory, got {path}")
    return path


def points(report: RunReport, run: Path, runtimes: list[str]) -> list[dict]:
    """The frontier rows on `runtimes` that have a model in the run directory (the original's PyTorch row aside)."""
    rows = [r.dump() for r in report.frontier_rows()]
    return [r for r in rows if r["runtime"] in runtimes and r["path"] and (run / r["path"]).exists()]


def candidates(rows: list[dict], run: Path, original: Path, seq: int) -> list:
    """The original (PyTorch, deployed attention) first, then each row's model built for its runtime."""
    model = as_deployed(load_pruned(original, attn_implementation="eager"))
    first = bench.runtime_candidate(ORIGINAL_NAME, "pytorch", model, seq)
    return [first] + [bench.runtime_candidate(r["name"], r["runtime"], run / r["path"], seq, None, first) for r in rows]


def targets(report: RunReport) -> tuple[dict[str, float], str | None]:
    """Each member's label and target speed-up, and the runtime the targets are on (a speed-up budget's)."""
    on = report.family.runtime if report.family is not None else (report.budget or {}).get("runtime")
    return {m.label: m.target for m in report.members()}, on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--original", type=Path, default=None, help="the original model dir (default: the cache's)")
    parser.add_argument("--runtimes", default="pytorch", help="comma-separated runtimes of the points to re-time")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--else-running", default="", help="what else ran on the machine while measuring")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    report = RunReport.read(args.run / "report.json")
    spec = (report.bench or {}).get("setup", {})
    batch = args.batch_size or (spec.get("batch_sizes") or [32])[0]
    seq = args.seq_len or (spec.get("seq_lens") or [64])[0]
    rows = points(report, args.run, args.runtimes.split(","))
    cands = candidates(rows, args.run, original_dir(report, args.original), seq)
    started = time.perf_counter()
    throughput = bench.measure_throughput(cands, [batch], [seq], args.rounds, 2, 1.0)
    paired = bench.paired_speedups(throughput, ORIGINAL_NAME)
    goal, on = targets(report)
    out_rows = []
    for r in rows:
        s = paired[r["name"]][str(seq)][str(batch)]
        target = goal.get(r["model"]) if r["role"] == "member" and r["runtime"] == on else None
        out_rows.append({
            "name": r["name"], "role": r["role"], "runtime": r["runtime"], "target": target,
            "speedup": {k: s[k] for k in ("median", "q1", "q3", "min", "max")}, "per_round": s["per_round"],
            "run_bench_speedup": r["speedup"], "accuracy": r["accuracy"],
            "within_10pct": None if target is None else within_target(s["median"], target),
        })  # fmt: skip
    result = {
        "figure": f"the family's points re-timed, {args.rounds} interleaved rounds, batch {batch} x {seq} tokens",
        "run": args.run.name,
        **measured_on(args.else_running, started),
        "setup": throughput["setup"],
        "rows": out_rows,
    }
    print(f"cpu: {result['cpu_identity']}; {args.rounds} rounds, batch {batch} x {seq}")
    for r in sorted(out_rows, key=lambda r: r["speedup"]["median"]):
        s, within = r["speedup"], "" if r["within_10pct"] is None else f", within 10% of {r['target']:g}x: "
        within += "" if r["within_10pct"] is None else str(r["within_10pct"])
        print(f"  {r['name']}: {s['median']:.2f}x (rounds {s['min']:.2f}-{s['max']:.2f}; run's bench "
              f"{r['run_bench_speedup']:.2f}x), test {100 * r['accuracy']:.2f}{within}")  # fmt: skip
    write_result(result, args.out)


if __name__ == "__main__":
    main()
