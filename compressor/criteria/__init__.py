"""Importance criteria for heads (and FFN neurons, where declared).

Each module registers itself; importing this package registers them all.
"""

from compressor.criteria import attribution, baselines, confidence, l0, taylor  # noqa: F401  (registration)
from compressor.criteria.registry import (
    ScoreContext,
    available,
    check_params,
    get,
    register,
    score_heads,
    score_units,
    scoring,
    units_of,
)

__all__ = [
    "ScoreContext",
    "available",
    "check_params",
    "get",
    "register",
    "score_heads",
    "score_units",
    "scoring",
    "units_of",
]
