"""Where a cut model's weights come from in the model it was cut from, and how trained weights go back there.

Surgery only selects weights, so a cut can be mapped by cutting a copy whose weights hold their own positions
(`cut_positions`); `write_back` copies a cut model's (since trained) weights into the slots they came from. The masked
model of the pruning loop is trained at the pruned model's cost this way (`pruning.units.Masks.write_back`). The
cut itself is passed in (any surgery of this stage, `surgery.width.cut_units` for a run's masks): this module imports
none of it, so no cut calls back up into a module that depends on it.
"""

from __future__ import annotations

import copy
from bisect import bisect_right
from collections.abc import Callable

import torch
from torch import nn

Positions = list[tuple[str | None, torch.Tensor]]


def cut_positions(model: nn.Module, cut: Callable[[nn.Module], nn.Module]) -> Positions:
    """Where the weights of `cut(copy of model)` come from in `model`: for each parameter of the cut copy, in
    `named_parameters` order, the name of `model`'s parameter it was sliced from and the flat positions it kept
    there (None and no positions for a parameter left with no element). `cut` applies surgery in place.

    Surgery only selects weights, never mixes or makes them, so cutting a copy whose every weight holds its own
    global position (float64, exact) reads the map off the result. A cut that made a weight of its own, or mixed
    two, is refused (RuntimeError) rather than mapped wrongly."""
    ids, spans, offset = copy.deepcopy(model), [], 0
    with torch.no_grad():
        for name, param in ids.named_parameters():
            param.data = torch.arange(offset, offset + param.numel(), dtype=torch.float64).view(param.shape)
            spans.append((offset, name, param.numel()))
            offset += param.numel()
    starts, out = [start for start, _, _ in spans], []
    for name, param in cut(ids).named_parameters():
        flat = param.detach().reshape(-1)
        if flat.numel() == 0:
            out.append((None, flat.long()))
            continue
        start, source, numel = spans[bisect_right(starts, float(flat[0])) - 1]
        local = flat.long() - start
        selected = torch.equal(flat, flat.round()) and int(local.min()) >= 0 and int(local.max()) < numel
        # a selection repeats no position; a tensor kept whole, the usual case, is told so without sorting it
        whole = selected and local.numel() == numel and torch.equal(local, torch.arange(numel))
        if not (whole or selected and local.unique().numel() == local.numel()):  # a selection repeats nothing
            raise RuntimeError(f"surgery made or mixed weights in {name}: its positions in the model are unknown")
        out.append((source, local))
    return out


def write_back(model: nn.Module, cut_model: nn.Module, positions: Positions) -> None:
    """Copy the weights of `cut_model` (cut from `model` as `positions` says, since changed, e.g. trained) into
    the slots of `model` they were cut from, in place; the slots surgery dropped keep their weights."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for (source, where), (_, param) in zip(positions, cut_model.named_parameters(), strict=True):
            if source is not None:
                target = params[source]
                target.view(-1).index_copy_(0, where.to(target.device), param.detach().reshape(-1).to(target))
