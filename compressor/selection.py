"""From scores to a pruning plan: which heads to remove at each step of the iterative schedule."""

from __future__ import annotations

import torch

from compressor.recipe import RecipeError


def schedule(total_heads: int, target: float, steps: int) -> list[int]:
    """Cumulative number of heads removed after each step (evenly spread, last step hits the target)."""
    goal = round(target * total_heads)
    return [round(goal * (k + 1) / steps) for k in range(steps)]


def check_feasible(layers: int, heads: int, target: float, min_per_layer: int) -> None:
    """Raise RecipeError when the target and per-layer minimum cannot both hold for this model."""
    total = layers * heads
    goal = round(target * total)
    if goal >= total:
        raise RecipeError(f"prune.target: {target} would remove all {total} heads; expected a fraction leaving ≥1 head")
    if goal == 0:
        raise RecipeError(f"prune.target: {target} removes no head of {total}; expected at least 1/{total}")
    if min_per_layer > heads:
        raise RecipeError(
            f"prune.min_heads_per_layer: {min_per_layer} exceeds the {heads} heads per layer; expected ≤ {heads}"
        )
    if total - goal < min_per_layer * layers:
        raise RecipeError(
            f"prune.min_heads_per_layer: keeping {min_per_layer} heads in each of {layers} layers needs "
            f"{min_per_layer * layers} heads but target {target} leaves {total - goal}; "
            f"expected ≤ {(total - goal) // layers}"
        )


def select_heads(
    scores: torch.Tensor, alive: torch.Tensor, n_remove: int, scope: str = "global", min_per_layer: int = 0
) -> dict[int, list[int]]:
    """Choose `n_remove` alive heads with the lowest scores.

    global: lowest scores anywhere, never taking a layer below `min_per_layer` alive heads.
    per_layer: removals spread over layers in proportion to their alive heads (largest remainders), lowest
    scores within each layer. Ties are broken by (layer, head) order so selection is deterministic.
    """
    scores = scores.float().masked_fill(~alive, float("inf"))
    alive_per_layer = alive.sum(1).tolist()
    plan: dict[int, list[int]] = {}
    if scope == "per_layer":
        quotas = _per_layer_quotas(alive_per_layer, n_remove, min_per_layer)
        for layer, quota in enumerate(quotas):
            if quota:
                order = torch.argsort(scores[layer], stable=True)[:quota]
                plan[layer] = sorted(int(h) for h in order)
        return plan
    flat = torch.argsort(scores.flatten(), stable=True)
    heads = scores.shape[1]
    removed = 0
    for idx in flat.tolist():
        if removed == n_remove:
            break
        layer, head = divmod(idx, heads)
        if not alive[layer, head] or alive_per_layer[layer] <= min_per_layer:
            continue
        plan.setdefault(layer, []).append(head)
        alive_per_layer[layer] -= 1
        removed += 1
    return {k: sorted(v) for k, v in sorted(plan.items())}


def _per_layer_quotas(alive: list[int], n_remove: int, min_per_layer: int) -> list[int]:
    room = [max(0, a - min_per_layer) for a in alive]
    total_alive = sum(alive)
    exact = [n_remove * a / total_alive for a in alive]
    quotas = [min(int(e), r) for e, r in zip(exact, room, strict=True)]
    order = sorted(range(len(alive)), key=lambda i: (-(exact[i] - int(exact[i])), i))
    while sum(quotas) < n_remove:
        progressed = False
        for i in order:
            if sum(quotas) < n_remove and quotas[i] < room[i]:
                quotas[i] += 1
                progressed = True
        if not progressed:
            break
    return quotas


def plan_to_mask(plan: dict[int, list[int]], alive: torch.Tensor) -> torch.Tensor:
    """`alive` with the plan's heads switched off."""
    out = alive.clone()
    for layer, heads in plan.items():
        out[layer, heads] = False
    return out


def mask_to_plan(alive: torch.Tensor) -> dict[int, list[int]]:
    """Cumulative plan (original ids) of every dead head."""
    return {layer: [int(h) for h in (~row).nonzero().flatten()] for layer, row in enumerate(alive) if (~row).any()}
