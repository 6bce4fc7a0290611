"""Importance criteria for heads (and FFN neurons, where declared).

Each module registers itself; importing this package registers them all.
"""

from compressor.pruning.criteria import attribution, baselines, confidence, fisher, l0, taylor  # noqa: F401  (registration)
from compressor.pruning.criteria.registry import (
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
from compressor.recipe.base import CriterionCatalog, register_criteria

register_criteria(CriterionCatalog(check_params, units_of, scoring))

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
