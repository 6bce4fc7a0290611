"""`prune.recovery`: the list of steps that repair the model after each pruning step, as the schema sees them.

A recovery step is one module of `compressor.recovery.steps`; registering it there declares here what the schema
must know of it (`declare`): its name, whether it trains (reads `prune.finetune`) and whether it fits on the
post-training sample (`prune.sample_size`). The schema knows no step by name: a recipe's list is checked against
the declared ones. The four names recipes used before the list form keep working (`LEGACY`), and a list equal to
one of them is still called by it (`recovery_name`: the report's `recovery.mode`, a frontier row's `recovery`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepTraits:
    """What the schema needs to know of one recovery step."""

    trains: bool  # fine-tunes with `prune.finetune` (a recipe listing it needs those settings; not post-training)
    samples: bool  # fits on the `prune.sample_size` examples (the report says how many it read)


LEGACY: dict[str, tuple[str, ...]] = {
    "finetune": ("finetune",),
    "rescale": ("rescale",),
    "rescale_finetune": ("rescale", "finetune"),
    "none": (),
}

_STEPS: dict[str, StepTraits] = {}


def declare(name: str, traits: StepTraits) -> None:
    """Called by `compressor.recovery.steps.register` for every step it registers."""
    _STEPS[name] = traits


def withdraw(name: str) -> None:
    """Forget step `name` (`compressor.recovery.steps.unregister`, for a step registered by a test)."""
    _STEPS.pop(name, None)


def step_names() -> list[str]:
    """The declared steps' names, sorted."""
    if not _STEPS:
        raise RuntimeError("no recovery steps registered with the recipe schema: import compressor.recovery.steps")
    return sorted(_STEPS)


def traits(name: str) -> StepTraits:
    """What step `name` needs (a name not declared raises as `parse_steps` would)."""
    if name not in step_names():
        raise ValueError(_unknown(name))
    return _STEPS[name]


def parse_steps(value: Any) -> Any:
    """`prune.recovery` as given → a list of step names: an old name (`finetune`, `rescale`, `rescale_finetune`,
    `none`) becomes its list; a list must name declared steps, each once. Anything else is left for the field's type
    to refuse."""
    if isinstance(value, str):
        if value not in LEGACY:
            raise ValueError(_unknown(value))
        return list(LEGACY[value])
    if isinstance(value, list | tuple):
        for name in value:
            if not isinstance(name, str) or name not in step_names():
                raise ValueError(_unknown(name))
        if len(set(value)) != len(value):
            raise ValueError(f"expected each step once, got {list(value)}")
        return list(value)
    return value


def recovery_name(steps: list[str]) -> str:
    """The name of a list of steps: its old name where it has one (`rescale_finetune` for [rescale, finetune]),
    else the steps joined by '+'."""
    return next((name for name, listed in LEGACY.items() if list(listed) == list(steps)), "+".join(steps))


def steps_of(name: str) -> list[str]:
    """The steps a recovery name stands for (`recovery_name` read back, e.g. from a report)."""
    return list(LEGACY[name]) if name in LEGACY else name.split("+")


def name_trains(name: str) -> bool:
    """Whether the recovery called `name` fine-tunes: one of its steps trains (one not registered here, from
    another installation's report, is taken not to)."""
    return any(_STEPS[step].trains for step in steps_of(name) if step in _STEPS)


def _unknown(name: Any) -> str:
    """The one line that refuses a step name, with every declared step and the old names."""
    shown = f"'{name}'" if isinstance(name, str) else repr(name)
    return (
        f"unknown recovery step {shown}; expected a list of steps from {step_names()} (or one of the names "
        f"{list(LEGACY)})"
    )
