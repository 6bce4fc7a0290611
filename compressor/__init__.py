"""compressor: remove attention heads from transformer classifiers and ship the result.

Only the checkpoint entry points live here (imported lazily, so `import compressor` stays cheap):
`compressor.load_pruned(dir)` and `compressor.save_pruned(model, dir, ...)`.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "load_pruned", "save_pruned"]


def __getattr__(name: str):
    if name in ("load_pruned", "save_pruned"):
        from compressor import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'compressor' has no attribute {name!r}")
