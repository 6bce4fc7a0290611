"""The Python API: prune a classifier held in memory, writing no files.

In the spirit of torchao's `quantize_(model, config)`::

    result = compressor.prune(model, tokenizer, train=train_ds, config=PruneSpec(target=0.5, steps=2),
                              validation=val_ds)
    small = result.pruned()   # heads physically removed

Each step scores the alive units (heads, and FFN neurons when `config.units` asks) with the criterion, masks the
ones the budget's step selects (`compressor.pruning.budget`: a head count, a FLOP share, or a predicted speed-up), and
runs the recovery steps `config.recovery` lists, in order (`compressor.recovery.steps`: by default the fine-tune with
the masks). A speed-up budget loads or measures its latency table (the only file the API may write, cached under
`$COMPRESSOR_CACHE/latency`) and stops once the table predicts the goal met.
The model is changed in place (its weights fine-tuned, masked units gated only while scoring and training);
`PruneResult` holds the masks, the cumulative plan, every step's scores and the step log. With several targets
(`budget.values`) it also holds the family: `members` (the step that reached each target) and `member_model`.
Persistence is the caller's business: `compressor run` passes a `StepHook` that checkpoints each step and resumes.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast, set_seed
from torch import nn
from tqdm.auto import tqdm

from compressor.pruning.budget import max_steps, plan_budget
from compressor.pruning.masking import narrowed
from compressor.pruning.selection import mask_to_plan
from compressor.pruning.units import Masks, score_all
from compressor.pruning.width import channel_scores, narrow, width_at
from compressor.recipe import PruneSpec
from compressor.recovery.choice import LoopInputs, select, settle
from compressor.recovery.distill import TeacherTargets, teacher_targets
from compressor.recovery.evaluate import evaluate_kept
from compressor.recovery.rescale import post_training_sample
from compressor.recovery.steplog import log_step, unit_entry
from compressor.recovery.steps import RecoveryStep, make
from compressor.sources.batches import sample_batches
from compressor.sources.models import check_sequence_classifier

log = logging.getLogger("compressor")
TRAIN_SCORE_EXAMPLES = 2048  # training examples a learning criterion (l0) may draw per step


@dataclass
class StepRecord:
    """One finished pruning step: its JSON log entry, the scores it selected on, the masks after it and, for a step
    that closes a family member (`entry["members"]`), how to get its weights back (`weights()`)."""

    entry: dict
    scores: torch.Tensor  # head scores
    masks: Masks
    neuron_scores: torch.Tensor | None = None
    weights: Callable[[], dict[str, torch.Tensor]] | None = None


@dataclass(frozen=True)
class Member:
    """One model of a family: the target it answers, the 1-based step whose model it is, and that step's masks."""

    target: float
    step: int
    masks: Masks


@dataclass
class PruneState:
    """Where an iterative prune stands: the current masks and every finished step."""

    masks: Masks
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def log(self) -> list[dict]:
        return [s.entry for s in self.steps]


class StepHook(Protocol):
    """Persistence of the loop, supplied by the caller (the runner checkpoints; the API itself writes nothing)."""

    def resume(self, model: nn.Module, fresh: PruneState) -> PruneState:
        """The state to continue from (loading its weights into `model`), or `fresh` to start at step 1."""

    def after_step(self, model: nn.Module, state: PruneState) -> None:
        """Called on every process after each step, with the unwrapped model."""


@dataclass
class PruneResult:
    """What `prune` returns. `model` is the fine-tuned model with its heads still present (masked heads hold
    weights that `masks` switches off); `pruned()` removes them physically. `records` are the finished steps; the
    step log, scores and masks per step are read off them."""

    model: nn.Module
    masks: Masks
    plan: dict[int, list[int]]
    records: list[StepRecord]

    @property
    def steps(self) -> list[dict]:
        """The step log (one JSON entry per step)."""
        return [r.entry for r in self.records]

    @property
    def scores(self) -> list[torch.Tensor]:
        """Each step's head scores."""
        return [r.scores for r in self.records]

    @property
    def step_masks(self) -> list[Masks]:
        """The masks after each step."""
        return [r.masks for r in self.records]

    def pruned(self) -> nn.Module:
        """A copy of `model` with the masked units sliced out, empty layers removed (equal logits to the masked
        model)."""
        return self.masks.pruned_copy(self.model)

    @property
    def members(self) -> list[Member]:
        """Every target's model, ascending (one, the final model, unless the budget lists several `values`)."""
        return [Member(target, r.entry["step"], r.masks) for r in self.records for target in r.entry.get("members", [])]

    def member_model(self, member: Member) -> nn.Module:
        """The masked model of `member` with its step's weights (the final model itself for the last step);
        `Masks.pruned_copy` or `member.masks` then remove or gate its units."""
        if member.step == len(self.records):
            return self.model
        record = self.records[member.step - 1]
        if record.weights is None:
            raise RuntimeError(f"member at {member.target}: the weights of step {member.step} were not kept")
        model = copy.deepcopy(self.model)
        model.load_state_dict(record.weights())
        return model


def prune(
    model: nn.Module,
    tokenizer,
    train: datasets.Dataset,
    config: PruneSpec | None = None,
    *,
    validation: datasets.Dataset | None = None,
    teacher: nn.Module | TeacherTargets | None = None,
    seed: int = 0,
    accelerator: Accelerator | None = None,
    hook: StepHook | None = None,
) -> PruneResult:
    """Iteratively prune `model`'s units (`config.units`) to `config`'s budget, fine-tuning between steps.

    `train` and `validation` are tokenised splits (`compressor.sources.batches.tokenize`: model inputs plus `labels`);
    without `validation` the step log has no accuracies. The model should use eager attention (criteria read
    attention weights). With `config.finetune.distill` the recovery fine-tuning distils from `teacher`: the
    unpruned model (default: `model` as passed in, before any step), or targets the caller cached
    (`compressor.recovery.distill.load_or_compute`, as the runner does so a resumed run reuses them).
    A budget the model cannot meet raises `RecipeError` before any step. (Nine arguments: this is the public
    `compressor.prune`; the options after `config` are keyword-only.)
    """
    check_sequence_classifier(model)
    config = config or PruneSpec()
    accelerator = accelerator or Accelerator()
    loop = _prepare(model.to(accelerator.device), tokenizer, train, config, validation, teacher, seed, accelerator)
    recovery = make(config.recovery_steps, loop)  # each step prepares what it reuses (rescale: its reference copy)
    fresh = PruneState(Masks.full(loop.model, config.units))
    state = hook.resume(loop.model, fresh) if hook is not None else fresh
    if (last := next((e["calibration"] for e in reversed(state.log) if "calibration" in e), None)) is not None:
        loop.budget.calibration = last  # a resumed run keeps the correction its finished steps measured
    _run_steps(loop, recovery, state, hook)
    return PruneResult(
        model=accelerator.unwrap_model(loop.model),
        masks=state.masks,
        plan=mask_to_plan(state.masks.heads),
        records=state.steps,
    )


def _prepare(model, tokenizer, train, config, validation, teacher, seed, accelerator) -> LoopInputs:
    """Everything the steps share, made once: the post-training sample, the teacher's targets, the scoring
    batches and the budget (a speed-up budget's latency table). Its arguments are `prune`'s, passed on."""
    unwrapped = accelerator.unwrap_model(model)
    train = post_training_sample(train, config, seed, unwrapped, tokenizer)
    steps = max_steps(config)
    targets = teacher_targets(teacher, model, train, tokenizer, config.recovery_finetune, accelerator, seed, steps)
    score_batches = sample_batches(
        train, tokenizer, config.scoring_examples, config.score_batch_size, seed, accelerator, by_length=True
    )  # criteria sum over batches: length order pads least
    with accelerator.main_process_first():  # a latency table is measured once, by the main process, then loaded
        budget = plan_budget(unwrapped, config)
    return LoopInputs(model, tokenizer, train, validation, config, accelerator, seed, score_batches, budget, targets)


def _run_steps(loop: LoopInputs, recovery: list[RecoveryStep], state: PruneState, hook: StepHook | None) -> None:
    """Step until every target is closed (`Budget.next_index`), with top-up steps where a step measured short;
    marks the steps that close a family member's target, checkpoints each step through `hook`."""
    budget, accelerator = loop.budget, loop.accelerator
    bar = tqdm(total=len(budget.goals), initial=len(state.steps), desc="prune steps", leave=False,
               disable=not accelerator.is_local_main_process)  # fmt: skip
    closed = budget.closed_by(state.log, state.masks)
    index = budget.next_index(budget.index_of(state.log), closed, state.masks)
    while index is not None:
        tries = 1 + budget.tries_at(state.log, index)
        if tries > 1:
            bar.total += 1
            log.info("budget: measured short of %.2fx; top-up step %d at that target", budget.goal(index), tries - 1)
        record = _step(loop, recovery, state.masks, len(state.steps), index)
        record.entry["goal_index"], record.entry["goal"] = index, budget.goal(index)
        if members := budget.closing(index, tries, closed, record.masks):
            record.entry["members"] = members  # this step's model is the family member at each of these targets
            closed += members
            log.info("budget: member %s taken after step %d", ", ".join(map(budget.describe, members)),
                     record.entry["step"])  # fmt: skip
            if hook is None:  # the API writes nothing: keep the member's weights (a hook's checkpoint keeps them)
                record.weights = _snapshot(accelerator.unwrap_model(loop.model))
        state.steps.append(record)
        state.masks = record.masks
        if hook is not None:
            hook.after_step(accelerator.unwrap_model(loop.model), state)
        accelerator.wait_for_everyone()
        bar.update(1)
        index = budget.next_index(index, closed, state.masks)
    bar.close()


def _snapshot(model: nn.Module) -> Callable[[], dict[str, torch.Tensor]]:
    """The model's weights now, on the CPU, for a family member later steps would otherwise train away."""
    weights = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
    return lambda: weights


def _score(loop: LoopInputs, masks: Masks, step: int, index: int) -> tuple[dict[str, torch.Tensor], dict]:
    """Step `step`'s scores, aiming at goal `index`, of the criterion per unit kind ([layers, units], dead units
    -inf, identical on every process) and its diagnostics."""
    acc, p, seed = loop.accelerator, loop.config, loop.seed
    extras = {"special_token_ids": sorted(loop.tokenizer.all_special_ids)}
    scores = score_all(
        p.criterion.name,
        loop.model,
        masks,
        loop.score_batches,
        p.criterion.params,
        accelerator=acc,
        target_remove=loop.budget.target_remove(index, masks),
        train_batches=partial(
            sample_batches, loop.train, loop.tokenizer, TRAIN_SCORE_EXAMPLES, p.score_batch_size, seed + step, acc
        ),
        seed=seed + step,
        extras=extras,
    )
    if acc.num_processes > 1:
        scores = {kind: broadcast(s.to(acc.device)).cpu() for kind, s in scores.items()}
    return scores, {k: v for k, v in extras.items() if k != "special_token_ids"}  # e.g. l0's sparsity reached


def _narrow_width(loop: LoopInputs, masks: Masks, index: int) -> tuple[Masks, torch.Tensor | None]:
    """Units 'hidden' (`pruning.width`): with a named width, `masks` narrowed to the width goal `index` keeps; with an
    allocated one, `masks` as they are and the channel scores the step's allocation narrows by. (masks, None) when
    the width is not pruned or is named."""
    if masks.hidden is None:
        return masks, None
    model, p = loop.accelerator.unwrap_model(loop.model), loop.config
    if p.hidden_size is None:
        return masks, _channel_scores(loop, model, masks)
    width = width_at(len(masks.hidden), p.hidden_size, p.hidden_multiple, index, len(loop.budget.goals))
    if width < int(masks.hidden.sum()):
        masks, removed = narrow(masks, _channel_scores(loop, model, masks), width)
        log.info("step: residual width %d (%d channels removed)", width, len(removed))
    return masks, None


def _channel_scores(loop: LoopInputs, model: nn.Module, masks: Masks) -> torch.Tensor:
    """`pruning.width.channel_scores` on the scoring batches, the same on every process (the main process's)."""
    scores = channel_scores(model, masks, loop.score_batches)
    if loop.accelerator.num_processes > 1:  # one kept set on every process
        scores = broadcast(scores.to(loop.accelerator.device)).cpu()
    return scores


def _validate(loop: LoopInputs, masks: Masks) -> dict | None:
    if loop.validation is None:
        return None
    return evaluate_kept(loop.model, masks, loop.validation, loop.tokenizer, loop.accelerator)


def _step(loop: LoopInputs, recovery: list[RecoveryStep], masks: Masks, step: int, index: int) -> StepRecord:
    """Step `step` (0-based): score, select and mask the units that reach goal `index` of the schedule (a speed-up
    step measured short of its target selects more first, one measured past it gives back: `choice.settle`), then
    repair: each recovery step in the recipe's order, its entry under its name and the validation after it under
    `val_after_<name>`."""
    t0 = time.perf_counter()
    p = loop.config
    set_seed(loop.seed + 1000 * (step + 1))
    t_score = time.perf_counter()
    log.info("step %d: scoring %s with %s on %d batches", step + 1, "+".join(masks), p.criterion.name,
             len(loop.score_batches))  # fmt: skip
    start_width = masks.width()
    masks, channels = _narrow_width(loop, masks, index)
    with narrowed(loop.accelerator.unwrap_model(loop.model), masks.hidden):
        scores, diagnostics = _score(loop, masks, step, index)
    score_seconds = time.perf_counter() - t_score
    chosen = select(loop, index, scores, masks, step, channels=channels)
    plan, slices = chosen.plan, chosen.log
    before, masks, measured = masks, chosen.apply(masks), {}
    if chosen.hidden is not None:
        log.info("step: residual width %d, allocated (%d channels removed)", masks.width(),
                 start_width - masks.width())  # fmt: skip
    if p.resolved_budget.kind == "speedup":
        masks, measured, extra = settle(loop, index, scores, before, masks, step)
        plan, slices = masks.removed_since(before), slices + extra
    entry = {
        "step": step + 1,
        "removed": {str(k): v for k, v in plan["heads"].items()} if "heads" in plan else {},
        "heads_left": int(masks.heads.sum()),
        "heads_per_layer": masks.heads_per_layer(),
        "scores": [[None if s == float("-inf") else round(float(s), 6) for s in row] for row in scores["heads"]],
    }
    if masks.neurons is not None:
        entry |= unit_entry(masks.heads, masks.neurons, plan)
    if masks.hidden is not None:
        entry["hidden_size"] = masks.width()
    if p.resolved_budget.kind != "heads":  # FLOP and speed-up budgets log their progress, with or without neurons
        entry |= measured | loop.budget.progress(masks)
    if (after_prune := _validate(loop, masks)) is not None:
        entry["val_after_prune"] = after_prune
    if diagnostics:
        entry["criterion_diagnostics"] = diagnostics
    if slices:
        entry["allocation"] = slices
    for name, repair in zip(p.recovery_steps, recovery, strict=True):
        entry[name] = repair(masks, step)
        if (after := _validate(loop, masks)) is not None:
            entry[f"val_after_{name}"] = after
    entry["score_seconds"] = score_seconds
    entry["seconds"] = time.perf_counter() - t0
    log_step(entry, len(loop.budget.goals))
    return StepRecord(entry=entry, scores=scores["heads"], masks=masks, neuron_scores=scores.get("neurons"))
