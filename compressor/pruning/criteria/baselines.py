"""Baselines every comparison should include: `random`, `magnitude`, `entropy` and the `ablation` oracle."""

from __future__ import annotations

from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from compressor.pruning.criteria.confidence import attention_maps, model_inputs
from compressor.pruning.criteria.registry import ScoreContext, mean_over_processes, register
from compressor.surgery.arch import arch_spec, get_path, head_size, layers, present_heads, present_neurons


@register("random", units=("heads", "neurons"))
def random(ctx: ScoreContext) -> torch.Tensor:
    """[layers, heads] uniform scores from a generator seeded with `ctx.seed`: a seeded random ranking.

    Drawn for every original head (dead ones included) so a head's score depends only on the seed, not on
    which heads are still alive. A criterion that does not beat this is broken.
    """
    generator = torch.Generator().manual_seed(int(ctx.seed))
    return torch.rand(tuple(ctx.alive.shape), generator=generator)


@register("magnitude", units=("heads", "neurons"))
def magnitude(ctx: ScoreContext) -> torch.Tensor:
    """[layers, heads]: L2 norm of the head's slices of W_Q, W_K, W_V (rows) and W_O (columns), biases included.
    For neurons, [layers, FFN width]: L2 norm of the neuron's W_1 row (with its bias) and W_2 column.

    Data-free. Works on physically pruned models: present units are mapped back to original ids.
    """
    if ctx.unit == "neurons":
        return _neuron_magnitude(ctx)
    model, spec, size = ctx.model, arch_spec(ctx.model), head_size(ctx.model)
    scores = torch.zeros(tuple(ctx.alive.shape))
    with torch.no_grad():
        for layer, (module, heads) in enumerate(zip(layers(model), present_heads(model), strict=True)):
            if not heads:
                continue
            attn = get_path(module, spec.self_attn)
            squared = torch.zeros(len(heads))
            for name in spec.qkv:  # a fused Q/K/V Linear holds [Q | K | V] blocks of heads × size rows
                linear = get_path(attn, name)
                rows = linear.weight.float().pow(2).sum(1)
                if linear.bias is not None:
                    rows = rows + linear.bias.float().pow(2)
                squared += rows.reshape(-1, len(heads), size).sum((0, 2)).cpu()
            out = get_path(module, spec.out_proj).weight.float()  # [hidden, heads * size]
            squared += out.pow(2).sum(0).reshape(len(heads), size).sum(1).cpu()
            scores[layer, heads] = squared.sqrt()
    return scores


def _neuron_magnitude(ctx: ScoreContext) -> torch.Tensor:
    model, spec = ctx.model, arch_spec(ctx.model)
    scores = torch.zeros(tuple(ctx.alive.shape))
    with torch.no_grad():
        for layer, (module, ids) in enumerate(zip(layers(model), present_neurons(model), strict=True)):
            if not ids:
                continue
            first, second = get_path(module, spec.ffn_in), get_path(module, spec.ffn_out)
            rows = first.weight.float().pow(2).sum(1)  # a gated W_1: [input | gate] halves, a row in each
            if first.bias is not None:
                rows = rows + first.bias.float().pow(2)
            squared = rows.reshape(-1, len(ids)).sum(0) + second.weight.float().pow(2).sum(0)
            scores[layer, ids] = squared.sqrt().cpu()
    return scores


@register("entropy")
def entropy(ctx: ScoreContext, *, keep: Literal["low", "high"] = "low") -> torch.Tensor:
    """[layers, heads]: ∓ mean attention entropy (nats) over real query tokens, padding keys excluded.

    `keep='low'` (bertology's reading: low entropy = a specialised head) scores -entropy, so focused heads are
    kept; `keep='high'` keeps the broad ones instead.
    """
    total = torch.zeros(ctx.alive.shape, dtype=torch.float64, device=ctx.device)
    for inputs, layer, heads, probs in attention_maps(ctx):
        valid = inputs["attention_mask"].bool()
        plogp = torch.special.xlogy(probs, probs).masked_fill(~valid[:, None, None, :], 0.0)
        ent = -plogp.sum(-1)  # [B, P, T]
        total[layer, heads] += (ent * valid[:, None, :]).sum((0, 2)).double()
    count = sum(int(b["attention_mask"].sum()) for b in ctx.batches)
    mean = mean_over_processes(total, count, ctx.accelerator).float().cpu()
    return -mean if keep == "low" else mean


def _metric(ctx: ScoreContext, gates: torch.Tensor, metric: str, batches: list[dict]) -> float:
    """Mean accuracy or cross-entropy of the gated model over `batches` (no grad)."""
    total, count = 0.0, 0
    with torch.no_grad(), ctx.gated(gates):
        for batch in batches:
            logits = ctx.model(**model_inputs(batch, ctx.device)).logits.float()
            labels = batch["labels"].to(ctx.device)
            if metric == "accuracy":
                total += float((logits.argmax(-1) == labels).sum())
            else:
                total += float(F.cross_entropy(logits, labels, reduction="sum"))
            count += labels.numel()
    reduced = mean_over_processes(torch.tensor(total, device=ctx.device), count, ctx.accelerator)
    return float(reduced)


@register("ablation", units=("heads", "neurons"))
def ablation(
    ctx: ScoreContext,
    *,
    metric: Literal["loss", "accuracy"] = "loss",
    examples: Annotated[int, Field(ge=1)] = 128,
) -> torch.Tensor:
    """[layers, units]: how much worse the model gets when that head (or FFN neuron) alone is masked (the
    expensive oracle: one pass per alive unit).

    Score = loss(head masked) − loss(current model) for `metric='loss'` (the default: smooth, so few ties), or
    accuracy(current) − accuracy(head masked). One forward pass over `examples` scoring examples per alive
    head. A head whose removal *helps* gets a negative score and is removed first.
    """
    ctx.model.eval()
    batches, seen = [], 0
    for batch in ctx.batches:
        if seen >= examples:
            break
        take = min(examples - seen, batch["labels"].shape[0])
        batches.append({k: v[:take] for k, v in batch.items()})
        seen += take
    base_gates = ctx.gates()
    base = _metric(ctx, base_gates, metric, batches)
    scores = torch.zeros(tuple(ctx.alive.shape))
    sign = 1.0 if metric == "loss" else -1.0
    for layer, unit in ctx.alive.nonzero().tolist():
        gates = base_gates.clone()
        gates[layer, unit] = 0.0
        scores[layer, unit] = sign * (_metric(ctx, gates, metric, batches) - base)
    return scores
