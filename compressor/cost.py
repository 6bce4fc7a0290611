"""Analytic parameter and FLOP counts, so reports can put measured speed-ups next to the ideal."""

from __future__ import annotations

from torch import nn

from compressor.layout import head_size, present_heads


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def encoder_flops(model: nn.Module, seq_len: int) -> int:
    """Multiply-accumulate FLOPs (×2) of the encoder layers for one example of `seq_len` tokens.

    Per layer with h heads of size d, hidden H, FFN width I, T tokens: Q/K/V and output projections
    (4·T·H·h·d), attention scores and weighted values (2·T²·h·d), feed-forward (2·T·H·I). Embeddings and the
    classifier head are ignored (they do not change with head pruning and are <1% of the total).
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
