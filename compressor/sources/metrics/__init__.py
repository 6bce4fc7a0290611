"""Metric modules shipped inside the package (`evaluate.load("accuracy")` would fetch from the hub)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import evaluate

METRICS_DIR = Path(__file__).parent


def label_metric_info(description: str, inputs_description: str) -> evaluate.MetricInfo:
    """The `MetricInfo` of a shipped metric over integer class labels (what every module's `_info` returns)."""
    import datasets

    return evaluate.MetricInfo(
        description=description,
        citation="",
        inputs_description=inputs_description,
        features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
    )


def available() -> list[str]:
    return sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").exists())


@cache
def load_metric(name: str) -> evaluate.EvaluationModule:
    """Load a shipped metric module by name, offline."""
    if name not in available():
        raise ValueError(f"metric: unknown metric '{name}'; expected one of {available()}")
    return evaluate.load(str(METRICS_DIR / name))
