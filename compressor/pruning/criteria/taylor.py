"""`taylor`: Michel et al. 2019's head importance I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from compressor.pruning.criteria.registry import ScoreContext, mean_over_processes, register


def normalize_scores(scores: torch.Tensor, alive: torch.Tensor, mode: str) -> torch.Tensor:
    """Michel's per-layer normalisation: divide each layer's scores by their L2 norm over alive heads."""
    if mode == "none":
        return scores
    if mode != "layer":
        raise ValueError(f"prune.criterion.params.normalize: expected 'layer' or 'none', got '{mode}'")
    live = scores * alive
    norm = live.pow(2).sum(dim=1, keepdim=True).sqrt().clamp_min(1e-20)
    return scores / norm


@register("taylor", units=("heads", "neurons"))
def taylor(
    ctx: ScoreContext, *, normalize: Literal["layer", "none"] = "layer", label_free: bool = False
) -> torch.Tensor:
    """[layers, units] importance: |∂L/∂ξ_u| per batch (ξ a head gate, or an FFN neuron gate for neurons),
    summed over batches, divided by the number of examples.

    The absolute value is taken per batch (as in Michel's released code) rather than per example, which would
    need one backward pass per example. `label_free=True` replaces gold labels by the model's own argmax
    predictions: the KL to its own (detached) distribution has zero gradient at ξ = 1, so the cross-entropy to
    its own hard predictions is the usable label-free loss. `normalize='layer'` is Michel's per-layer L2
    normalisation before global ranking.
    """
    model = ctx.model
    model.eval()
    gates = ctx.gates().requires_grad_(True)
    total = torch.zeros_like(gates)
    count = 0
    with ctx.gated(gates):
        for batch in ctx.batches:
            batch = {k: v.to(ctx.device) for k, v in batch.items()}
            labels = batch.pop("labels", None)
            logits = model(**batch).logits
            if label_free or labels is None:
                labels = logits.detach().argmax(-1)
            loss = F.cross_entropy(logits, labels, reduction="sum")
            (grad,) = torch.autograd.grad(loss, gates)
            total += grad.abs()
            count += logits.shape[0]
    scores = mean_over_processes(total, count, ctx.accelerator).cpu()
    return normalize_scores(scores, ctx.alive.cpu(), normalize)
