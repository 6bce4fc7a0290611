"""From scores to a pruning plan: which heads (or heads and FFN neurons) to remove at each step of the schedule.

Heads alone: `select_heads` removes a count. Several unit kinds: `select_units` lets heads and neurons compete
on one scale, importance per FLOP saved (score / `surgery.cost.unit_costs`), and removes the lowest until a FLOP goal
is met, overshooting it by less than one unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from compressor.pruning.units import Masks
from compressor.recipe import Recipe, RecipeError
from compressor.surgery.cost import UnitCosts


def removed_fractions(target: float, steps: int, shape: str = "linear") -> list[float]:
    """Cumulative fraction removed after each step, the last exactly `target`. "linear": equal amounts per step;
    "geometric": each step removes the same share of what is left, so late steps, on a model with little to spare,
    remove less (72 heads to 18 in 6 steps: 15, 12, 9, 7, 6, 5 instead of 9 each)."""
    if shape == "geometric":
        return [1 - (1 - target) ** ((k + 1) / steps) for k in range(steps - 1)] + [target]
    return [target * (k + 1) / steps for k in range(steps)]


def family_amounts(targets: list[float], steps: int, scale: str) -> tuple[list[float], list[int]]:
    """Cumulative amounts per step through several ascending `targets` (a model family), and the index of the step
    that reaches each target exactly.

    `scale` says how amounts move: "linear" (fractions removed, equal amounts per step), "geometric" (fractions
    removed, the same share of what is left per step) or "speedup" (factors, the same relative gain per step). The
    `max(steps, len(targets))` steps are shared among the segments between targets in proportion to each segment's
    length on that scale (at least one each, largest remainders first), so no segment is rushed.
    """
    position = {
        "linear": lambda a: a,
        "geometric": lambda a: -math.log1p(-a),
        "speedup": math.log,
    }[scale]
    starts = [0.0 if scale != "speedup" else 1.0, *targets[:-1]]
    lengths = [position(b) - position(a) for a, b in zip(starts, targets, strict=True)]
    counts = _share(max(steps, len(targets)), lengths)
    amounts, members = [], []
    for a, b, n in zip(starts, targets, counts, strict=True):
        for j in range(1, n):
            amounts.append(_between(a, b, j / n, scale))
        amounts.append(b)
        members.append(len(amounts) - 1)
    return amounts, members


def _share(total: int, lengths: list[float]) -> list[int]:
    """`total` steps over segments of `lengths`: one each, the rest by largest remainder of the proportional share."""
    spare = total - len(lengths)
    whole = sum(lengths) or 1.0
    exact = [spare * x / whole for x in lengths]
    counts = [1 + int(e) for e in exact]
    order = sorted(range(len(lengths)), key=lambda i: (-(exact[i] - int(exact[i])), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _between(a: float, b: float, t: float, scale: str) -> float:
    """The amount a share `t` of the way from `a` to `b` on `scale`."""
    if scale == "speedup":
        return a * (b / a) ** t
    if scale == "geometric":
        return 1 - (1 - a) * ((1 - b) / (1 - a)) ** t
    return a + (b - a) * t


def schedule(total_heads: int, target: float, steps: int, shape: str = "linear") -> list[int]:
    """Cumulative number of heads removed after each step (`removed_fractions`; the last step hits the target)."""
    goal = round(target * total_heads)
    return [round(goal * f / target) for f in removed_fractions(target, steps, shape)]


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


def check_flop_budget(
    costs: UnitCosts,
    shape: dict[str, tuple[int, int]],
    flops: float,
    units: list[str],
    min_heads_per_layer: int = 0,
    uniform_ffn: bool = False,
) -> None:
    """Raise RecipeError when removing the fraction `flops` of an unpruned model's encoder FLOPs is impossible
    with the unit kinds in `units` under the per-layer limits. `shape` maps each kind to (layers, per layer)."""
    layers, heads = shape["heads"]
    width = shape["neurons"][1]
    min_heads = max(min_heads_per_layer, 1 if uniform_ffn else 0)
    if min_heads > heads:
        raise RecipeError(f"prune.min_heads_per_layer: {min_heads} exceeds the {heads} heads per layer")
    total = layers * costs.layer
    removable = layers * (heads - min_heads) * costs.head
    if "neurons" in units:
        removable += layers * (width - (1 if uniform_ffn else 0)) * costs.neuron
    if flops * total > removable:
        raise RecipeError(
            f"prune.budget.value: a FLOP fraction of {flops} cannot be reached with units {units}; expected ≤ "
            f"{removable / total:.3f} (heads kept per layer ≥ {min_heads}{', uniform_ffn' if uniform_ffn else ''})"
        )


def flop_schedule(total_flops: int, target: float, steps: int, shape: str = "linear") -> list[int]:
    """Cumulative encoder FLOPs removed after each step (`removed_fractions`; the last hits `target` × total)."""
    return [round(total_flops * f) for f in removed_fractions(target, steps, shape)]


@dataclass(frozen=True)
class _Candidate:
    """One removable unit (or, with uniform FFN widths, one neuron from every layer at once)."""

    ratio: float  # importance per FLOP: lower goes first
    kind: str
    members: tuple[tuple[int, int], ...]  # (layer, original id) pairs removed together
    cost: int


def _head_candidates(scores: torch.Tensor, alive: torch.Tensor, cost: int) -> list[_Candidate]:
    return [
        _Candidate(float(scores[layer, head]) / cost, "heads", ((layer, head),), cost)
        for layer, head in alive.nonzero().tolist()
    ]


def _neuron_candidates(scores: torch.Tensor, alive: torch.Tensor, cost: int, uniform: bool) -> list[_Candidate]:
    """One candidate per alive neuron; with `uniform`, column k = every layer's k-th lowest alive neuron.

    Uniform columns keep FFN widths equal across layers (the saved model then loads in plain transformers); the
    last neuron of each layer is never offered, so no layer's FFN becomes empty.
    """
    if not uniform:
        return [
            _Candidate(float(scores[layer, n]) / cost, "neurons", ((layer, n),), cost)
            for layer, n in alive.nonzero().tolist()
        ]
    rows = [layer for layer in range(alive.shape[0]) if alive[layer].any()]
    widths = {int(alive[layer].sum()) for layer in rows}
    if len(widths) > 1:
        raise RecipeError(f"prune.uniform_ffn: FFN widths already differ across layers ({sorted(widths)})")
    order = {
        layer: alive[layer].nonzero().flatten()[torch.argsort(scores[layer][alive[layer]], stable=True)]
        for layer in rows
    }
    width, out = (widths.pop() if widths else 0), []
    for k in range(width - 1):
        members = tuple((layer, int(order[layer][k])) for layer in rows)
        total = sum(float(scores[m]) for m in members)
        out.append(_Candidate(total / (cost * len(rows)), "neurons", members, cost * len(rows)))
    return out


def select_units(
    scores: dict[str, torch.Tensor],
    alive: Masks,
    costs: UnitCosts,
    flops_to_remove: int,
    min_heads_per_layer: int = 0,
    uniform_ffn: bool = False,
) -> dict[str, dict[int, list[int]]]:
    """Remove the alive units with the lowest importance per FLOP until at least `flops_to_remove` FLOPs go.

    `scores` / `alive` are keyed by unit kind ("heads" [layers, heads], "neurons" [layers, FFN width]); only
    the kinds present compete. Stops as soon as the goal is met, so the removed FLOPs exceed the goal by less
    than one unit's cost (a uniform neuron column counts as one unit). Ties break by kind, layer, id. Returns a
    unit plan `{kind: {layer: [original ids]}}` of the newly removed units.

    `uniform_ffn` also keeps at least one head per layer, so the result stays loadable by plain transformers.
    """
    if uniform_ffn:
        min_heads_per_layer = max(min_heads_per_layer, 1)
    candidates: list[_Candidate] = []
    if "heads" in scores:
        candidates += _head_candidates(scores["heads"].float(), alive["heads"], costs.head)
    if "neurons" in scores:
        candidates += _neuron_candidates(scores["neurons"].float(), alive["neurons"], costs.neuron, uniform_ffn)
    candidates.sort(key=lambda c: (c.ratio, c.kind, c.members))
    heads_left = alive["heads"].sum(1).tolist() if "heads" in alive else []
    plan: dict[str, dict[int, list[int]]] = {kind: {} for kind in scores}
    removed = 0
    for cand in candidates:
        if removed >= flops_to_remove:
            break
        if cand.kind == "heads":
            layer = cand.members[0][0]
            if heads_left[layer] <= min_heads_per_layer:
                continue
            heads_left[layer] -= 1
        for layer, unit in cand.members:
            plan[cand.kind].setdefault(layer, []).append(unit)
        removed += cand.cost
    return {kind: {k: sorted(v) for k, v in sorted(layers.items())} for kind, layers in plan.items()}


def check_against_model(recipe: Recipe, total_heads: int, max_positions: int | None) -> None:
    """Checks that need the model's config (read before any weights or data load). `prune.steps` is refused (not
    clamped) when a step would remove no head: the schedule is part of the experiment the report describes."""
    from compressor.pruning.selection import schedule

    budget, p = recipe.prune.resolved_budget, recipe.prune  # FLOP / speed-up budgets remove many small units
    goal = round(budget.value * total_heads) if budget.kind == "heads" else None
    cumulative = schedule(total_heads, budget.value, p.steps, p.schedule) if goal else []
    if goal and budget.is_family:  # the family's own schedule (`family_amounts`), each target one step's goal
        cumulative = [round(a * total_heads) for a in family_amounts(budget.targets, p.steps, p.schedule)[0]]
    if any(b <= a for a, b in zip([0, *cumulative], cumulative, strict=False)):
        raise RecipeError(
            f"prune.steps: {recipe.prune.steps} steps for {goal} heads to remove (target {budget.value} of "
            f"{total_heads}) leaves a step removing none; expected at most {goal}"
        )
    check_positions(recipe, max_positions)


def check_positions(recipe: Recipe, max_positions: int | None, whose: str = "the model's") -> None:
    """Every length the run feeds a model (training, bench, budget) fits `max_positions` (`whose` position
    embeddings, for the message); None: unbounded."""
    if max_positions is None:
        return
    lengths = {"data.max_length": recipe.data.max_length}
    if recipe.bench.enabled:
        lengths["bench.seq_lens"] = max(recipe.bench.seq_lens)
    if recipe.prune.budget is not None:
        lengths["prune.budget.seq_len"] = recipe.prune.budget.seq_len
    for field, length in lengths.items():
        if length > max_positions:
            raise RecipeError(
                f"{field}: {length} tokens exceed {whose} {max_positions} position embeddings; "
                f"expected at most {max_positions}"
            )
