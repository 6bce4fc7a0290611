"""compressor: remove attention heads from transformer classifiers and ship the result.

The Python API (imported lazily; `import compressor` registers the runtimes' engines, `compressor.deploy.engines`,
and loads the recipe schema and the criteria and recovery steps it validates against):
`compressor.prune(model, tokenizer, train, config, validation=..., hook=...)` prunes a model held in memory and
returns a `PruneResult` (writes no files); `compressor.load_pruned(dir)` and `compressor.save_pruned(model, dir)`
read and write pruned checkpoints; `PruneSpec` and `TrainSpec` are the recipe's `prune` and fine-tune sections.
"""

from __future__ import annotations

from compressor.core import compat as _compat
from compressor.core.lazy import lazy_attributes
from compressor.deploy import engines as _engines  # noqa: F401  registers the runtimes before anything reads them

if _compat.runnable():  # on an unsupported stack nothing heavy is imported: the CLI and API report it as one line
    from compressor.pruning import criteria as _criteria  # noqa: F401  registers the criteria with the recipe schema
    from compressor.recovery import steps as _steps  # noqa: F401  registers the recovery steps with it too

__version__ = "0.1.0"
__all__ = ["PruneResult", "PruneSpec", "TrainSpec", "__version__", "load_pruned", "prune", "save_pruned"]
_LAZY = {
    "load_pruned": "compressor.surgery.checkpoint",
    "save_pruned": "compressor.surgery.checkpoint",
    "prune": "compressor.recovery.loop",
    "PruneResult": "compressor.recovery.loop",
    "PruneSpec": "compressor.recipe",
    "TrainSpec": "compressor.recipe",
}

__getattr__ = lazy_attributes(__name__, _LAZY, before=_compat.require_supported)
