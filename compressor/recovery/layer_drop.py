"""The layer-dropping baseline every pruned model is compared with (`prune.baseline: layer_drop`).

Pruning must earn its complexity against the simplest structured alternative: drop whole layers from the top of
the original model (no importance scores) until its encoder FLOPs are nearest the pruned model's, fine-tune it with
the same recovery budget (the same number of training examples as all pruning steps together, and the same teacher
when distillation is on). Its test predictions are compared with the pruned model's by `compressor.bench.quality`
(`compare_on`: accuracy and McNemar's exact test).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import datasets
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn

from compressor.pruning.units import apply_unit_plan
from compressor.recipe import TrainSpec
from compressor.recovery.distill import TeacherTargets, fill
from compressor.recovery.draws import baseline_examples, drawn_examples, recovery_spec  # noqa: F401  (re-exported)
from compressor.recovery.train import train
from compressor.surgery.arch import num_layers, original_ffn_size, original_num_heads
from compressor.surgery.cost import masked_flops


def layers_to_drop(original: nn.Module, target_flops: int, seq_len: int) -> int:
    """How many top layers to drop so the encoder FLOPs are nearest `target_flops` (at least one, never all; ties
    go to the smaller model)."""
    total, layers = masked_flops(original, {}, seq_len), num_layers(original)
    per_layer = total / layers
    return min(range(1, layers), key=lambda k: (abs(total - k * per_layer - target_flops), -k))


def drop_top_layers(original: nn.Module, count: int, already: int = 0) -> nn.Module:
    """A copy of `original` with its top `count` layers removed whole (identity), the rest untouched. `already`:
    how many top layers `original` has lost before (a family's previous baseline); they are not touched again."""
    layers, heads, width = num_layers(original), original_num_heads(original), original_ffn_size(original)
    top = range(layers - count, layers - already)
    plan = {"heads": {k: list(range(heads)) for k in top}, "neurons": {k: list(range(width)) for k in top}}
    return apply_unit_plan(copy.deepcopy(original), plan).eval()


@dataclass
class LayerDropBaseline:
    """The fine-tuned layer-dropped model and how it was made."""

    model: nn.Module
    layers_dropped: int
    info: dict


def layer_drop_baseline(
    original: nn.Module,
    target_flops: int,
    seq_len: int,
    train_ds: datasets.Dataset,
    tokenizer,
    finetune: TrainSpec | None,
    steps: int,
    accelerator: Accelerator,
    *,
    seed: int = 0,
    teacher: TeacherTargets | None = None,
    start: LayerDropBaseline | None = None,
) -> LayerDropBaseline:
    """Drop the top layers of `original` to the FLOPs nearest `target_flops` and fine-tune the copy with the
    recovery budget of `steps` pruning steps of `finetune` (on every process under `accelerate launch`).

    `teacher` (the pruning run's cached targets) makes the baseline distil exactly as the pruning steps did; the
    examples it draws beyond theirs get their logits from `original` (the teacher), computed here.

    `start` continues a family's previous baseline instead of starting from `original`: its fine-tuned model loses
    the further top layers this target needs and trains for the `steps` pruning took since that member, so each
    baseline has had, in all, the recovery budget of the member it is compared with (as the members have: they too
    are one model pruned and trained on). Eleven arguments: what the pruning run's recovery used (split, tokenizer,
    fine-tune, steps, processes, teacher), passed singly so the baseline is trained exactly as the members were."""
    count = layers_to_drop(original, target_flops, seq_len)
    if start is None:
        model = drop_top_layers(original, count)
    else:
        count = max(count, start.layers_dropped)
        model = drop_top_layers(start.model, count, already=start.layers_dropped)
    model = model.to(accelerator.device)
    spec = recovery_spec(finetune, steps, len(train_ds)) if steps > 0 else None
    info = {
        "kind": "layer_drop",
        "layers_dropped": count,
        "encoder_flops_per_example": masked_flops(model, {}, seq_len),
        "target_flops_per_example": int(target_flops),
        "seq_len": seq_len,
        "finetune": None,
        "continued_from_layers_dropped": None if start is None else start.layers_dropped,
    }
    if spec is not None:
        if teacher is not None:  # it draws more examples than any step: the teacher adds the ones it lacks
            drawn = baseline_examples(len(train_ds), finetune, steps, seed)
            teacher = fill(teacher, original, train_ds, tokenizer, accelerator, drawn)
        set_seed(seed)  # dropout as well as the draw: the same baseline whatever ran before (a resumed run too)
        info["finetune"] = train(
            model, train_ds, tokenizer, spec, accelerator, seed=seed, desc="baseline", teacher=teacher
        )
    return LayerDropBaseline(accelerator.unwrap_model(model).cpu().eval(), count, info)


__all__ = [
    "LayerDropBaseline",
    "baseline_examples",
    "drop_top_layers",
    "layer_drop_baseline",
    "layers_to_drop",
    "recovery_spec",
]
