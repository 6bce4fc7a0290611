"""Which residual channels a step keeps, and how many: the width of units 'hidden', named or allocated.

How many, when `prune.hidden_size` names the width: the steps narrow the stream from the model's width to it in equal
shares, each width on `prune.hidden_multiple`'s grid, the last goal at the named width (a top-up step at the same goal
keeps its width). When it names none, the width is allocated like the other kinds: each slice of a step's measured
allocation may also offer the next width down the grid (`offered_width`, down to one `hidden_multiple`), priced by its
measured loss per millisecond (or FLOP) saved against heads, neurons and layers (`pruning.allocation`).
Which: the channels whose normalised activations are largest, summed over every stream LayerNorm, on the step's
scoring batches, with the model as the current masks compute it (Minitron's activation score for embedding
channels). One set for the whole stream, so the score is one number per channel, whatever the criterion that
scores heads and neurons; removed channels score -inf and never come back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from compressor.pruning.masking import gated
from compressor.pruning.units import Masks
from compressor.recipe import PruneSpec, RecipeError
from compressor.sources.batches import model_inputs
from compressor.surgery.arch import config_width, original_hidden, present_hidden
from compressor.surgery.width import stream_norms, width_refusal


def check_width(config, spec: PruneSpec) -> None:
    """Refuse, from the model config alone, a width cut this model cannot take: an architecture that cannot cut it, a
    `hidden_size` that is not below the model's width, or an allocated width whose grid has no width below it."""
    if "hidden" not in spec.units:
        return
    reason = width_refusal(config)
    if reason is not None:
        raise RecipeError(f"prune.units: 'hidden' cannot be cut on this model: {reason}; expected units without it")
    width = config_width(config)
    if spec.hidden_size is None and offered_width(width, width, None, spec.hidden_multiple) is None:
        raise RecipeError(f"prune.hidden_multiple: {spec.hidden_multiple} leaves no width below the model's {width} "
                          "to allocate; expected a smaller multiple")  # fmt: skip
    if spec.hidden_size is not None and spec.hidden_size >= width:
        raise RecipeError(f"prune.hidden_size: {spec.hidden_size} is not below the model's width {width}; expected "
                          f"a smaller multiple of prune.hidden_multiple ({spec.hidden_multiple})")  # fmt: skip


def width_at(original: int, target: int, multiple: int, goal: int, goals: int) -> int:
    """The residual width kept after goal `goal` (0-based) of `goals`: from `original` to `target` in equal shares,
    rounded to `multiple` (never above the width before, never below `target`)."""
    share = (original - target) * (goal + 1) / max(goals, 1)
    width = original - int(round(share / multiple)) * multiple
    return max(target, min(original, width))


def width_grid(original: int, floor: int | None, multiple: int) -> list[int]:
    """Every width below `original` a step may keep, widest first: `original` less whole `multiple`s, down to `floor`
    (None, an allocated width: down to one `multiple`)."""
    lowest = multiple if floor is None else floor
    return list(range(original - multiple, lowest - 1, -multiple))


def offered_width(current: int, original: int, floor: int | None, multiple: int) -> int | None:
    """The next width down the grid from `current` (`width_grid`), or None at the floor."""
    return next((w for w in width_grid(original, floor, multiple) if w < current), None)


def channel_scores(model: nn.Module, masks: Masks, batches: Sequence[dict[str, torch.Tensor]]) -> torch.Tensor:
    """[original width] float: per residual channel, the mean |output| of every stream LayerNorm over `batches`,
    summed over the norms, as `model` computes under `masks`; channels `masks` has removed score -inf."""
    present = present_hidden(model)
    total = torch.zeros(len(present), dtype=torch.float64)

    def add(_module: nn.Module, _args: tuple, output: torch.Tensor) -> None:
        total.add_(output.detach().abs().double().reshape(-1, output.shape[-1]).mean(0).cpu())

    hooks = [norm.register_forward_hook(add) for norm in stream_norms(model)]
    device = next(model.parameters()).device
    try:
        with torch.no_grad(), gated(model, masks.head_gates().to(device), _neurons(masks, device), masks.hidden):
            for batch in batches:
                model(**{k: v.to(device) for k, v in model_inputs(batch).items()})
    finally:
        for hook in hooks:
            hook.remove()
    scores = torch.full((original_hidden(model),), float("-inf"), dtype=torch.float64)
    scores[present] = total
    if masks.hidden is not None:
        scores[~masks.hidden] = float("-inf")
    return scores.float()


def narrow(masks: Masks, scores: torch.Tensor, width: int) -> tuple[Masks, list[int]]:
    """`masks` keeping the `width` best-scored channels, and the original ids it removes now (none when it keeps
    `width` or fewer already)."""
    if masks.hidden is None or int(masks.hidden.sum()) <= width:
        return masks, []
    alive = scores.float().masked_fill(~masks.hidden, float("-inf"))  # a removed channel never comes back
    keep = torch.zeros_like(masks.hidden)
    keep[torch.topk(alive, width).indices] = True
    removed = (masks.hidden & ~keep).nonzero().flatten().tolist()
    return masks.narrowed(keep & masks.hidden), removed


def width_narrower(channels: torch.Tensor, multiple: int) -> Callable[[Masks], Masks | None]:
    """For an allocated width: a function giving masks one step of the `multiple` grid narrower, keeping the
    best-`channels`-scored channels (`narrow`), or None at the grid's floor (`offered_width`)."""

    def narrower(masks: Masks) -> Masks | None:
        width, original = masks.width(), len(masks.hidden)
        to = offered_width(width, original, None, multiple)
        return None if to is None else narrow(masks, channels, to)[0]

    return narrower


def _neurons(masks: Masks, device: torch.device) -> torch.Tensor | None:
    gates = masks.neuron_gates()
    return None if gates is None else gates.to(device)
