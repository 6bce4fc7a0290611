"""The one writer of a run's `report.md`: a family's (its frontier first, `report.family`) or a one-target run's
(`report.summary`), rendered from the typed report (`report.schema.RunReport`) that `report.json` is written from,
after completing it with the recommendation and the distillation settings."""

from __future__ import annotations

from pathlib import Path

from compressor.bench.plots import plot_frontier
from compressor.core import atomic
from compressor.report.family import FRONTIER_PNG, render_family
from compressor.report.recommendation import recommendation
from compressor.report.schema import RunReport
from compressor.report.summary import distillation, render


def write_report(report: dict, out: Path) -> RunReport:
    """Check the assembled `report` against `RunReport` and write `out/report.md` (and a family's frontier chart);
    returns the typed report for report.json. Fills `distillation` and `recommendation`: `bench.frontier.pick`, the
    call `compressor pick` makes, chosen on validation (a family's is its `pick`; a one-target run's is the same
    call on its frontier with the choices it passed over and why, `recommendation.recommendation`)."""
    family = report.get("family")
    report.setdefault("distillation", distillation(report))
    report.setdefault("recommendation", family.get("pick") if family is not None else recommendation(report))
    typed = RunReport.of(report)
    rows = [row.dump() for row in typed.frontier_rows()]
    if typed.family is not None and rows:
        plot_frontier(rows, Path(out) / FRONTIER_PNG)
    path = Path(out) / "report.md"
    atomic.write_text(path, render_family(typed) if typed.family is not None else render(typed))
    return typed
