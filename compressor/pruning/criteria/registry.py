"""One registry and one signature for every importance criterion (heads, and FFN neurons where declared).

A criterion is a plain function `fn(ctx: ScoreContext, *, <params>) -> Tensor[layers, units]` (higher = keep),
registered with `@register("name", units=(...))`: `units` declares the unit kinds it can score ("heads", and
"neurons" for criteria that read `ctx.unit`), so a recipe asking for another kind fails at validate.
Its keyword-only parameters *are* its recipe schema: `check_params` compares a
recipe's `params` against the signature, so a typo fails at `compressor validate` before any model loads.
`score_units` (alias `score_heads`) is the only entry point callers use: it runs the criterion and sets dead
units to -inf.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from torch import nn

Criterion = Callable[..., torch.Tensor]
_REGISTRY: dict[str, Criterion] = {}
_UNITS: dict[str, tuple[str, ...]] = {}


@dataclass(frozen=True)
class ScoreContext:
    """Everything a criterion may use.

    model: the classifier (eval mode unless the criterion trains), attention implementation 'eager'.
    alive: [layers, units] bool over original ids of the kind being scored; False for units removed or masked.
    unit: the kind being scored, "heads" ([layers, heads]) or "neurons" ([layers, FFN width]).
    masks: alive masks of the *other* unit kinds, held fixed while scoring (`gated` applies them).
    batches: tokenised batches (dicts of tensors with `labels`) to score on.
    accelerator: an `accelerate.Accelerator` (device placement, distributed reductions), or None.
    target_remove: how many more units of kind `unit` the caller will remove after this scoring (lets `l0` aim
    its sparsity).
    train_batches: a factory of training batches, for criteria that learn (e.g. `l0`).
    seed: for criteria with randomness.
    """

    model: nn.Module
    alive: torch.Tensor
    batches: Sequence[dict[str, torch.Tensor]]
    accelerator: Any = None
    target_remove: int = 0
    train_batches: Callable[[], Sequence[dict[str, torch.Tensor]]] | None = None
    seed: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    unit: str = "heads"
    masks: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def gates(self) -> torch.Tensor:
        """Gate tensor equal to the current mask (1 alive, 0 dead), float, on the model's device."""
        return self.alive.to(self.device, torch.float32).clone()

    def gated(self, gates: torch.Tensor) -> AbstractContextManager:
        """`masking.gated` with `gates` on the scored unit kind and the fixed `masks` on the others."""
        from compressor.pruning.masking import gated

        def pick(kind: str) -> torch.Tensor | None:
            if kind == self.unit:
                return gates
            mask = self.masks.get(kind)
            return None if mask is None else mask.to(self.device, torch.float32)

        return gated(self.model, pick("heads"), pick("neurons"))


def register(name: str, units: tuple[str, ...] = ("heads",)) -> Callable[[Criterion], Criterion]:
    """Decorator: make `fn` available to recipes as `criterion: {name: ...}`, for the unit kinds in `units`."""

    def wrap(fn: Criterion) -> Criterion:
        if name in _REGISTRY:
            raise ValueError(f"criterion '{name}' registered twice")
        _REGISTRY[name] = fn
        _UNITS[name] = tuple(units)
        return fn

    return wrap


def available() -> list[str]:
    return sorted(_REGISTRY)


def units_of(name: str) -> tuple[str, ...]:
    """The unit kinds criterion `name` can score (unknown names raise as `get` does)."""
    get(name)
    return _UNITS[name]


def scoring(unit: str) -> list[str]:
    """Names of the criteria that can score `unit`."""
    return sorted(name for name, units in _UNITS.items() if unit in units)


def get(name: str) -> Criterion:
    if name not in _REGISTRY:
        raise ValueError(f"prune.criterion.name: unknown criterion '{name}'; expected one of {available()}")
    return _REGISTRY[name]


def check_params(name: str, params: dict[str, Any]) -> None:
    """Raise ValueError naming the first parameter the criterion does not take, or whose value is wrong.

    The criterion's keyword-only signature is its schema: a strict pydantic model is built from it, so types,
    `Literal` choices and `Annotated[..., Field(ge=...)]` bounds are all checked here, at `validate` time.
    """
    from compressor.recipe.yamlio import format_validation_error, short, short_key

    model = _params_model(name)
    try:
        model.model_validate(params)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            accepted = sorted(model.model_fields)
            raise ValueError(
                f"prune.criterion.params.{short_key(key)}: unknown parameter for '{name}'; expected one of {accepted}"
            ) from None
        if first["type"] == "literal_error":
            choices = typing.get_args(model.model_fields[key].annotation)
            raise ValueError(
                f"prune.criterion.params.{key}: expected one of {list(choices)}, got {short(params[key])}"
            ) from None
        raise ValueError(format_validation_error(err, prefix="prune.criterion.params.")) from None


@functools.cache
def _params_model(name: str) -> type[BaseModel]:
    """A strict pydantic model of criterion `name`'s keyword-only parameters (unknown keys forbidden)."""
    fn = get(name)
    hints = typing.get_type_hints(fn, include_extras=True)
    fields = {
        p.name: (hints.get(p.name, Any), ... if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    return create_model(
        f"{name}_params", __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False), **fields
    )


def score_units(name: str, ctx: ScoreContext, params: dict[str, Any] | None = None) -> torch.Tensor:
    """Run criterion `name` on `ctx.unit` and return float [layers, units] scores on CPU, -inf for dead units.

    A criterion that cannot score `ctx.unit` raises ValueError naming the criteria that can.
    """
    params = params or {}
    check_params(name, params)
    if ctx.unit not in units_of(name):
        raise ValueError(f"prune.criterion.name: '{name}' cannot score {ctx.unit}; expected one of {scoring(ctx.unit)}")
    scores = get(name)(ctx, **params).detach().float().cpu()
    if tuple(scores.shape) != tuple(ctx.alive.shape):
        raise RuntimeError(
            f"criterion '{name}' returned shape {tuple(scores.shape)}, expected {tuple(ctx.alive.shape)}"
        )
    return scores.masked_fill(~ctx.alive.cpu(), float("-inf"))


def mean_over_processes(total: torch.Tensor, count: int, accelerator: Any) -> torch.Tensor:
    """`total / count` with both summed over processes first (a no-op without a multi-process accelerator)."""
    if accelerator is not None and accelerator.num_processes > 1:
        total = accelerator.reduce(total, reduction="sum")
        count = int(accelerator.reduce(torch.tensor(count, device=total.device), reduction="sum"))
    return total / max(count, 1)


score_heads = score_units  # the head-only name, kept for existing callers
