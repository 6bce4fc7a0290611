"""`confidence` (Voita et al. 2019): a head's mean maximum attention weight, plus shared attention-map plumbing.

Also home of `attention_maps`, the forward-only iteration over per-layer attention probabilities that `entropy`
(baselines.py) reuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import torch

from compressor.pruning.criteria.registry import ScoreContext, mean_over_processes, register
from compressor.pruning.masking import AttentionRecorder, gated
from compressor.sources.batches import MODEL_INPUTS
from compressor.surgery.arch import present_heads


def model_inputs(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors a classifier's forward takes, on `device` (labels and extra columns dropped)."""
    return {k: v.to(device) for k, v in batch.items() if k in MODEL_INPUTS}


def special_positions(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: list[int] | None = None
) -> torch.Tensor:
    """[batch, tokens] bool: True at special tokens ([CLS]/[SEP], <s>/</s>) among the real tokens.

    With `special_ids` (from a tokenizer, via `ctx.extras['special_token_ids']`) those ids are special. Without,
    they are inferred from the shape every supported tokenizer gives: the first token (CLS / <s>) and the last
    real token (SEP / </s>) of each sequence, plus any other occurrence of those two ids (the middle separators
    of sentence pairs). Padding is never counted as special: callers exclude it separately.
    """
    valid = attention_mask.bool()
    if special_ids is not None:
        ids = torch.tensor(sorted(special_ids), device=input_ids.device)
        return torch.isin(input_ids, ids) & valid
    last = (valid.long().cumsum(1).argmax(1, keepdim=True)).clamp_min(0)
    first_id = input_ids[:, :1]
    last_id = input_ids.gather(1, last)
    return ((input_ids == first_id) | (input_ids == last_id)) & valid


def attention_maps(ctx: ScoreContext) -> Iterator[tuple[dict[str, torch.Tensor], int, list[int], torch.Tensor]]:
    """Yield (inputs, layer, present head ids, probs [B, present heads, T, T]) per batch and layer, no grad.

    Masked-but-present heads are gated to 0, so later layers see the masked model, as after removal.
    """
    model = ctx.model
    model.eval()
    heads = present_heads(model)
    with torch.no_grad(), gated(model, ctx.gates()):
        for batch in ctx.batches:
            inputs = model_inputs(batch, ctx.device)
            with AttentionRecorder().attach(model) as rec:
                model(**inputs)
            for layer, probs in sorted(rec.probs.items()):
                yield inputs, layer, heads[layer], probs.float()


def _masks(
    inputs: dict[str, torch.Tensor], exclude_special: bool, special_as: str, special_ids: list[int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(query mask, key mask), [B, T] bool each: real tokens minus the specials excluded on that side."""
    valid = inputs["attention_mask"].bool()
    if not exclude_special:
        return valid, valid
    special = special_positions(inputs["input_ids"], inputs["attention_mask"], special_ids)
    queries = valid & ~special if special_as in ("queries", "both") else valid
    keys = valid & ~special if special_as in ("keys", "both") else valid
    return queries, keys


@register("confidence")
def confidence(
    ctx: ScoreContext,
    *,
    exclude_special: bool = True,
    special_as: Literal["keys", "queries", "both"] = "keys",
) -> torch.Tensor:
    """[layers, heads]: mean over query tokens of the head's largest attention weight (Voita's confidence).

    Padding is never a query nor a key. With `exclude_special`, special tokens are dropped as keys (Voita's
    "excluding the end-of-sentence symbol": attention parked on [SEP] is a no-op, Clark et al.), as queries, or
    both, per `special_as`. Weights are not renormalised after dropping keys. Forward passes only.
    """
    special_ids = ctx.extras.get("special_token_ids")
    total = torch.zeros(ctx.alive.shape, dtype=torch.float64, device=ctx.device)
    counts = torch.zeros(ctx.alive.shape[0], dtype=torch.float64, device=ctx.device)
    for inputs, layer, heads, probs in attention_maps(ctx):
        queries, keys = _masks(inputs, exclude_special, special_as, special_ids)
        peak = probs.masked_fill(~keys[:, None, None, :], 0.0).amax(-1)  # [B, P, T]
        total[layer, heads] += (peak * queries[:, None, :]).sum((0, 2)).double()
        counts[layer] += queries.sum()
    count = int(counts.max().item())  # the same query count for every layer that has heads
    return mean_over_processes(total, count, ctx.accelerator).float().cpu()
