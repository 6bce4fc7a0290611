"""Metric modules shipped inside the package (`evaluate.load("accuracy")` would fetch from the hub)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import evaluate

METRICS_DIR = Path(__file__).parent


def available() -> list[str]:
    return sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").exists())


@cache
def load_metric(name: str) -> evaluate.EvaluationModule:
    """Load a shipped metric module by name, offline."""
    if name not in available():
        raise ValueError(f"metric: unknown metric '{name}'; expected one of {available()}")
    return evaluate.load(str(METRICS_DIR / name))
