"""Head-importance criteria. Each module registers itself; importing this package registers them all."""

from compressor.criteria import attribution, baselines, confidence, l0, taylor  # noqa: F401  (registration)
from compressor.criteria.registry import ScoreContext, available, check_params, get, register, score_heads

__all__ = ["ScoreContext", "available", "check_params", "get", "register", "score_heads"]
