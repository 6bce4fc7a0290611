"""`fisher`: the diagonal Fisher information of each unit's gate, Kwon et al. 2022's mask-search criterion.

I_u = E_x (∂L(x)/∂ξ_u)² at ξ = 1, the squared gradient *per example* (taylor takes |Σ ∂L/∂ξ| per batch), which is
the loss's curvature along the gate under the Fisher approximation: the loss a unit's removal costs to second
order, without any fine-tuning afterwards. Heads and FFN neurons get scores in the same unit (loss), so they compete
for one FLOP or speed-up budget directly.

Per-example gradients come from one backward per batch: W_O's (or the FFN down-projection's) gated input z' is
recorded, and ∂L_n/∂ξ_u = Σ_{tokens, unit columns} z'·∂L/∂z' for example n (examples do not interact in an eval
forward). `labels: model` (and batches without labels) takes the expectation over the model's own predicted
distribution instead of gold labels, E_{y~p(·|x)} (∂ log p(y|x)/∂ξ_u)²: the curvature of the KL divergence to the
unpruned model's predictions, which needs no labels (one backward per class).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from compressor.pruning.criteria.registry import ScoreContext, mean_over_processes, register
from compressor.surgery.arch import arch_spec, get_path, head_size, layers, present_heads, present_neurons


def _record_inputs(ctx: ScoreContext) -> tuple[dict[int, torch.Tensor], list]:
    """Forward hooks recording each layer's gated projection input (heads: W_O; neurons: the down-projection)."""
    spec, model = arch_spec(ctx.model), ctx.model
    path = spec.out_proj if ctx.unit == "heads" else spec.ffn_out
    present = present_heads(model) if ctx.unit == "heads" else present_neurons(model)
    seen: dict[int, torch.Tensor] = {}
    handles = [
        get_path(layer, path).register_forward_hook(lambda _m, args, _o, i=i: seen.__setitem__(i, args[0]))
        for i, layer in enumerate(layers(model))
        if present[i]
    ]
    return seen, handles


def _per_example(ctx: ScoreContext, seen: dict[int, torch.Tensor], loss: torch.Tensor) -> torch.Tensor:
    """[batch, layers, units] gradients of each example's loss w.r.t. each unit's gate."""
    size = head_size(ctx.model) if ctx.unit == "heads" else 1
    present = present_heads(ctx.model) if ctx.unit == "heads" else present_neurons(ctx.model)
    order = sorted(seen)
    grads = torch.autograd.grad(loss, [seen[i] for i in order], retain_graph=True)
    out = torch.zeros(next(iter(seen.values())).shape[0], *ctx.alive.shape, device=loss.device)
    for i, z, g in zip(order, (seen[i] for i in order), grads, strict=True):
        per_token = (z.detach() * g).reshape(*z.shape[:-1], len(present[i]), size).sum(-1)  # [batch, ..., units]
        out[:, i, present[i]] = per_token.reshape(z.shape[0], -1, len(present[i])).sum(1)
    return out


@register("fisher", units=("heads", "neurons"))
def fisher(ctx: ScoreContext, *, labels: Literal["gold", "model"] = "gold") -> torch.Tensor:
    """[layers, units] mean squared per-example gradient of the loss w.r.t. each unit's gate at ξ = 1.

    `labels="gold"`: cross-entropy to the batch's labels (the empirical Fisher); `"model"`, or batches without
    labels: the expectation over the model's own predicted classes (the true Fisher; the curvature of the KL to its
    predictions), one backward per class.
    """
    model = ctx.model
    model.eval()
    gates = ctx.gates()
    total = torch.zeros_like(gates)
    count = 0
    seen, handles = _record_inputs(ctx)
    try:
        with ctx.gated(gates), torch.enable_grad():
            for batch in tqdm(ctx.batches, desc=f"fisher: {ctx.unit}", leave=False):
                batch = {k: v.to(ctx.device) for k, v in batch.items()}
                gold = batch.pop("labels", None)
                logits = model(**batch).logits
                total += _batch_fisher(ctx, seen, logits, None if labels == "model" else gold).sum(0)
                count += logits.shape[0]
    finally:
        for handle in handles:
            handle.remove()
    return mean_over_processes(total, count, ctx.accelerator).cpu()


def _batch_fisher(ctx: ScoreContext, seen, logits: torch.Tensor, gold: torch.Tensor | None) -> torch.Tensor:
    """[batch, layers, units] squared gate gradients of one batch (expected over predicted classes without `gold`)."""
    log_probs = F.log_softmax(logits, -1)
    if gold is not None:
        return _per_example(ctx, seen, F.nll_loss(log_probs, gold, reduction="sum")).pow(2)
    probs = log_probs.detach().exp()
    out = 0.0
    for y in range(logits.shape[-1]):
        grad = _per_example(ctx, seen, -log_probs[:, y].sum())
        out = out + probs[:, y, None, None] * grad.pow(2)
    return out
