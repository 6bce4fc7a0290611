"""Analytic parameter and FLOP counts, so reports can put measured speed-ups next to the ideal."""

from __future__ import annotations

from torch import nn

from compressor.layout import head_size, original_num_heads, present_heads, pruned_heads


def count_parameters(model: nn.Module) -> int:
    """All parameters (embeddings and classifier included); a removed head's weights are simply absent."""
    return sum(p.numel() for p in model.parameters())


def encoder_flops(model: nn.Module, seq_len: int) -> int:
    """Multiply-accumulate FLOPs (×2) of the encoder layers for one example of `seq_len` tokens.

    Per layer with h heads of size d, hidden H, FFN width I, T tokens: Q/K/V and output projections
    (4·T·H·h·d), attention scores and weighted values (2·T²·h·d), feed-forward (2·T·H·I). Embeddings and the
    classifier head are ignored (they do not change with head pruning and are <1% of the total).
    A layer without heads costs only its feed-forward block.
    """
    cfg = model.config
    hidden = int(getattr(cfg, "hidden_size", None) or cfg.dim)
    ffn = int(getattr(cfg, "intermediate_size", None) or cfg.hidden_dim)
    d, t = head_size(model), seq_len
    total = 0
    for heads in present_heads(model):
        width = len(heads) * d
        total += 4 * t * hidden * width + 2 * t * t * width + 2 * t * hidden * ffn
    return 2 * total


def _side(model: nn.Module, seq_len: int) -> dict:
    heads = [len(h) for h in present_heads(model)]
    return {
        "parameters": count_parameters(model),
        "encoder_flops_per_example": encoder_flops(model, seq_len),
        "heads": sum(heads),
        "heads_per_layer": heads,
    }


def model_stats(original: nn.Module, pruned: nn.Module, seq_len: int) -> dict:
    """Parameters, encoder FLOPs per example and heads, before and after pruning, plus the ratios.

    `*_ratio` are original / pruned (2.0 = half the cost); `pruned_heads` lists removed heads by original id.
    The same dict feeds the model card and the run report.
    """
    before, after = _side(original, seq_len), _side(pruned, seq_len)
    return {
        "seq_len": int(seq_len),
        "heads_total": len(before["heads_per_layer"]) * original_num_heads(original),
        "original": before,
        "pruned": after,
        "parameter_ratio": before["parameters"] / max(after["parameters"], 1),
        "flop_ratio": before["encoder_flops_per_example"] / max(after["encoder_flops_per_example"], 1),
        "pruned_heads": {str(k): v for k, v in pruned_heads(pruned).items()},
        "empty_layers": [i for i, n in enumerate(after["heads_per_layer"]) if n == 0],
    }
