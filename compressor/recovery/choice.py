"""Which units a pruning step takes: its selection, and under a speed-up budget that times itself, the settling.

`select` picks a step's removals (the measured allocation across kinds, `compressor.pruning.allocation`, or the
budget's own selection). `settle` then times the physically pruned model (`calibrate`) before any recovery: a
member's step measured short of its target selects more from the step's scores; one measured more than `OVERSHOOT`
past gives units of its own step back (`give_back`), at most `GIVE_BACKS` times. A step that dropped layers whole
lands in coarse jumps, and once none of its heads or neurons is left to restore in a kept layer, only a whole layer
coming back can bring it nearer: it gives back the dropped layer that lowers the measured loss most per millisecond
added, and selects heads and neurons again (no whole layer) up to the target. The loop (`compressor.recovery.loop`)
runs the steps; this module is what one step chooses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from torch import nn
from tqdm.auto import tqdm

from compressor.pruning.allocation import Selection, kept_loss, layer_to_restore, select_measured
from compressor.pruning.budget import GIVE_BACKS, TOP_UP_STEPS, Budget
from compressor.pruning.latency.check import measured_speedup
from compressor.pruning.units import Masks, UnitPlan, plan_size
from compressor.pruning.width import width_narrower
from compressor.recipe import PruneSpec
from compressor.recovery.distill import TeacherTargets

log = logging.getLogger("compressor")


@dataclass(frozen=True)
class LoopInputs:
    """The fixed inputs of every step."""

    model: nn.Module
    tokenizer: object
    train: datasets.Dataset
    validation: datasets.Dataset | None
    config: PruneSpec
    accelerator: Accelerator
    seed: int
    score_batches: list[dict]
    budget: Budget
    teacher: TeacherTargets | None = None


def select(
    loop: LoopInputs,
    index: int,
    scores: dict[str, torch.Tensor],
    masks: Masks,
    step: int = 0,
    layers: bool = True,
    channels: torch.Tensor | None = None,
) -> Selection:
    """New removals toward goal `index`: with several unit kinds and `allocation: measured`, each slice of the step goes
    to the kind whose removal measurably costs the least loss (`compressor.pruning.allocation`); else the budget's own
    selection on the criterion's scores. `layers=False` keeps whole layers out even when the recipe's units name
    them (the selection after a layer was given back); `channels` (an allocated width's channel scores,
    `pruning.width.channel_scores`) offers the residual width as a kind too. The measured passes show as a progress
    bar (one tick per loss pass)."""
    p = loop.config
    narrower = None if channels is None else width_narrower(channels, p.hidden_multiple)
    if p.allocation == "measured" and (len(scores) > 1 or narrower is not None) and p.resolved_budget.kind != "heads":
        layers = layers and "layers" in p.units
        kinds = len(scores) + layers + (narrower is not None)
        passes = 1 + p.allocation_parts * kinds + (masks.heads.shape[0] if layers else 0)
        log.info("step %d: measured allocation, at most %d loss passes over the scoring batches", step + 1, passes)
        bar = tqdm(total=passes, desc=f"step {step + 1}: allocation", leave=False,
                   disable=not loop.accelerator.is_local_main_process)  # fmt: skip
        measure = _loss(loop, masks)

        def loss(alive: Masks) -> float:
            bar.update(1)
            return measure(alive)

        try:
            return select_measured(loop.budget, index, scores, masks, loss, p.allocation_parts, layers, narrower)
        finally:
            bar.close()
    return Selection(loop.budget.select(index, scores, masks), [])


def _loss(loop: LoopInputs, kept: Masks):
    """The measured allocation's loss over the scoring batches, on a pruned copy holding the `kept` units."""
    acc = loop.accelerator
    return kept_loss(acc.unwrap_model(loop.model), allocation_batches(loop), kept, acc)


def allocation_batches(loop: LoopInputs) -> list[dict]:
    """The scoring batches the measured allocation's loss passes read: the first `allocation_examples` worth (the
    batches come in a seeded order, so they are a random subset), or all of them."""
    wanted = loop.config.allocation_examples
    if wanted is None:
        return loop.score_batches
    return loop.score_batches[: max(1, -(-wanted // loop.config.score_batch_size))]


def settle(
    loop: LoopInputs, index: int, scores: dict, before: Masks, masks: Masks, step: int
) -> tuple[Masks, dict, list[dict]]:
    """Under a speed-up budget that measures itself, before any recovery: time the masked model; while a member's
    target is measured short, select more from this step's scores (the table corrected by the timing); while more
    than `OVERSHOOT` past, at most `GIVE_BACKS` times, give back this step's units (`before`) down to it (`give_back`:
    a whole layer once no unit is left; whole layers then stay out of the step's selections). Returns masks, last
    timing, slices."""
    measured, slices, selections, gave_back, layer_back = calibrate(loop, masks), [], 0, 0, False
    while measured:
        speed, goal = measured["measured_speedup"], loop.budget.goal(index)
        if (short := loop.budget.short_of(index, masks)) and selections < TOP_UP_STEPS:
            selections += 1
            log.info("budget: step %d measured %.2fx, short of %.2fx; selecting more from its scores", step + 1,
                     speed, goal)  # fmt: skip
            more, extra, _ = select(loop, index, scores, masks, step, layers=not layer_back)  # the step's width stays
            after = masks.without(more)
        elif not short and gave_back < GIVE_BACKS and loop.budget.overshoots(index, speed):
            gave_back += 1
            more, extra = give_back(loop, index, scores, before, masks, speed, step)
            layer_back |= extra[0]["kind"] == "layer given back"
            after = masks.with_units(more)
        else:
            break
        if not any(layers for layers in more.values()):
            break
        masks, slices, measured = after, slices + extra, calibrate(loop, after)
    return masks, measured, slices


def give_back(
    loop: LoopInputs, index: int, scores: dict, before: Masks, masks: Masks, speed: float, step: int
) -> tuple[UnitPlan, list[dict]]:
    """What a step measured `speed`, past its target, puts back: its own heads and neurons in kept layers, most
    important per millisecond first (`Budget.give_back`); when none of them fits or is left and the recipe prunes
    whole layers, one layer the step dropped whole (`layer_to_restore`, its units as they were before the step),
    which lands short, so the settling selects heads and neurons again. Returns the plan and its slice entry."""
    budget, goal = loop.budget, loop.budget.goal(index)
    more = budget.give_back(index, scores, before, masks)
    layer = None
    if not any(more.values()) and "layers" in loop.config.units and not loop.config.uniform_ffn:
        layer = layer_to_restore(budget, before, masks, _loss(loop, before))
    if layer is None:
        log.info("budget: step %d measured %.2fx, past %.2fx; giving back %d of its units", step + 1, speed, goal,
                 plan_size(more))  # fmt: skip
        return more, [{"kind": "given back", "units": plan_size(more), "measured_before": round(speed, 4)}]
    ids = {kind: before[kind][layer].nonzero().flatten().tolist() for kind in masks}
    more = {kind: {layer: units} if units else {} for kind, units in ids.items()}
    log.info("budget: step %d measured %.2fx, past %.2fx, none of its units left to give back; giving back layer %d "
             "(%d units)", step + 1, speed, goal, layer, plan_size(more))  # fmt: skip
    entry = {"kind": "layer given back", "layer": layer, "units": plan_size(more), "measured_before": round(speed, 4)}
    return more, [entry]


def calibrate(loop: LoopInputs, masks: Masks) -> dict:
    """For a speed-up budget with `calibrate` on: time the physically pruned model against the unpruned one on the
    budget's runtime (main process only; the result is broadcast) and correct the table's later predictions."""
    spec = loop.config.resolved_budget
    if spec.kind != "speedup" or not spec.calibrate:
        return {}
    acc, measured = loop.accelerator, [0.0]
    if acc.is_main_process:
        log.info("budget: timing the pruned model against the original on %s (calibration)", spec.runtime)
        model = acc.unwrap_model(loop.model)
        original, pruned = Masks.full(model, loop.config.units).pruned_copy(model), masks.pruned_copy(model)
        measured[0] = measured_speedup(original, pruned, spec.runtime, spec.batch_size, spec.seq_len)
        del original, pruned
    if acc.num_processes > 1:
        measured = broadcast_object_list(measured)
    factor = loop.budget.calibrate(masks, measured[0])
    return {"measured_speedup": round(measured[0], 4), "calibration": factor}  # unrounded: a resume reuses it
