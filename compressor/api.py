"""The Python API: prune a classifier held in memory, writing no files.

In the spirit of torchao's `quantize_(model, config)`::

    result = compressor.prune(model, tokenizer, train=train_ds, config=PruneSpec(target=0.5, steps=2),
                              validation=val_ds)
    small = result.pruned()   # heads physically removed

Each step scores the alive heads with the criterion, masks the lowest ones, and (with `config.finetune`)
fine-tunes with the mask. The model is changed in place (its weights fine-tuned, masked heads gated only while
scoring and training); `PruneResult` holds the masks, the cumulative plan, every step's scores and the step log.
Persistence is the caller's business: `compressor run` passes a `StepHook` that checkpoints each step and resumes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast, set_seed
from torch import nn
from tqdm.auto import tqdm

from compressor import criteria
from compressor.distill import TeacherTargets, load_or_compute
from compressor.errors import UserError
from compressor.layout import num_layers, original_num_heads
from compressor.recipe import PruneSpec
from compressor.selection import mask_to_plan, plan_to_mask, schedule, select_heads
from compressor.surgery import pruned_copy
from compressor.train import evaluate, sample_batches, train

log = logging.getLogger("compressor")
TRAIN_SCORE_EXAMPLES = 2048  # training examples a learning criterion (l0) may draw per step


@dataclass
class Masks:
    """What is still alive in the model, over original unit ids.

    Only attention heads today (`heads`: [layers, heads] bool); further prunable units (FFN neurons, layers) are
    added as optional fields so that `PruneState` and `prune` keep their signatures.
    """

    heads: torch.Tensor

    @classmethod
    def full(cls, model: nn.Module) -> Masks:
        return cls(heads=torch.ones(num_layers(model), original_num_heads(model), dtype=torch.bool))

    def head_gates(self) -> torch.Tensor:
        """Float gates for `masking.gated` (1 alive, 0 removed)."""
        return self.heads.float()

    def heads_per_layer(self) -> list[int]:
        return [int(x) for x in self.heads.sum(1)]


@dataclass
class StepRecord:
    """One finished pruning step: its JSON log entry, the scores it selected on, and the masks after it."""

    entry: dict
    scores: torch.Tensor
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
    weights that `masks` switches off); `pruned()` removes them physically."""

    model: nn.Module
    masks: Masks
    plan: dict[int, list[int]]
    scores: list[torch.Tensor]
    steps: list[dict]
    step_masks: list[Masks]

    def pruned(self) -> nn.Module:
        """A copy of `model` with the masked heads sliced out (equal logits to the masked model)."""
        return pruned_copy(self.model, self.plan).eval()


@dataclass(frozen=True)
class _Loop:
    """The fixed inputs of every step."""

    model: nn.Module
    tokenizer: object
    train: datasets.Dataset
    validation: datasets.Dataset | None
    config: PruneSpec
    accelerator: Accelerator
    seed: int
    score_batches: list[dict]
    teacher: TeacherTargets | None = None


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
    """Iteratively prune `model`'s attention heads to `config.target`, fine-tuning between steps.

    `train` and `validation` are tokenised splits (`compressor.train.tokenize`: model inputs plus `labels`);
    without `validation` the step log has no accuracies. The model should use eager attention (criteria read
    attention weights). With `config.finetune.distill` the recovery fine-tuning distils from `teacher`: the
    unpruned model (default: `model` as passed in, before any step), or targets the caller cached
    (`compressor.distill.load_or_compute`, as the runner does so a resumed run reuses them).
    """
    config = config or PruneSpec()
    accelerator = accelerator or Accelerator()
    model = model.to(accelerator.device)
    targets = _teacher_targets(teacher, model, train, tokenizer, config, accelerator)
    score_batches = sample_batches(
        train, tokenizer, config.score_examples, config.score_batch_size, seed=seed, accelerator=accelerator
    )
    loop = _Loop(model, tokenizer, train, validation, config, accelerator, seed, score_batches, targets)
    fresh = PruneState(Masks.full(model))
    state = hook.resume(model, fresh) if hook is not None else fresh
    cumulative = schedule(fresh.masks.heads.numel(), config.target, config.steps)
    bar = tqdm(total=config.steps, initial=len(state.steps), desc="prune steps", leave=False,
               disable=not accelerator.is_local_main_process)  # fmt: skip
    for step in range(len(state.steps), config.steps):
        state.steps.append(_step(loop, state.masks, step, cumulative[step]))
        state.masks = state.steps[-1].masks
        if hook is not None:
            hook.after_step(accelerator.unwrap_model(model), state)
        accelerator.wait_for_everyone()
        bar.update(1)
    bar.close()
    return PruneResult(
        model=accelerator.unwrap_model(model),
        masks=state.masks,
        plan=mask_to_plan(state.masks.heads),
        scores=[s.scores for s in state.steps],
        steps=state.log,
        step_masks=[s.masks for s in state.steps],
    )


def _teacher_targets(
    teacher: nn.Module | TeacherTargets | None, model: nn.Module, train_ds, tokenizer, config: PruneSpec, accelerator
) -> TeacherTargets | None:
    """Teacher logits for every training example, computed once (or the caller's), when distillation is on."""
    distill = config.finetune.distill if config.finetune is not None else None
    if distill is None:
        if teacher is not None:
            raise UserError("teacher: given, but prune.finetune.distill is off; expected distill settings to use it")
        return None
    if isinstance(teacher, TeacherTargets):
        return teacher
    return load_or_compute(None, teacher if teacher is not None else model, train_ds, tokenizer, accelerator, distill)


def _score(loop: _Loop, masks: Masks, step: int, n_remove: int) -> tuple[torch.Tensor, dict]:
    """[layers, heads] scores of the criterion (dead heads -inf, identical on every process) and its diagnostics."""
    acc, p, seed = loop.accelerator, loop.config, loop.seed
    ctx = criteria.ScoreContext(
        model=loop.model,
        alive=masks.heads,
        batches=loop.score_batches,
        accelerator=acc,
        target_remove=n_remove,
        train_batches=partial(
            sample_batches, loop.train, loop.tokenizer, TRAIN_SCORE_EXAMPLES, p.score_batch_size, seed + step, acc
        ),
        seed=seed + step,
        extras={"special_token_ids": sorted(loop.tokenizer.all_special_ids)},
    )
    scores = criteria.score_heads(p.criterion.name, ctx, p.criterion.params)
    scores = broadcast(scores.to(acc.device)).cpu() if acc.num_processes > 1 else scores
    return scores, {k: v for k, v in ctx.extras.items() if k != "special_token_ids"}  # e.g. l0's sparsity reached


def _validate(loop: _Loop, masks: Masks) -> dict | None:
    if loop.validation is None:
        return None
    return evaluate(loop.model, loop.validation, loop.tokenizer, loop.accelerator, masks.head_gates())


def _step(loop: _Loop, masks: Masks, step: int, removed_after: int) -> StepRecord:
    """Score, select and mask `removed_after − removed` more heads, then fine-tune with the new mask."""
    t0 = time.perf_counter()
    p = loop.config
    set_seed(loop.seed + 1000 * (step + 1))
    n_remove = removed_after - int((~masks.heads).sum())
    t_score = time.perf_counter()
    scores, diagnostics = _score(loop, masks, step, n_remove)
    score_seconds = time.perf_counter() - t_score
    plan = select_heads(scores, masks.heads, n_remove, p.scope, p.min_heads_per_layer)
    masks = Masks(heads=plan_to_mask(plan, masks.heads))
    entry = {
        "step": step + 1,
        "removed": {str(k): v for k, v in plan.items()},
        "heads_left": int(masks.heads.sum()),
        "heads_per_layer": masks.heads_per_layer(),
        "scores": [[None if s == float("-inf") else round(float(s), 6) for s in row] for row in scores],
    }
    if (after_prune := _validate(loop, masks)) is not None:
        entry["val_after_prune"] = after_prune
    if diagnostics:
        entry["criterion_diagnostics"] = diagnostics
    if p.finetune is not None:
        gates, desc = masks.head_gates(), f"step {step + 1}"
        entry["finetune"] = train(
            loop.model,
            loop.train,
            loop.tokenizer,
            p.finetune,
            loop.accelerator,
            gates,
            seed=loop.seed + step,
            desc=desc,
            teacher=loop.teacher,
        )
        if (after_finetune := _validate(loop, masks)) is not None:
            entry["val_after_finetune"] = after_finetune
    entry["score_seconds"] = score_seconds
    entry["seconds"] = time.perf_counter() - t0
    _log_step(entry, p.steps)
    return StepRecord(entry=entry, scores=scores, masks=masks)


def _log_step(entry: dict, steps: int) -> None:
    accuracy = {k: entry[k]["accuracy"] for k in ("val_after_prune", "val_after_finetune") if k in entry}
    log.info(
        "step %d/%d: %d heads left %s | val acc after prune %s, after fine-tune %s (%.0fs)",
        entry["step"],
        steps,
        entry["heads_left"],
        entry["heads_per_layer"],
        _fmt(accuracy.get("val_after_prune")),
        _fmt(accuracy.get("val_after_finetune", accuracy.get("val_after_prune"))),
        entry["seconds"],
    )


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"
