"""One registry for every recovery step: what repairs the model after each pruning step (`prune.recovery`).

A step is a class registered with `@register("name", trains=..., samples=...)`. The loop makes one of each listed
step per run, `Step(loop)` with the loop's fixed inputs (`compressor.recovery.choice.LoopInputs`; prepare anything
the step reuses there, once), and calls it after every selection, in the recipe's order: `step_(masks, step)` with
the masks after the selection and the 0-based step number returns the step log's entry under the step's name (the
loop then validates into `val_after_<name>`). Registering declares the step to the recipe schema
(`compressor.recipe.recovery`): `trains` (it fine-tunes with `prune.finetune`, so a recipe listing it needs those
settings and is not post-training) and `samples` (it fits on the `prune.sample_size` examples). A step reads its
settings from the recipe's `prune` section; it has none of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from compressor.recipe.recovery import StepTraits, declare, step_names, withdraw

if TYPE_CHECKING:
    from compressor.pruning.units import Masks
    from compressor.recovery.choice import LoopInputs


class RecoveryStep(Protocol):
    """One step made for one run (`Step(loop)`), called after every pruning step's selection."""

    def __call__(self, masks: Masks, step: int) -> dict:
        """Repair `loop.model` for the units `masks` keeps; the step log's entry under the step's name."""


StepClass = Callable[["LoopInputs"], RecoveryStep]
_REGISTRY: dict[str, StepClass] = {}


def register(name: str, *, trains: bool = False, samples: bool = False) -> Callable[[StepClass], StepClass]:
    """Decorator: make the step class available to recipes as `prune.recovery: [..., name, ...]`."""

    def wrap(cls: StepClass) -> StepClass:
        if name in _REGISTRY:
            raise ValueError(f"recovery step '{name}' registered twice")
        _REGISTRY[name] = cls
        declare(name, StepTraits(trains=trains, samples=samples))
        return cls

    return wrap


def unregister(name: str) -> None:
    """Forget step `name` (a step a test registered for itself)."""
    _REGISTRY.pop(name, None)
    withdraw(name)


def available() -> list[str]:
    """The registered steps' names, sorted."""
    return step_names()


def make(names: list[str], loop: LoopInputs) -> list[RecoveryStep]:
    """The steps `names` lists, in order, each made for this run (what a step prepares once happens here)."""
    for name in names:
        if name not in _REGISTRY:
            raise ValueError(f"prune.recovery: unknown recovery step '{name}'; expected one of {available()}")
    return [_REGISTRY[name](loop) for name in names]
