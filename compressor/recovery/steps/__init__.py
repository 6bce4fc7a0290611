"""Recovery steps: what repairs the model after each pruning step, one module each (`prune.recovery` lists them).

Each module registers itself (`registry.register`); importing this package registers them all, and declares them
to the recipe schema. Adding a step is one module here, imported below.
"""

from compressor.recovery.steps import finetune, rescale  # noqa: F401  (registration)
from compressor.recovery.steps.registry import RecoveryStep, available, make, register, unregister

__all__ = ["RecoveryStep", "available", "make", "register", "unregister"]
