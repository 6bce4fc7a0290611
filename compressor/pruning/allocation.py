"""Measured allocation: which unit kind (heads or FFN neurons) pays for each part of a pruning step.

A criterion's scores rank units well *within* a kind, but a head's score and a neuron's score are not on one scale:
raw Taylor scores per FLOP removed the last heads of whole layers and the model collapsed (docs/lab/history.md).
So between kinds the pruner measures instead of trusting the scores. Each step's goal is split
into `parts` equal slices (FLOPs, or predicted milliseconds spaced geometrically); for every slice, each kind
proposes the removals that would reach the slice's goal on its own (lowest scores first, the budget's usual
selection), the loss of the masked model is measured on the scoring batches for each proposal, and the proposal
with the smallest loss increase per unit of cost saved is kept. Non-additive effects (a layer losing its last
heads) show up in the measured loss, where a first-order score cannot see them. If the kept slices fall short of
the step's goal (a kind ran out), the budget's own cross-kind selection finishes the step.

Whole layers (`units: [heads, neurons, layers]`) are a third kind: each layer's loss increase when dropped is
measured once per step, and the layers proposal removes the layers with the least increase per cost saved until
the slice's goal is met (a speed-up far past MiniLM-size needs it: a layer kept with even one head and one neuron
block still costs its fixed parts). Only *thin* layers compete (`THIN`: at most a quarter of their FFN neurons
and of their heads, or `min_heads_per_layer`, left): a full-width layer's drop looked cheap on the scoring batches
but cost points that recovery did not give back (docs/lab/history.md, the MPNet family), so width goes first and a
layer goes whole once it is mostly its fixed cost. When widths cannot reach a step's goal, the finish may still drop
any layer, least loss first. `min_heads_per_layer` holds for the layers that are kept.

An allocated residual width (`units: [..., hidden]` with no `hidden_size`) is a fourth kind: each slice may also
offer the stream narrowed by one step of its grid (the lowest-scored channels go, `pruning.width.width_narrower`),
priced by its measured loss per cost saved like the others. A width step saves what it saves, more or less than the
slice's goal: a step that lands past its target gives heads and neurons back (`recovery.choice.settle`).

Cost: 1 + `parts` x kinds forward passes over the scoring batches per step (no backward), plus with `layers` one
per layer offered (thin, or every layer when the finish needs them; `LayerDrops`); the step log records each
slice's losses. The passes run on a pruned copy holding the step's units
(`kept_loss`): every proposal only removes more, so a pass costs the width the model has now, not the original's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from compressor.pruning.budget import Budget
from compressor.pruning.masking import gated
from compressor.pruning.units import Masks, UnitPlan, apply_plan_to_masks, layers_with_units

LossFn = Callable[[Masks], float]


def masked_loss(model: nn.Module, batches: list[dict], alive: Masks, accelerator=None) -> float:
    """Mean cross-entropy of `model` over `batches` with only the units in `alive` kept (masked, not removed),
    averaged over every process's batches so all processes choose alike. Under the `accelerator`'s autocast (the
    run's `mixed_precision`): these passes only rank proposals against each other, all in the same precision, and
    are most of a step's forward work."""
    model.eval()
    heads = alive["heads"].float().to(next(model.parameters()).device)
    neurons = alive["neurons"].float().to(heads.device) if "neurons" in alive else None
    total, count = torch.zeros((), device=heads.device), torch.zeros((), device=heads.device)
    cast = accelerator.autocast() if accelerator is not None else nullcontext()
    with torch.no_grad(), gated(model, heads, neurons, getattr(alive, "hidden", None)), cast:
        for batch in batches:
            batch = {k: v.to(heads.device) for k, v in batch.items()}
            labels = batch.pop("labels")
            total += F.cross_entropy(model(**batch).logits.float(), labels, reduction="sum")
            count += labels.numel()
    if accelerator is not None and accelerator.num_processes > 1:
        total, count = accelerator.reduce(total, reduction="sum"), accelerator.reduce(count, reduction="sum")
    return float(total / count.clamp_min(1))


def kept_loss(model: nn.Module, batches: list[dict], kept: Masks, accelerator=None) -> LossFn:
    """The loss function of a step's measured allocation: `masked_loss` over a pruned copy of `model` that holds only
    the `kept` units (gates are indexed by original ids, so the same masks apply). Why: a step's proposals only remove
    more units, and a gated model still computes every gated unit; late in a run most of the width is gone, and the
    masked original would make each pass cost the full model. A mask that revives a unit outside `kept` is refused."""
    pruned = kept.pruned_copy(model).to(next(model.parameters()).device)

    def loss(alive: Masks) -> float:
        if any(bool((alive[kind] & ~kept[kind]).any()) for kind in kept) or _widens(alive, kept):
            raise ValueError("allocation: a proposal keeps a unit the step had already removed")
        return masked_loss(pruned, batches, alive, accelerator)

    return loss


def _widens(alive: Masks, kept: Masks) -> bool:
    """Whether `alive` keeps a residual channel `kept` had removed."""
    mine, theirs = getattr(alive, "hidden", None), getattr(kept, "hidden", None)
    return mine is not None and theirs is not None and bool((mine & ~theirs).any())


class Selection(NamedTuple):
    """A step's new removals: the unit plan, the log of its slices and, where an allocated width narrowed the
    stream, the residual channels it keeps (None: the width is unchanged)."""

    plan: UnitPlan
    log: list[dict]
    hidden: torch.Tensor | None = None

    def apply(self, masks: Masks) -> Masks:
        """`masks` with the plan's units removed and the stream narrowed as selected (new tensors)."""
        out = masks.without(self.plan)
        return out if self.hidden is None else out.narrowed(self.hidden)


Narrower = Callable[[Masks], "Masks | None"]  # the stream one grid step narrower, or None at the floor


def _empty(plan: UnitPlan) -> bool:
    return not any(layers for layers in plan.values())


def _merge(into: UnitPlan, plan: UnitPlan) -> None:
    for kind, layers in plan.items():
        for layer, ids in layers.items():
            into.setdefault(kind, {}).setdefault(layer, []).extend(ids)


def _copy(alive: Masks) -> Masks:
    """New tensors, the same units, and `Masks` stay `Masks`: a narrowed stream keeps its width, so the budget prices
    every copy with the table measured at that width (`Budget.table_for`), not the full-width one."""
    return alive.clone() if isinstance(alive, Masks) else {kind: mask.clone() for kind, mask in alive.items()}


def select_layers(budget: Budget, goal: float, increase: dict[int, float], alive: Masks) -> UnitPlan:
    """Whole layers to remove (all their alive heads and neurons) until `goal` is reached (FLOPs removed, or the
    expected speed-up), lowest `increase` (each layer's measured loss increase when dropped) per cost saved first;
    layers without a unit left, or missing from `increase`, are not offered."""
    current = _copy(alive)
    plan: UnitPlan = {kind: {} for kind in alive}
    cost_now = budget.cost(current)
    saving = {layer: cost_now - budget.cost(_without(current, [layer])) for layer in increase}
    for layer in sorted(increase, key=lambda layer: (increase[layer] / max(saving[layer], 1e-12), layer)):
        if budget.reached(current) >= goal:
            break
        if not layers_with_units(current)[layer]:
            continue
        for kind, mask in current.items():
            plan[kind][layer] = mask[layer].nonzero().flatten().tolist()
        current = _without(current, [layer])
    return {kind: {k: v for k, v in sorted(layers.items()) if v} for kind, layers in plan.items()}


def _without(alive: Masks, layers: list[int]) -> Masks:
    """`alive` with every unit of `layers` removed."""
    out = _copy(alive)
    for kind in out:
        out[kind][layers] = False
    return out


def layer_to_restore(budget: Budget, before: Masks, alive: Masks, loss: LossFn) -> int | None:
    """The layer a step measured past its target gives back whole: among the layers with units in `before` (the
    step's start) and none in `alive` (dropped whole by the step), the one whose `before` units, put back, lower the
    measured loss the most per cost added (one pass per layer; ties to the lower layer). None when the step dropped
    no layer."""
    dropped = (layers_with_units(before) & ~layers_with_units(alive)).nonzero().flatten().tolist()
    if not dropped:
        return None
    base, cost = loss(alive), budget.cost(alive)

    def gain(layer: int) -> float:
        back = _copy(alive)
        for kind, mask in back.items():
            mask[layer] = before[kind][layer]
        return (base - loss(back)) / max(budget.cost(back) - cost, 1e-12)

    gains = {layer: gain(layer) for layer in dropped}
    return max(dropped, key=lambda layer: (gains[layer], -layer))


THIN = 0.25  # a layer competes whole once at most this share of its FFN neurons and of its heads is left


def thin_layers(alive: Masks, min_heads: int = 0) -> set[int]:
    """The layers that still have units and keep at most `THIN` of their FFN neurons (when neurons are pruned) and
    of their heads (or `min_heads`, if that is more): what is left of them is mostly their fixed cost."""
    heads = alive["heads"]
    left = heads.sum(1) <= max(min_heads, int(THIN * heads.shape[1]))
    if "neurons" in alive:
        left &= alive["neurons"].sum(1) <= int(THIN * alive["neurons"].shape[1])
    return {int(layer) for layer in (left & layers_with_units(alive)).nonzero().flatten()}


def layer_drop_increases(alive: Masks, loss: LossFn, base: float, layers: Iterable[int] | None = None) -> dict:
    """Each layer of `layers` (default: all) that still has units: the measured loss increase over `base` when it
    is dropped whole (one pass over the scoring batches per layer). What ranks whole layers as units."""
    kept = layers_with_units(alive)
    offered = range(kept.shape[0]) if layers is None else layers
    return {layer: loss(_without(alive, [layer])) - base for layer in offered if kept[layer]}


class LayerDrops:
    """The step's layer-drop increases (`layer_drop_increases` on the step's starting units), each measured the
    first time it is asked for: a slice offers only thin layers, and early in a run none is thin, so measuring
    every layer up front spent a pass per layer per step for nothing. The same values as measuring them all."""

    def __init__(self, alive: Masks, loss: LossFn, base: float) -> None:
        self.alive, self.loss, self.base = alive, loss, base
        self.known: dict[int, float] = {}

    def of(self, layers: Iterable[int]) -> dict[int, float]:
        """The increases of `layers` that still had units at the step's start, measuring those not yet known."""
        todo = [layer for layer in sorted(layers) if layer not in self.known]
        self.known |= layer_drop_increases(self.alive, self.loss, self.base, todo)
        return {layer: self.known[layer] for layer in sorted(layers) if layer in self.known}

    def all(self) -> dict[int, float]:
        """Every layer's increase (what the step's finish ranks, when widths fell short)."""
        return self.of(range(next(iter(self.alive.values())).shape[0]))


def _propose(budget: Budget, kind: str, goal: float, scores: dict, alive: Masks, layers: dict | None) -> UnitPlan:
    """One kind's removals toward `goal`: the budget's selection on that kind's scores, or whole layers."""
    if kind == "layers":
        return select_layers(budget, goal, layers or {}, alive)
    return budget.select_to(goal, {kind: scores[kind]}, alive)


def _proposals(budget: Budget, goal: float, scores: dict, alive: Masks, layers: dict | None,
               narrower: Narrower | None) -> Iterator[tuple[str, UnitPlan, Masks]]:  # fmt: skip
    """Each kind's proposal toward `goal` as (kind, its unit plan, the masks after it): the scored kinds, whole
    `layers` when given, and one width step down when `narrower` offers one (no unit in its plan)."""
    for kind in sorted(scores) + (["layers"] if layers is not None else []):
        plan = _propose(budget, kind, goal, scores, alive, layers)
        if not _empty(plan):
            yield kind, plan, apply_plan_to_masks(plan, alive)
    if narrower is not None and (after := narrower(alive)) is not None:
        yield "hidden", {kind: {} for kind in alive}, after


def _best_slice(
    budget: Budget,
    goal: float,
    scores: dict,
    alive: Masks,
    loss: LossFn,
    base: float,
    layers: dict | None = None,
    narrower: Narrower | None = None,
) -> dict | None:
    """The single-kind proposal toward `goal` with the lowest measured loss increase per cost saved, or None.
    `layers` (each layer's loss increase when dropped) adds whole layers as a kind, `narrower` the residual width."""
    best, cost_now = None, budget.cost(alive)
    for kind, plan, after in _proposals(budget, goal, scores, alive, layers, narrower):
        saved = cost_now - budget.cost(after)
        if saved <= 0:
            continue
        value = loss(after)
        rate = (value - base) / saved
        if best is None or rate < best["rate"]:
            best = {"rate": rate, "kind": kind, "plan": plan, "alive": after, "loss": value}
    return best


def select_measured(
    budget: Budget,
    step: int,
    scores: dict[str, torch.Tensor],
    alive: Masks,
    loss: LossFn,
    parts: int = 4,
    layers: bool = False,
    narrower: Narrower | None = None,
) -> Selection:
    """Step `step`'s new removals, each slice paid by the kind whose removal costs the least measured loss per
    FLOP or millisecond saved (see the module docstring), with a log of the slices: kind, loss before/after.
    `layers`: whole layers compete too, ranked by the loss increase of dropping each, measured once per step;
    `narrower`: so does the residual width, a grid step at a time (`alive` must be `Masks` with a width)."""
    current = _copy(alive)
    plan: UnitPlan = {kind: {} for kind in scores}
    base, log = loss(current), []
    drops = LayerDrops(_copy(current), loss, base) if layers else None
    for goal in budget.intermediate_goals(step, current, parts):
        offered = None
        if drops is not None:  # whole layers compete once thin, as the slices so far left them
            offered = drops.of(thin_layers(current, budget.spec.min_heads_per_layer))
        best = _best_slice(budget, goal, scores, current, loss, base, offered, narrower)
        if best is None:
            continue
        _merge(plan, best["plan"])
        entry = {"kind": best["kind"], "loss_before": round(base, 5), "loss_after": round(best["loss"], 5)}
        log.append(entry | ({"width": best["alive"].width()} if best["kind"] == "hidden" else {}))
        current, base = best["alive"], best["loss"]
    rest = budget.select_to(budget.aim(step), scores, current)  # a kind ran out: finish on the common scale
    if drops is not None and budget.reached(after := apply_plan_to_masks(rest, current)) < budget.aim(step):
        _merge(rest, select_layers(budget, budget.aim(step), drops.all(), after))  # then whole layers, least first
    if not _empty(rest):
        _merge(plan, rest)
        log.append({"kind": "rest", "loss_before": round(base, 5), "loss_after": None})
    plan = {kind: {k: sorted(v) for k, v in sorted(layers.items())} for kind, layers in plan.items()}
    width = getattr(current, "hidden", None)
    narrowed = width is not None and int(width.sum()) < int(Masks.of(alive).hidden.sum())
    return Selection(plan, log, width.clone() if narrowed else None)
