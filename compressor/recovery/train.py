"""Tokenisation, data loaders, the Accelerate fine-tuning loop and evaluation.

Head (and FFN neuron) masks are respected by running inside `masking.gated(...)`: a gated unit gets zero
gradient, so masked and physically pruned models stay numerically equivalent through fine-tuning. A masked model's
recovery (`train_kept`) trains its physically pruned copy instead and writes the weights back: the same kind of
updates at the pruned model's cost.
"""

from __future__ import annotations

import math
import time

import datasets
import torch
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from compressor.pruning.masking import gated, passthrough_layers
from compressor.pruning.units import Masks
from compressor.recipe import TrainSpec
from compressor.recovery.distill import TeacherTargets, mixed_loss, with_index
from compressor.recovery.draws import drawn_examples
from compressor.sources.batches import loader, model_inputs


def _optimizer(model: nn.Module, spec: TrainSpec, total: int) -> tuple:
    """AdamW (no weight decay on biases and norms) with a linear warm-up then decay over `total` steps."""
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
            "weight_decay": spec.weight_decay,
        },
        {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=spec.lr)
    return optimizer, get_linear_schedule_with_warmup(optimizer, int(spec.warmup_ratio * total), total)


def train(
    model: nn.Module,
    train_ds: datasets.Dataset,
    tokenizer,
    spec: TrainSpec,
    accelerator: Accelerator,
    gates: torch.Tensor | None = None,
    seed: int = 0,
    desc: str = "fine-tune",
    neurons: torch.Tensor | None = None,
    teacher: TeacherTargets | None = None,
) -> dict:
    """Fine-tune `model` in place with AdamW + linear warm-up/decay; returns loss and timing.

    `spec.epochs` may be fractional; `spec.max_examples` caps the examples seen per epoch (seeded subset,
    `drawn_examples`). With `teacher` (cached targets for every drawn example, see `recovery.distill`) the loss
    mixes the task loss with distillation; the examples and their order are exactly those of plain fine-tuning.
    `gates` and `neurons` are the head and FFN-neuron masks the model trains under (None: all kept). Ten
    arguments: every recovery fine-tune (base, step, baseline, reference) calls it with its own.
    """
    if teacher is not None:
        train_ds = with_index(train_ds)
    if (drawn := drawn_examples(len(train_ds), spec.max_examples, seed)) is not None:
        train_ds = train_ds.select(drawn)
    dl = loader(train_ds, tokenizer, spec.batch_size, shuffle=True, seed=seed, by_length=spec.group_by_length)
    per_epoch = math.ceil(len(dl) / accelerator.num_processes)
    total = max(1, math.ceil(per_epoch * spec.epochs))
    optimizer, scheduler = _optimizer(model, spec, total)
    wrapped, optimizer, dl, scheduler = accelerator.prepare(model, optimizer, dl, scheduler)
    wrapped.train()
    start, step, running, seen = time.perf_counter(), 0, 0.0, 0
    bar = tqdm(total=total, desc=desc, disable=not accelerator.is_local_main_process, leave=False)
    skip = passthrough_layers(model, gates, neurons) if teacher is not None and teacher.hidden else frozenset()
    with gated(model, gates, neurons):
        while step < total:
            for batch in dl:
                with accelerator.autocast():  # mixed precision in every fine-tune (prepare wraps a model once)
                    loss = mixed_loss(wrapped, model_inputs(batch), batch, teacher, skip)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                step += 1
                seen += len(batch["labels"])
                running += loss.item()
                bar.update(1)
                bar.set_postfix(loss=f"{running / step:.4f}")
                if step >= total:
                    break
    bar.close()
    wrapped.eval()
    accelerator.unwrap_model(wrapped, keep_fp32_wrapper=False)  # scoring, surgery and export run the fp32 forward
    model.eval()
    accelerator.free_memory()
    stats = {
        "steps": step,
        "examples": seen,
        "train_loss": running / max(step, 1),
        "seconds": time.perf_counter() - start,
    }  # fmt: skip  (examples: passes on this process)
    return {**stats, "distill": teacher.spec.model_dump()} if teacher is not None else stats


def train_kept(
    model: nn.Module,
    masks: Masks,
    train_ds: datasets.Dataset,
    tokenizer,
    spec: TrainSpec,
    accelerator: Accelerator,
    seed: int = 0,
    desc: str = "fine-tune",
    teacher: TeacherTargets | None = None,
) -> dict:
    """Fine-tune the units `masks` keep in `model`, in place, as `train` under the masks would: by training the
    physically pruned copy (`Masks.pruned_copy`) and writing its weights back (`Masks.write_back`). A gated unit
    gets no gradient under the masks either, so the kept weights take the same updates (dropout draws aside),
    while each pass costs the pruned model's FLOPs instead of the full width's. Returns `train`'s figures."""
    full = accelerator.unwrap_model(model)
    pruned = masks.pruned_copy(full).to(accelerator.device)
    info = train(pruned, train_ds, tokenizer, spec, accelerator, seed=seed, desc=desc, teacher=teacher)
    masks.write_back(full, accelerator.unwrap_model(pruned))
    return info
