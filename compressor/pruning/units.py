"""Prunable units beside attention heads: FFN neurons, and whole layers once a layer has neither left.

A *unit plan* is `{"heads": {layer: [original head ids]}, "neurons": {layer: [original neuron ids]}}`; a layer
whose heads and neurons are all in the plan is removed whole (identity) by surgery and skipped by masking, so
`masked == pruned == ONNX` holds for every plan. These helpers are what the pipeline calls: the alive masks to
score and select from, the plan of what is dead, and the surgery that applies it. `recovery.loop.prune` drives them
through `compressor.pruning.budget` (which picks each step's units under a head, FLOP or speed-up budget):

    alive = Masks.full(model, spec.units)                        # reads as {"heads": .., "neurons": ..}
    budget = budget.plan_budget(model, spec)                     # per-step goals (+ latency table for speed-ups)
    scores = score_all(spec.criterion.name, model, alive, batches, spec.criterion.params)
    plan = budget.select(step, scores, alive)                    # per FLOP or per predicted ms saved
    alive = apply_plan_to_masks(plan, alive)
    with masking.gated(model, alive["heads"].float(), alive["neurons"].float()): ...  # fine-tune, masked
    apply_unit_plan(model, masks_to_plan(alive))                 # at the end: physical removal
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from compressor.surgery.arch import (
    neuron_presence_mask,
    num_layers,
    original_ffn_size,
    original_hidden,
    original_num_heads,
    presence_mask,
)
from compressor.surgery.cost import masked_flops
from compressor.surgery.positions import cut_positions, write_back
from compressor.surgery.width import cut_units

UNIT_KINDS = ("heads", "neurons")
UnitPlan = dict[str, dict[int, list[int]]]


@dataclass(eq=False)
class Masks(Mapping[str, torch.Tensor]):
    """What is still alive in the model, over original unit ids: the one type of kept units that selection,
    allocation, the budget, masking, the rescale fit and the API pass around.

    `heads`: [layers, heads] bool; `neurons`: [layers, FFN width] bool, or None when neurons are not pruned. A
    layer with no head and no neuron left is removed whole (masked: skipped). It reads as the mapping `{kind: mask}`
    over the kinds it tracks (`masks["heads"]`, `"neurons" in masks`, `masks.items()`), which is how the layers
    below pruning (surgery's FLOP count) take it.
    """

    heads: torch.Tensor
    neurons: torch.Tensor | None = None
    hidden: torch.Tensor | None = None  # [original width] bool: the residual channels kept (None: not pruned). Not
    # one of the mapping's kinds: it is one set for the whole stream, not a row per layer

    @classmethod
    def full(cls, model: nn.Module, units: Sequence[str] = ("heads",)) -> Masks:
        """Everything alive; a neuron mask only when `units` includes "neurons", a width mask with "hidden"."""
        neurons = torch.ones(num_layers(model), original_ffn_size(model), dtype=torch.bool)
        heads = torch.ones(num_layers(model), original_num_heads(model), dtype=torch.bool)
        hidden = torch.ones(original_hidden(model), dtype=torch.bool) if "hidden" in units else None
        return cls(heads=heads, neurons=neurons if "neurons" in units else None, hidden=hidden)

    @classmethod
    def of(cls, alive: Mapping[str, torch.Tensor]) -> Masks:
        """The masks of a `{kind: mask}` mapping (it must have "heads"); masks given as `Masks` keep their width."""
        if isinstance(alive, Masks):
            return alive
        return cls(heads=alive["heads"], neurons=alive.get("neurons"))

    def __getitem__(self, kind: str) -> torch.Tensor:
        mask = self.heads if kind == "heads" else self.neurons if kind == "neurons" else None
        if mask is None:
            raise KeyError(kind)
        return mask

    def __iter__(self) -> Iterator[str]:
        return iter(("heads",) if self.neurons is None else ("heads", "neurons"))

    def __len__(self) -> int:
        return 1 if self.neurons is None else 2

    def alive(self) -> dict[str, torch.Tensor]:
        """The same units as a plain `{kind: mask}` dict (kinds tracked only)."""
        return dict(self)

    def clone(self) -> Masks:
        """New tensors, the same units."""
        copies = (None if mask is None else mask.clone() for mask in (self.neurons, self.hidden))
        return Masks(self.heads.clone(), *copies)

    def without(self, plan: UnitPlan) -> Masks:
        """These masks with every unit of `plan` switched off (new tensors)."""
        return self._switched(plan, False)

    def with_units(self, plan: UnitPlan) -> Masks:
        """These masks with every unit of `plan` switched back on (new tensors): what a step gives back."""
        return self._switched(plan, True)

    def _switched(self, plan: UnitPlan, alive: bool) -> Masks:
        out = self.clone()
        for kind, layers in plan.items():
            for layer, ids in layers.items():
                out[kind][layer, ids] = alive
        return out

    def removed_since(self, earlier: Mapping[str, torch.Tensor]) -> UnitPlan:
        """The units alive in `earlier` and dead here, as a unit plan (what the steps in between removed)."""
        return masks_to_plan({kind: ~(earlier[kind] & ~mask) for kind, mask in self.items()})

    def head_gates(self) -> torch.Tensor:
        """Float gates for `masking.gated` (1 alive, 0 removed)."""
        return self.heads.float()

    def neuron_gates(self) -> torch.Tensor | None:
        """Float FFN neuron gates for `masking.gated(model, heads, neurons)`, None when neurons are not pruned."""
        return None if self.neurons is None else self.neurons.float()

    def width(self) -> int | None:
        """Residual channels kept (None when the width is not pruned)."""
        return None if self.hidden is None else int(self.hidden.sum())

    def narrowed(self, hidden: torch.Tensor) -> Masks:
        """These masks with the residual channels `hidden` keeps (new tensors)."""
        out = self.clone()
        out.hidden = hidden.clone()
        return out

    def cut(self, model: nn.Module) -> nn.Module:
        """Physically remove every dead unit from `model` in place: heads, neurons, empty layers, then the residual
        channels the width mask drops."""
        return cut_units(model, self.unit_plan(), self.dropped_channels())

    def dropped_channels(self) -> list[int]:
        """The residual channels (original ids) the width mask drops; none when the width is not pruned."""
        return [] if self.hidden is None else (~self.hidden).nonzero().flatten().tolist()

    def flops(self, model: nn.Module, seq_len: int) -> int:
        """Encoder FLOPs per example of `model` with only these units kept, at this width (`surgery.cost`)."""
        return masked_flops(model, self.alive(), seq_len, self.width())

    def unit_plan(self) -> UnitPlan:
        """The cumulative unit plan (original ids) of every dead unit."""
        return masks_to_plan(self)

    def heads_per_layer(self) -> list[int]:
        return [int(x) for x in self.heads.sum(1)]

    def pruned_copy(self, model: nn.Module) -> nn.Module:
        """A copy of `model` with the dead units sliced out and empty layers removed (`model` is untouched)."""
        return self.cut(copy.deepcopy(model)).eval()

    def write_back(self, model: nn.Module, trained: nn.Module) -> None:
        """Copy the weights of `trained` (`self.pruned_copy(model)`, since trained) into the slots of `model` they
        were cut from, in place; the dead units' slots keep their weights (under these masks they are never read).
        So a masked model can be trained at the pruned model's cost and stay the run's one representation."""
        cut = partial(cut_units, plan=self.unit_plan(), channels=self.dropped_channels())
        write_back(model, trained, cut_positions(model, cut))


def alive_units(model: nn.Module) -> Masks:
    """The heads ([layers, heads] bool) and FFN neurons ([layers, FFN width] bool) still present in `model`."""
    return Masks(presence_mask(model), neuron_presence_mask(model))


def apply_plan_to_masks(plan: UnitPlan, alive: Mapping[str, torch.Tensor]) -> Masks:
    """`alive` with every unit of `plan` switched off (new tensors; `Masks.without`)."""
    return Masks.of(alive).without(plan)


def layers_with_units(alive: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Per layer, whether any unit of any kind in `alive` is left (a layer with none is removed whole)."""
    return torch.stack([mask.any(1) for mask in alive.values()]).any(0)


def plan_size(plan: UnitPlan) -> int:
    """How many units `plan` names, of every kind."""
    return sum(len(ids) for layers in plan.values() for ids in layers.values())


def masks_to_plan(alive: Mapping[str, torch.Tensor]) -> UnitPlan:
    """The cumulative unit plan (original ids) of every dead unit."""
    return {
        kind: {layer: [int(i) for i in (~row).nonzero().flatten()] for layer, row in enumerate(mask) if (~row).any()}
        for kind, mask in alive.items()
    }


def apply_unit_plan(model: nn.Module, plan: UnitPlan) -> nn.Module:
    """Physically remove every unit of `plan` from `model` in place (layers left empty are removed whole)."""
    return cut_units(model, plan)


def pruned_units_copy(model: nn.Module, plan: UnitPlan) -> nn.Module:
    """`apply_unit_plan` on a deep copy, leaving `model` untouched."""
    return apply_unit_plan(copy.deepcopy(model), plan)


def score_all(
    name: str,
    model: nn.Module,
    alive: Masks,
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
