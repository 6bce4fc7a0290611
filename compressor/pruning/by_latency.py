"""Selection under a latency table: which units a speed-up step removes, and which it gives back.

`select_by_latency` removes the units with the lowest importance per predicted millisecond saved, one head or one
block of neurons at a time, until the table predicts the goal; `restore_by_latency` is its mirror for a step measured
past its goal (`Budget.give_back`): the step's own units with the highest importance per millisecond added come back
while the table still predicts the goal. `widths_of` turns masks into the per-layer widths the table reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compressor.pruning.latency import LatencyTable, Widths
from compressor.pruning.latency.probe import NEURON_BLOCK
from compressor.pruning.units import Masks, UnitPlan, layers_with_units
from compressor.surgery.cost import UnitCosts

FLOOR_SHARE = 0.1  # a unit saves at least this share of its FLOP-proportional milliseconds (flat grid cells)


def widths_of(alive: Masks, dims) -> Widths:
    """Per-layer (heads, neurons) kept; a kind missing from `alive` counts as full width."""
    layers = dims.layers
    heads = alive["heads"].sum(1).tolist() if "heads" in alive else [dims.heads] * layers
    neurons = alive["neurons"].sum(1).tolist() if "neurons" in alive else [dims.intermediate] * layers
    return Widths(heads=tuple(int(h) for h in heads), neurons=tuple(int(n) for n in neurons))


@dataclass(frozen=True)
class _Move:
    """One candidate removal under a latency budget: importance per millisecond saved, lower goes first."""

    ratio: float
    kind: str
    members: tuple[tuple[int, int], ...]  # (layer, original id)


def _floor_ms(table: LatencyTable, costs: UnitCosts, kind: str, count: int) -> float:
    full = table.layer_ms(table.dims.heads, table.dims.intermediate)
    return FLOOR_SHARE * full * count * costs.of(kind) / costs.layer


def _layer_moves(layer: int, scores: dict, alive: Masks, widths: Widths, table, costs, min_heads: int) -> list[_Move]:
    """Every head of `layer` that may go, and its lowest-scored block of neurons (non-uniform widths)."""
    h, n = widths.heads[layer], widths.neurons[layer]
    moves = []
    if "heads" in scores and h > min_heads:
        ms = max(table.marginal_ms(h, n, "head", 1), _floor_ms(table, costs, "heads", 1))
        for head in alive["heads"][layer].nonzero().flatten().tolist():
            moves.append(_Move(float(scores["heads"][layer, head]) / ms, "heads", ((layer, head),)))
    if "neurons" in scores and n > 0:
        ids = _lowest(scores["neurons"][layer], alive["neurons"][layer], min(NEURON_BLOCK, n))
        ms = max(table.marginal_ms(h, n, "neurons", len(ids)), _floor_ms(table, costs, "neurons", len(ids)))
        importance = float(scores["neurons"][layer, ids].sum())
        moves.append(_Move(importance / ms, "neurons", tuple((layer, i) for i in ids)))
    return moves


def _uniform_move(scores: dict, alive: Masks, widths: Widths, table, costs) -> list[_Move]:
    """One block of neurons from every layer at once (equal FFN widths); each layer keeps at least one neuron."""
    rows = [layer for layer, n in enumerate(widths.neurons) if n > 1]
    if not rows or "neurons" not in scores or len(rows) < sum(1 for n in widths.neurons if n > 0):
        return []
    count = min(NEURON_BLOCK, min(widths.neurons[r] for r in rows) - 1)
    members, importance, ms = [], 0.0, 0.0
    for layer in rows:
        ids = _lowest(scores["neurons"][layer], alive["neurons"][layer], count)
        members += [(layer, i) for i in ids]
        importance += float(scores["neurons"][layer, ids].sum())
        h, n = widths.heads[layer], widths.neurons[layer]
        ms += max(table.marginal_ms(h, n, "neurons", count), _floor_ms(table, costs, "neurons", count))
    return [_Move(importance / ms, "neurons", tuple(members))]


def _lowest(scores: torch.Tensor, alive: torch.Tensor, count: int) -> list[int]:
    """Original ids of the `count` lowest-scored alive units of one layer (ties by id)."""
    ids = alive.nonzero().flatten()
    order = torch.argsort(scores[ids].float(), stable=True)[:count]
    return sorted(int(i) for i in ids[order])


def select_by_latency(
    scores: dict[str, torch.Tensor],
    alive: Masks,
    table: LatencyTable,
    goal: float,
    costs: UnitCosts,
    min_heads_per_layer: int = 0,
    uniform_ffn: bool = False,
) -> UnitPlan:
    """Remove the units with the lowest importance per predicted millisecond saved until `table` predicts a speed-up
    of at least `goal` over the original, one head or one block of `NEURON_BLOCK` neurons at a time (the marginal
    cost of a layer's next unit changes as it narrows, so it is looked up again after every removal).

    `uniform_ffn` removes neuron blocks from every layer at once and keeps a head and a neuron per layer. Returns
    the unit plan of the new removals (every kind in `scores`, possibly empty); stops early when nothing is left.
    """
    min_heads = max(min_heads_per_layer, 1 if uniform_ffn else 0)
    alive = {kind: mask.clone() for kind, mask in alive.items()}
    plan: UnitPlan = {kind: {} for kind in scores}
    full = table.dims.full()
    while table.speedup(full, widths := widths_of(alive, table.dims)) < goal:
        moves = _uniform_move(scores, alive, widths, table, costs) if uniform_ffn else []
        for layer in range(table.dims.layers):
            layer_moves = _layer_moves(layer, scores, alive, widths, table, costs, min_heads)
            moves += [m for m in layer_moves if not (uniform_ffn and m.kind == "neurons")]
        if not moves:
            break
        best = min(moves, key=lambda m: (m.ratio, m.kind, m.members))
        for layer, unit in best.members:
            alive[best.kind][layer, unit] = False
            plan[best.kind].setdefault(layer, []).append(unit)
    return {kind: {k: sorted(v) for k, v in sorted(layers.items())} for kind, layers in plan.items()}


def _highest(scores: torch.Tensor, among: torch.Tensor, count: int) -> list[int]:
    """Original ids of the `count` highest-scored units of one layer's `among` mask (ties by id)."""
    ids = among.nonzero().flatten()
    order = torch.argsort(-scores[ids].float(), stable=True)[:count]
    return sorted(int(i) for i in ids[order])


def _restore_moves(scores: dict, alive: dict, removed: dict, table: LatencyTable, costs: UnitCosts) -> list[_Move]:
    """Each unit of `removed` that may come back, in a layer that still has units (a layer the step dropped whole
    stays dropped, and an attention left with no head stays so: one head back would not meet `min_heads_per_layer`):
    every head, and the layer's best-scored block of neurons, each with its importance per millisecond added."""
    widths, moves, kept = widths_of(alive, table.dims), [], layers_with_units(alive)
    for layer in range(table.dims.layers):
        if not kept[layer]:
            continue
        h, n = widths.heads[layer], widths.neurons[layer]
        if "heads" in scores and h > 0 and bool(removed["heads"][layer].any()):  # an emptied attention stays empty
            ms = max(table.layer_ms(h + 1, n) - table.layer_ms(h, n), _floor_ms(table, costs, "heads", 1))
            for head in removed["heads"][layer].nonzero().flatten().tolist():
                moves.append(_Move(float(scores["heads"][layer, head]) / ms, "heads", ((layer, head),)))
        if "neurons" in scores and bool(removed["neurons"][layer].any()):
            ids = _highest(scores["neurons"][layer], removed["neurons"][layer], NEURON_BLOCK)
            added = table.layer_ms(h, n + len(ids)) - table.layer_ms(h, n)
            ms = max(added, _floor_ms(table, costs, "neurons", len(ids)))
            importance = float(scores["neurons"][layer, ids].sum())
            moves.append(_Move(importance / ms, "neurons", tuple((layer, i) for i in ids)))
    return moves


def restore_by_latency(
    scores: dict[str, torch.Tensor],
    alive: Masks,
    removed: dict[str, torch.Tensor],
    table: LatencyTable,
    goal: float,
    costs: UnitCosts,
) -> UnitPlan:
    """The mirror of `select_by_latency` for a step that went past its goal: units of `removed` to put back into
    `alive`, the highest importance per predicted millisecond added first, one head or block at a time, as long as
    `table` still predicts a speed-up of at least `goal`. Returns the unit plan of the units to restore (possibly
    empty: nothing fits, or the table already predicts less than `goal`)."""
    alive = {kind: mask.clone() for kind, mask in alive.items()}
    removed = {kind: mask.clone() for kind, mask in removed.items()}
    plan: UnitPlan = {kind: {} for kind in alive}
    full = table.dims.full()
    while True:
        moves = _restore_moves(scores, alive, removed, table, costs)
        moves.sort(key=lambda m: (-m.ratio, m.kind, m.members))
        for move in moves:
            trial = {kind: mask.clone() for kind, mask in alive.items()}
            for layer, unit in move.members:
                trial[move.kind][layer, unit] = True
            if table.speedup(full, widths_of(trial, table.dims)) >= goal:
                break
        else:
            break
        alive = trial
        for layer, unit in move.members:
            removed[move.kind][layer, unit] = False
            plan[move.kind].setdefault(layer, []).append(unit)
    return {kind: {k: sorted(v) for k, v in sorted(layers.items())} for kind, layers in plan.items()}
