"""Distillation from the task-tuned original: teacher targets and the mixed loss.

The teacher never changes during a run, so its logits are computed once per training example (one forward over the
whole train split, sharded over processes and gathered in order) and reused by every fine-tuning step: on CPU the
teacher then costs one pass over the data, not one forward per training batch. The logits are saved under the
run's `state/` directory, so a killed run resumes with exactly the targets it started with. Hidden states (for
layer-wise matching) are too large to cache for a whole split and are only computed, on the fly, when
`hidden_weight` > 0.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from torch import nn

from compressor import atomic
from compressor.errors import UserError
from compressor.recipe import DistillSpec

log = logging.getLogger("compressor")

INDEX_COLUMN = "example_index"  # position of an example in the full train split: the row of its teacher logits
LOGITS_FILE = "logits.safetensors"
META_FILE = "teacher.json"


@dataclass(frozen=True)
class TeacherTargets:
    """Cached teacher logits (row i = train example i) and, for hidden-state matching only, the teacher itself."""

    logits: torch.Tensor
    spec: DistillSpec
    teacher: nn.Module | None = None

    @property
    def hidden(self) -> bool:
        return self.spec.hidden_weight > 0 and self.teacher is not None


def with_index(ds: datasets.Dataset) -> datasets.Dataset:
    """`ds` with an `example_index` column, added before any subsetting so rows keep their teacher row."""
    if INDEX_COLUMN in ds.column_names:
        return ds
    return ds.add_column(INDEX_COLUMN, list(range(len(ds))))


def compute_logits(
    teacher: nn.Module, train_ds: datasets.Dataset, tokenizer, accelerator: Accelerator | None, batch_size: int
) -> torch.Tensor:
    """Teacher logits for every train example, in order (sharded over processes, gathered on each)."""
    from compressor.train import predict

    logits, _ = predict(teacher, train_ds, tokenizer, accelerator, batch_size=batch_size)
    return logits


def load_or_compute(
    cache_dir: Path | None,
    teacher: nn.Module,
    train_ds: datasets.Dataset,
    tokenizer,
    accelerator: Accelerator,
    spec: DistillSpec,
) -> TeacherTargets:
    """The run's teacher targets: read from `cache_dir` when an earlier (killed) attempt saved them, else computed
    once and saved there atomically by the main process. Every process ends with the same tensor. Without a
    `cache_dir` (the Python API) they are computed once and kept in memory only.

    `teacher` must be the unpruned task-tuned model; it is kept (as a frozen copy) only for hidden-state matching.
    """
    if cache_dir is None:
        logits = compute_logits(teacher, train_ds, tokenizer, accelerator, spec.teacher_batch_size)
        return TeacherTargets(
            logits=logits, spec=spec, teacher=_frozen_copy(teacher) if spec.hidden_weight > 0 else None
        )
    cache_dir = Path(cache_dir)
    if (cache_dir / META_FILE).exists():
        logits = load_file(str(cache_dir / LOGITS_FILE))["logits"]
        log.info("teacher targets: reusing %d cached logits from %s", len(logits), cache_dir)
    else:
        logits = compute_logits(teacher, train_ds, tokenizer, accelerator, spec.teacher_batch_size)
        if accelerator.is_main_process:
            with atomic.directory(cache_dir) as tmp:
                save_file({"logits": logits.contiguous()}, str(tmp / LOGITS_FILE))
                (tmp / META_FILE).write_text(json.dumps({"examples": len(logits), "labels": logits.shape[-1]}))
        accelerator.wait_for_everyone()
        log.info("teacher targets: %d logits computed once and cached in %s", len(logits), cache_dir)
    if len(logits) != len(train_ds):
        raise UserError(
            f"prune.finetune.distill: cached teacher targets in '{cache_dir}' cover {len(logits)} examples but the "
            f"train split has {len(train_ds)}; expected the same data (rerun with --force)"
        )
    frozen = _frozen_copy(teacher) if spec.hidden_weight > 0 else None
    return TeacherTargets(logits=logits, spec=spec, teacher=frozen)


def _frozen_copy(model: nn.Module) -> nn.Module:
    """An eval-mode copy with no gradients, so later in-place fine-tuning of `model` leaves the teacher intact."""
    frozen = copy.deepcopy(model).eval()
    frozen.requires_grad_(False)
    return frozen


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T² · KL(softmax(teacher/T) ‖ softmax(student/T)), averaged over the batch (Hinton et al., 2015)."""
    t = temperature
    return (
        F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), reduction="batchmean", log_target=True)
        * t**2
    )


def hidden_loss(student: tuple, teacher: tuple, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error between each student layer's output and its teacher layer's, over real tokens only.

    Pruning keeps the layer count (a removed layer passes its input through unchanged), so student layer i matches
    teacher layer i (index 0, the embeddings, is skipped: pruning never changes it).
    """
    mask = attention_mask.unsqueeze(-1).to(student[-1].dtype)
    tokens = mask.sum() * student[-1].shape[-1]
    errors = [(((s - t) ** 2) * mask).sum() / tokens for s, t in zip(student[1:], teacher[1:], strict=True)]
    return torch.stack(errors).mean()


def mixed_loss(model: nn.Module, inputs: dict, batch: dict, targets: TeacherTargets | None) -> torch.Tensor:
    """The training loss of one batch: task cross-entropy, mixed with distillation when `targets` is given."""
    hidden = targets is not None and targets.hidden
    out = model(**inputs, output_hidden_states=True) if hidden else model(**inputs)
    task = F.cross_entropy(out.logits, batch["labels"])
    if targets is None:
        return task
    spec = targets.spec
    teacher_logits = targets.logits[batch[INDEX_COLUMN].cpu()].to(out.logits.device)
    loss = (1 - spec.alpha) * task + spec.alpha * kd_loss(out.logits, teacher_logits, spec.temperature)
    if hidden:
        with torch.no_grad():
            teacher_states = targets.teacher.to(out.logits.device)(**inputs, output_hidden_states=True).hidden_states
        loss = loss + spec.hidden_weight * hidden_loss(out.hidden_states, teacher_states, inputs["attention_mask"])
    return loss
