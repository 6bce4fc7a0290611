"""Prunable units beside attention heads: FFN neurons, and whole layers once a layer has neither left.

A *unit plan* is `{"heads": {layer: [original head ids]}, "neurons": {layer: [original neuron ids]}}`; a layer
whose heads and neurons are all in the plan is removed whole (identity) by surgery and skipped by masking, so
`masked == pruned == ONNX` holds for every plan. These helpers are what the pipeline calls: the alive masks to
score and select from, the plan of what is dead, and the surgery that applies it. `recovery.loop.prune` drives them
through `compressor.pruning.budget` (which picks each step's units under a head, FLOP or speed-up budget):

    alive = Masks.full(model, spec.units).alive()                # {"heads": .., "neurons": ..}
    budget = budget.plan_budget(model, spec)                     # per-step goals (+ latency table for speed-ups)
    scores = score_all(spec.criterion.name, model, alive, batches, spec.criterion.params)
    plan = budget.select(step, scores, alive)                    # per FLOP or per predicted ms saved
    alive = apply_plan_to_masks(plan, alive)
    with masking.gated(model, alive["heads"].float(), alive["neurons"].float()): ...  # fine-tune, masked
    apply_unit_plan(model, masks_to_plan(alive))                 # at the end: physical removal
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from compressor.surgery.arch import neuron_presence_mask, presence_mask
from compressor.surgery.slicing import prune_heads, prune_neurons

UNIT_KINDS = ("heads", "neurons")
UnitPlan = dict[str, dict[int, list[int]]]


def alive_units(model: nn.Module) -> dict[str, torch.Tensor]:
    """{"heads": [layers, heads] bool, "neurons": [layers, FFN width] bool}: units still present in `model`."""
    return {"heads": presence_mask(model), "neurons": neuron_presence_mask(model)}


def apply_plan_to_masks(plan: UnitPlan, alive: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`alive` with every unit of `plan` switched off (new tensors)."""
    out = {kind: mask.clone() for kind, mask in alive.items()}
    for kind, layers in plan.items():
        for layer, ids in layers.items():
            out[kind][layer, ids] = False
    return out


def masks_to_plan(alive: dict[str, torch.Tensor]) -> UnitPlan:
    """The cumulative unit plan (original ids) of every dead unit."""
    return {
        kind: {layer: [int(i) for i in (~row).nonzero().flatten()] for layer, row in enumerate(mask) if (~row).any()}
        for kind, mask in alive.items()
    }


def apply_unit_plan(model: nn.Module, plan: UnitPlan) -> nn.Module:
    """Physically remove every unit of `plan` from `model` in place (layers left empty are removed whole)."""
    prune_heads(model, plan.get("heads", {}))
    return prune_neurons(model, plan.get("neurons", {}))


def pruned_units_copy(model: nn.Module, plan: UnitPlan) -> nn.Module:
    """`apply_unit_plan` on a deep copy, leaving `model` untouched."""
    return apply_unit_plan(copy.deepcopy(model), plan)


def score_all(
    name: str,
    model: nn.Module,
    alive: dict[str, torch.Tensor],
    batches: Sequence[dict[str, torch.Tensor]],
    params: dict[str, Any] | None = None,
    **context: Any,
) -> dict[str, torch.Tensor]:
    """Scores of criterion `name` for every unit kind in `alive`, each with the other kinds' masks held fixed.

    `context` is passed on to `criteria.ScoreContext` (accelerator, seed, train_batches, target_remove, extras);
    a `target_remove` given per kind (`{kind: count}`, as `Budget.target_remove` returns it) reaches each kind's
    scoring as that kind's count. Returns `{kind: float [layers, units] on CPU}`, dead units -inf; a kind the
    criterion cannot score raises.
    """
    from compressor.pruning import criteria

    out = {}
    per_kind = context.pop("target_remove", 0)
    for kind, mask in alive.items():
        others = {k: m for k, m in alive.items() if k != kind}
        remove = per_kind.get(kind, 0) if isinstance(per_kind, Mapping) else per_kind
        ctx = criteria.ScoreContext(
            model=model, alive=mask, batches=batches, unit=kind, masks=others, target_remove=remove, **context
        )
        out[kind] = criteria.score_units(name, ctx, params)
    return out
