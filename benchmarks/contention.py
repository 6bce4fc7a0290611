"""What a busy neighbour does to a paired speed-up, and whether timing's wait for the CPU (`core.contention`) undoes
it: a finished run's member checked against its original (`compressor.bench.paired_check`, what a step's
calibration and the run's budget check measure) alone, then beside a process spinning on one core with no waiting
(`COMPRESSOR_TIMING_WAIT_S=0`: the reading a run took before the wait existed), then beside one that stops after
`--neighbour-s` seconds with the wait on.

A pruning step acts on its measured speed-up (gives units back when past its target, takes more when short), so a
reading a neighbour moved changes which units a member keeps. Each stage records the median, the per-round spread
and what the timing logged about its neighbours.

Usage (machine to itself, the neighbour aside):
    .venv/bin/python benchmarks/contention.py --run runs/mpnet_rt_family --member 7x --else-running "nothing" \
        → benchmarks/results/contention.json
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from budget_check import check_parser, load_run, pairs  # noqa: E402
from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor import bench  # noqa: E402
from compressor.core.contention import WAIT_ENV  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "contention.json"
SPIN = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass"


class Lines(logging.Handler):
    """The timing's log lines about its neighbours, kept."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("timing:"):
            self.lines.append(record.getMessage())


def check(member, original, shape: tuple, wait_s: float, neighbour_s: float | None, lines: Lines) -> dict:
    """One paired check with `wait_s` of waiting allowed, beside a one-core spinner for `neighbour_s` (None: alone)."""
    os.environ[WAIT_ENV] = str(wait_s)
    spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(neighbour_s)]) if neighbour_s else None
    lines.lines.clear()
    started = time.perf_counter()
    try:
        time.sleep(0.5 if spinner else 0)
        row = bench.paired_check(member, original, *shape)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    out = {"median": round(row["median"], 3), "q1": round(row["q1"], 3), "q3": round(row["q3"], 3),
           "seconds": round(time.perf_counter() - started, 1), "logged": list(lines.lines)}  # fmt: skip
    print(f"wait {wait_s:g} s, neighbour {neighbour_s or 'none'}: {out['median']:.2f}x (IQR {out['q1']:.2f}-"
          f"{out['q3']:.2f}) in {out['seconds']} s; {out['logged'] or 'nothing logged'}", flush=True)  # fmt: skip
    return out


def main() -> None:
    parser = check_parser(__doc__, RESULTS)
    parser.add_argument("--member", required=True, help="the member's label (e.g. 7x)")
    parser.add_argument("--neighbour-s", type=float, default=30.0, help="how long the last stage's neighbour spins")
    args = parser.parse_args()
    report, recipe, budget = load_run(args.run)
    _, member, original = next(p for p in pairs(report, args.run, budget.seq_len) if p[0] == args.member)
    shape = (budget.batch_size, budget.seq_len, args.rounds, recipe.bench.min_time_s)
    lines = Lines()
    logging.getLogger("compressor").addHandler(lines)
    logging.getLogger("compressor").setLevel(logging.INFO)
    stages = {
        "alone": check(member, original, shape, 120, None, lines),
        "beside_a_spinner_no_wait": check(member, original, shape, 0, 600, lines),
        "beside_a_spinner_that_stops_waiting": check(member, original, shape, 120, args.neighbour_s, lines),
        "alone_again": check(member, original, shape, 120, None, lines),
    }
    write_result({
        "figure": f"the {args.member} member's paired check alone, beside a one-core spinner without and with the "
        "wait for the CPU, alone again",
        "run": args.run.name, "member": args.member, "runtime": budget.runtime, **measured_on(args.else_running),
        "stages": stages,
    }, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
