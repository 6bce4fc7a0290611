"""The one writer of a run's `report.md`: a family's (its frontier first, `report.family`) or a one-target run's
(`report.summary`), read from the same dict as `report.json`, which it completes with the recommendation and the
distillation settings."""

from __future__ import annotations

from pathlib import Path

from compressor.bench.plots import plot_frontier
from compressor.core import atomic
from compressor.report.family import FRONTIER_PNG, render_family
from compressor.report.summary import distillation, recommendation, render


def write_report(report: dict, out: Path) -> Path:
    """Write `out/report.md` (and a family's frontier chart); fills `report["distillation"]` and
    `report["recommendation"]` (a family's: its pick, the call `compressor pick` makes; a one-target run's: the
    fastest shipped variant passing every gate, `summary.recommendation`) for report.json."""
    family = report.get("family")
    report.setdefault("distillation", distillation(report))
    report.setdefault("recommendation", family.get("pick") if family is not None else recommendation(report))
    if family is not None and family.get("frontier"):
        plot_frontier(family["frontier"], Path(out) / FRONTIER_PNG)
    path = Path(out) / "report.md"
    atomic.write_text(path, render_family(report) if family is not None else render(report))
    return path
