"""Residual width: removing channels of the residual stream from the whole model at once.

The stream is shared by every layer, so a width cut is one set of channels (original ids, `config.pruned_hidden`)
taken out of every embedding table and LayerNorm of the stream's width, the input columns of every Linear that
reads it (Q/K/V, FFN-in, the head) and the output rows of every Linear that writes it (W_O, FFN-out, the head's
hidden Linear): `surgery.portable.stream_paths` lists them, and the same list rebuilds a saved model. Heads keep
their head size: after a cut, heads × head size no longer equals the width, and nothing in the supported architectures'
forward derives one from the other.

Exact for post-norm architectures when the model was trained with every stream LayerNorm normalising over the kept
channels only (`pruning.masking.gated`'s `hidden`), as CoFi does: then masked == pruned. Pre-norm architectures (the
stream is never normalised before it is summed), DeBERTa (its relative-position embeddings are a second stream
of the same width) and a factorised embedding (ELECTRA's projection) are refused in one line (`width_refusal`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from compressor.surgery.arch import arch_spec, config_width, original_hidden, present_hidden, pruned_hidden
from compressor.surgery.portable import narrow_stream, stream_paths
from compressor.surgery.slicing import prune_heads, prune_neurons


class WidthError(ValueError):
    """A width cut that names channels out of range or would leave the stream empty (raised before any change)."""


def width_refusal(config) -> str | None:
    """Why a model of `config` cannot have its residual width cut exactly, in words (None when it can). Read from
    the config alone, so a run refuses before any weights load."""
    kind = config.model_type
    spec, width = arch_spec(kind), config_width(config)
    reason = spec.width_refusal(kind)
    if reason is not None:
        return reason
    if int(getattr(config, "embedding_size", None) or width) != width:
        return f"{kind}'s embeddings are narrower than its layers (a factorised embedding)"
    if int(getattr(config, "num_labels", 0)) == width:
        return f"{kind} with as many labels as residual channels: its classifier cannot be told from its head"
    return None


def prune_hidden(model: nn.Module, remove: Iterable[int]) -> nn.Module:
    """Remove the residual channels `remove` (original ids) from `model` in place and record them in
    `config.pruned_hidden`. Channels already removed are ignored (a cumulative list replays idempotently); a channel out
    of range, a cut that leaves nothing, or an architecture that cannot be cut is refused before any change."""
    reason = width_refusal(model.config)
    if reason is not None:
        raise WidthError(f"prune.units: 'hidden' cannot be cut here: {reason}")
    total, present = original_hidden(model), present_hidden(model)
    ids = {int(i) for i in remove}
    bad = sorted(i for i in ids if not 0 <= i < total)
    if bad:
        raise WidthError(f"hidden: channels {bad[:5]} out of range; expected 0..{total - 1}")
    keep = [pos for pos, channel in enumerate(present) if channel not in ids]
    if not keep:
        raise WidthError("hidden: a cut must leave at least one residual channel")
    if len(keep) == len(present):
        return model
    narrow_stream(model, arch_spec(model).portable(), len(keep), torch.tensor(keep, dtype=torch.long))
    model.config.pruned_hidden = sorted(set(pruned_hidden(model)) | (ids & set(present)))
    return model


def cut_units(
    model: nn.Module, plan: Mapping[str, Mapping[int, Sequence[int]]], channels: Sequence[int] = ()
) -> nn.Module:
    """Physically remove from `model`, in place, the heads and FFN neurons of `plan` (`{kind: {layer: [original
    ids]}}`; a layer left with neither is removed whole), then the residual channels `channels`. Returns `model`."""
    prune_heads(model, plan.get("heads", {}))
    prune_neurons(model, plan.get("neurons", {}))
    return prune_hidden(model, channels) if len(channels) else model


def stream_norms(model: nn.Module) -> list[nn.LayerNorm]:
    """Every LayerNorm over the residual stream (the embeddings', each layer's), in module order."""
    paths = stream_paths(model, arch_spec(model).portable())
    return [model.get_submodule(path) for path in paths["norms"]]


def head_writers(model: nn.Module) -> list[nn.Linear]:
    """The head's Linears that write a stream-wide hidden state (a pooler's or a classifier's dense): cut with the
    stream, so masked they are zeroed at removed channels."""
    return [model.get_submodule(path) for path in stream_paths(model, arch_spec(model).portable())["head"]]
