"""Distillation from the task-tuned original: teacher targets and the mixed loss.

The teacher never changes during a run, so its logits are computed once per training example and reused by every
fine-tuning step: on CPU the teacher then costs one pass over the data, not one forward per training batch. Only
the examples the steps' fine-tuning will draw get logits (`recovery.draws.drawn_examples` makes each step's draw
a pure function of the seed, so their union is known before the first step): with the default recipes that is well
under half of the train split. The pass is sharded over processes and gathered in order; the logits are saved,
keyed by example index, under the run's `state/` directory, so a killed run resumes with exactly the targets it
started with. Hidden states (for layer-wise matching) are too large to cache for a whole split and are only
computed, on the fly, when `hidden_weight` > 0.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import datasets
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from torch import nn

from compressor.core import atomic
from compressor.core.errors import UserError
from compressor.recipe import DistillSpec, TrainSpec
from compressor.recovery.draws import step_examples  # noqa: F401  (re-exported)
from compressor.surgery.arch import present_hidden, pruned_hidden

log = logging.getLogger("compressor")

INDEX_COLUMN = "example_index"  # position of an example in the full train split: the row of its teacher logits
LOGITS_FILE = "logits.safetensors"
META_FILE = "teacher.json"


@dataclass(frozen=True)
class TeacherTargets:
    """Cached teacher logits keyed by example index (row i = train example i; rows never computed are NaN) and,
    for hidden-state matching only, the teacher itself."""

    logits: torch.Tensor
    spec: DistillSpec
    teacher: nn.Module | None = None

    @property
    def hidden(self) -> bool:
        return self.spec.hidden_weight > 0 and self.teacher is not None

    def missing(self, examples: Sequence[int] | None = None) -> list[int]:
        """The examples among `examples` (default: all) that have no teacher logits yet."""
        known = (~torch.isnan(self.logits).any(-1)).tolist()
        wanted = range(len(self.logits)) if examples is None else examples
        return [i for i in wanted if not known[i]]

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The teacher logits of train examples `index`; a row never computed is an error, never a NaN loss."""
        out = self.logits[index]
        if torch.isnan(out).any():
            lost = index[torch.isnan(out).any(-1)].tolist()
            raise RuntimeError(f"teacher targets: no logits for train examples {lost[:5]} (not in the drawn set)")
        return out


def with_index(ds: datasets.Dataset) -> datasets.Dataset:
    """`ds` with an `example_index` column, added before any subsetting so rows keep their teacher row."""
    if INDEX_COLUMN in ds.column_names:
        return ds
    return ds.add_column(INDEX_COLUMN, list(range(len(ds))))


def compute_logits(
    teacher: nn.Module, train_ds: datasets.Dataset, tokenizer, accelerator: Accelerator | None, batch_size: int
) -> torch.Tensor:
    """Teacher logits for every example of `train_ds`, in order (sharded over processes, gathered on each), under
    the run's autocast (`accelerator.mixed_precision`): they are soft training targets, read at temperature `T`
    beside a student that trains in that precision, so the pass runs at the fine-tunes' speed (stored in fp32)."""
    from compressor.recovery.evaluate import predict

    with accelerator.autocast() if accelerator is not None else nullcontext():
        logits, _ = predict(teacher, train_ds, tokenizer, accelerator, batch_size=batch_size, desc="teacher targets")
    return logits


def _compute(
    teacher: nn.Module, train_ds: datasets.Dataset, tokenizer, accelerator, batch_size: int, examples: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, logits) of the teacher over the train examples `examples` (one pass, in index order)."""
    subset = train_ds if len(examples) == len(train_ds) else train_ds.select(examples)
    return torch.tensor(examples, dtype=torch.long), compute_logits(teacher, subset, tokenizer, accelerator, batch_size)


def _keyed(n: int, index: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """A [n, labels] table with `logits` at rows `index` and NaN elsewhere."""
    table = torch.full((n, logits.shape[-1]), float("nan"), dtype=logits.dtype)
    table[index] = logits
    return table


def load_or_compute(
    cache_dir: Path | None,
    teacher: nn.Module,
    train_ds: datasets.Dataset,
    tokenizer,
    accelerator: Accelerator,
    spec: DistillSpec,
    examples: Sequence[int] | None = None,
) -> TeacherTargets:
    """The run's teacher targets for the train examples `examples` (default: all; see `step_examples`): read from
    `cache_dir` when an earlier (killed) attempt saved them, else computed once and saved there atomically by the
    main process. Every process ends with the same tensor. Without a `cache_dir` (the Python API) they are
    computed once and kept in memory only.

    `teacher` must be the unpruned task-tuned model; it is kept (as a frozen copy) only for hidden-state matching.
    """
    wanted = list(range(len(train_ds))) if examples is None else sorted(set(examples))
    cached = cache_dir is not None and (Path(cache_dir) / META_FILE).exists()
    if cached:
        index, logits = _load(Path(cache_dir), len(train_ds))
    else:
        index, logits = _compute(teacher, train_ds, tokenizer, accelerator, spec.teacher_batch_size, wanted)
        if cache_dir is not None:
            _save(Path(cache_dir), index, logits, len(train_ds), accelerator)
    frozen = _frozen_copy(teacher) if spec.hidden_weight > 0 else None
    targets = TeacherTargets(logits=_keyed(len(train_ds), index, logits), spec=spec, teacher=frozen)
    if cached and (lost := targets.missing(wanted)):
        raise UserError(
            f"prune.finetune.distill: cached teacher targets in '{cache_dir}' lack {len(lost)} of the examples the "
            "steps draw; expected the same recipe and data (rerun with --force)"
        )
    how = f"reused from {cache_dir}" if cached else "computed once" + (f", cached in {cache_dir}" if cache_dir else "")
    log.info("teacher targets: %d of %d training examples (%s)", len(index), len(train_ds), how)
    return targets


def fill(
    targets: TeacherTargets, teacher: nn.Module, train_ds: datasets.Dataset, tokenizer, accelerator, examples
) -> TeacherTargets:
    """`targets` completed with the teacher's logits for those of `examples` it lacks (one pass over just those;
    the layer-drop baseline draws more examples than any step). Deterministic, so a resumed run recomputes the same
    rows; `targets` is returned unchanged when nothing is missing."""
    lost = targets.missing(examples)
    if not lost:
        return targets
    with torch.random.fork_rng(devices=[]):  # the pass's loader draws a seed: keep fine-tuning's dropout as it was
        index, logits = _compute(teacher, train_ds, tokenizer, accelerator, targets.spec.teacher_batch_size, lost)
    table = targets.logits.clone()
    table[index] = logits.to(table.dtype)
    log.info("teacher targets: %d more training examples for the baseline", len(lost))
    return replace(targets, logits=table)


def _load(cache_dir: Path, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, logits) saved by `_save` (a cache written before targets were keyed holds every row in order)."""
    meta = json.loads((cache_dir / META_FILE).read_text())
    saved = load_file(str(cache_dir / LOGITS_FILE))
    if meta["examples"] != n:
        raise UserError(
            f"prune.finetune.distill: cached teacher targets in '{cache_dir}' cover {meta['examples']} examples but "
            f"the train split has {n}; expected the same data (rerun with --force)"
        )
    return saved.get("index", torch.arange(len(saved["logits"]))), saved["logits"]


def _save(cache_dir: Path, index: torch.Tensor, logits: torch.Tensor, n: int, accelerator: Accelerator) -> None:
    """Write the targets atomically from the main process; every process waits until they are there."""
    if accelerator.is_main_process:
        with atomic.directory(cache_dir) as tmp:
            save_file({"index": index.contiguous(), "logits": logits.contiguous()}, str(tmp / LOGITS_FILE))
            meta = {"examples": n, "computed": len(index), "labels": logits.shape[-1]}
            (tmp / META_FILE).write_text(json.dumps(meta))
    accelerator.wait_for_everyone()


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


def hidden_loss(
    student: tuple, teacher: tuple, attention_mask: torch.Tensor, skip: Collection[int] = ()
) -> torch.Tensor:
    """Mean squared error between each student layer's output and its teacher layer's, over real tokens only,
    averaged over the layers not in `skip`.

    Pruning keeps the layer count (a removed layer passes its input through unchanged), so student layer i matches
    teacher layer i (index 0, the embeddings, is skipped: pruning never changes it). A removed layer (`skip`, ids
    from 0) is left out: its output is its input, so matching it to the teacher's layer output would pull the layer
    before it towards two different targets at once.
    """
    mask = attention_mask.unsqueeze(-1).to(student[-1].dtype)
    tokens = mask.sum() * student[-1].shape[-1]
    pairs = [(s, t) for i, (s, t) in enumerate(zip(student[1:], teacher[1:], strict=True)) if i not in skip]
    if not pairs:  # every layer removed: nothing left to match
        return student[-1].new_zeros(())
    return torch.stack([(((s - t) ** 2) * mask).sum() / tokens for s, t in pairs]).mean()


def mixed_loss(
    model: nn.Module, inputs: dict, batch: dict, targets: TeacherTargets | None, skip: Collection[int] = ()
) -> torch.Tensor:
    """The training loss of one batch: task cross-entropy, mixed with distillation when `targets` is given
    (`skip`: the student's pass-through layers, left out of hidden-state matching)."""
    hidden = targets is not None and targets.hidden
    out = model(**inputs, output_hidden_states=True) if hidden else model(**inputs)
    task = F.cross_entropy(out.logits, batch["labels"])
    if targets is None:
        return task
    spec = targets.spec
    teacher_logits = targets.rows(batch[INDEX_COLUMN].cpu()).to(out.logits.device)
    loss = (1 - spec.alpha) * task + spec.alpha * kd_loss(out.logits, teacher_logits, spec.temperature)
    if hidden:
        with torch.no_grad():
            teacher_states = targets.teacher.to(out.logits.device)(**inputs, output_hidden_states=True).hidden_states
        student = getattr(model, "module", model)  # under DDP, the module it wraps
        if pruned_hidden(student):  # a narrowed stream matches the teacher's same channels (original ids)
            kept = torch.tensor(present_hidden(student), device=out.logits.device)
            teacher_states = tuple(state.index_select(-1, kept) for state in teacher_states)
        matched = hidden_loss(out.hidden_states, teacher_states, inputs["attention_mask"], skip)
        loss = loss + spec.hidden_weight * matched
    return loss


def teacher_targets(
    teacher: nn.Module | TeacherTargets | None,
    model: nn.Module,
    train_ds: datasets.Dataset,
    tokenizer,
    finetune: TrainSpec | None,
    accelerator: Accelerator,
    seed: int,
    steps: int,
) -> TeacherTargets | None:
    """The pruning loop's teacher: logits for every training example its `steps` recovery fine-tunes (`finetune`)
    draw, computed once from `teacher` (default: `model` before any step), or the caller's own targets; None when
    the recovery does not distil. A teacher given without distillation is refused in one line. (Eight arguments:
    the loop's, passed on.)"""
    distill = getattr(finetune, "distill", None)
    if distill is None:
        if teacher is not None:
            raise UserError("teacher: given, but prune.finetune.distill is off; expected distill settings to use it")
        return None
    if isinstance(teacher, TeacherTargets):
        return teacher
    examples = step_examples(len(train_ds), finetune, seed, steps)
    source = teacher if teacher is not None else model
    return load_or_compute(None, source, train_ds, tokenizer, accelerator, distill, examples)
