"""Analytic parameter and FLOP counts, so reports can put measured speed-ups next to the ideal.

FLOPs are 2 × multiply-accumulates. Per layer with h heads of size d, hidden H, n FFN neurons, T tokens:
each head costs its Q/K/V rows and W_O columns (4·T·H·d) plus attention scores and weighted values (2·T²·d);
each FFN neuron costs its W_1 row and W_2 column (2·T·H; 3·T·H in a gated FFN, whose W_1 has an input and a gate
row per neuron); each architecture's parts give them (`Attention.head_flops`, `FFN.neuron_flops`), so one with more
per-head work (DeBERTa's relative positions) counts it there. A layer's cost is the sum of its units, so removing
a whole layer saves exactly its heads and neurons: the three unit costs below are the common currency of
`selection.select_units`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from compressor.surgery.arch import (
    ArchSpec,
    declared,
    head_size,
    original_ffn_size,
    original_num_heads,
    present_heads,
    present_hidden,
    present_neurons,
    pruned_heads,
    pruned_neurons,
    removed_layers,
)


@dataclass(frozen=True)
class UnitCosts:
    """Encoder FLOPs per example removed with one unit of each kind, at `seq_len` tokens."""

    seq_len: int
    head: int
    neuron: int
    layer: int  # a full, unpruned layer: all heads and all neurons

    def of(self, unit: str) -> int:
        """Cost of one unit of kind `unit` ('heads', 'neurons' or 'layers')."""
        return {"heads": self.head, "neurons": self.neuron, "layers": self.layer}[unit]


def _hidden(model: nn.Module) -> int:
    """The residual width `model` has now (the config's, less the channels cut: `config.pruned_hidden`)."""
    return len(present_hidden(model))


def unit_costs(model: nn.Module, seq_len: int, width: int | None = None) -> UnitCosts:
    """FLOPs per example of one head, one FFN neuron and one whole original layer of `model` at `seq_len`, with the
    residual stream at `width` channels (default: the model's own)."""
    hidden, d, t = width or _hidden(model), head_size(model), int(seq_len)
    spec = declared(getattr(model.config, "model_type", "")) or ArchSpec()  # a bare config (latency tables): BERT's
    head = spec.attn.head_flops(model.config, t, hidden, d)
    neuron = spec.ffn.neuron_flops(t, hidden)
    layer = original_num_heads(model) * head + original_ffn_size(model) * neuron
    return UnitCosts(seq_len=t, head=head, neuron=neuron, layer=layer)


def masked_flops(model: nn.Module, alive: Mapping[str, torch.Tensor], seq_len: int, width: int | None = None) -> int:
    """Encoder FLOPs per example of `model` with only the units in `alive` ({"heads": .., "neurons": ..} bool
    masks over original ids) kept: what physically removing the rest would leave. A kind missing from `alive`
    counts as fully present; `width` (residual channels kept, None: as the model has them) narrows every unit."""
    costs = unit_costs(model, seq_len, width)
    heads = alive.get("heads")
    neurons = alive.get("neurons")
    n_heads = int(heads.sum()) if heads is not None else sum(len(h) for h in present_heads(model))
    n_neurons = int(neurons.sum()) if neurons is not None else sum(len(n) for n in present_neurons(model))
    return n_heads * costs.head + n_neurons * costs.neuron


def count_parameters(model: nn.Module) -> int:
    """All parameters (embeddings and classifier included); a removed head's weights are simply absent."""
    return sum(p.numel() for p in model.parameters())


def encoder_flops(model: nn.Module, seq_len: int) -> int:
    """Multiply-accumulate FLOPs (×2) of the encoder layers for one example of `seq_len` tokens.

    Per layer with h heads of size d, hidden H, FFN width I, T tokens: Q/K/V and output projections
    (4·T·H·h·d), attention scores and weighted values (2·T²·h·d), feed-forward (2·T·H·I; 3·T·H·I gated), plus
    what the architecture's attention adds per head (`Attention.head_flops`). Embeddings, the classifier head and
    DeBERTa-v2's conv after layer 0 are ignored (no pruning changes them; the first two are <1% of the total). A
    layer without heads costs only its feed-forward block; a removed layer costs nothing.
    """
    return masked_flops(model, {}, seq_len)


def size_stats(model: nn.Module, seq_len: int) -> dict:
    """One model's parameters, encoder FLOPs per example at `seq_len`, and heads and FFN neurons (total, per layer)."""
    heads = [len(h) for h in present_heads(model)]
    neurons = [len(n) for n in present_neurons(model)]
    return {
        "parameters": count_parameters(model),
        "encoder_flops_per_example": encoder_flops(model, seq_len),
        "heads": sum(heads),
        "heads_per_layer": heads,
        "ffn_neurons": sum(neurons),
        "ffn_neurons_per_layer": neurons,
        "layers": len(heads) - len(removed_layers(model)),
        "hidden_size": _hidden(model),
    }


def model_stats(original: nn.Module, pruned: nn.Module, seq_len: int) -> dict:
    """Parameters, encoder FLOPs per example, heads, FFN neurons and layers, before and after pruning.

    `*_ratio` are original / pruned (2.0 = half the cost); `pruned_heads` / `pruned_neurons` list removed units
    by original id, `removed_layers` the layers removed whole. The same dict feeds the model card and the report.
    """
    before, after = size_stats(original, seq_len), size_stats(pruned, seq_len)
    return {
        "seq_len": int(seq_len),
        "heads_total": len(before["heads_per_layer"]) * original_num_heads(original),
        "original": before,
        "pruned": after,
        "parameter_ratio": before["parameters"] / max(after["parameters"], 1),
        "flop_ratio": before["encoder_flops_per_example"] / max(after["encoder_flops_per_example"], 1),
        "pruned_heads": {str(k): v for k, v in pruned_heads(pruned).items()},
        "pruned_neurons": {str(k): len(v) for k, v in pruned_neurons(pruned).items()},
        "removed_layers": removed_layers(pruned),
        "empty_layers": [
            i for i, n in enumerate(after["heads_per_layer"]) if n == 0 and i not in removed_layers(pruned)
        ],
    }
