"""DeBERTa-v2 / DeBERTa-v3: disentangled attention under `attention.self` (`query_proj`/`key_proj`/`value_proj`),
`attention.output.dense` mixing heads back, and a BERT-like FFN (`intermediate.dense` → `output.dense`).

Relative positions add c2p/p2c scores per head. DeBERTa-v3 (`share_att_key`) projects the relative embeddings with the
layer's own `key_proj`/`query_proj`, so slicing those covers them; otherwise `pos_key_proj` (c2p) and
`pos_query_proj` (p2c) have one block of output rows per head and are sliced with the heads (`RelativeAttention`).
The score scale √(head size × number of score kinds) does not depend on the head count, and forward reads only the
`num_attention_heads` attribute. Its layers return `(hidden_states, attention)` (the encoder unpacks both), it has
no SDPA path (eager attention applies `self.dropout` to the probabilities, where maps are read), and ORT has no
fusion for its attention. `type_vocab_size` is 0 in DeBERTa-v3: the forward then ignores `token_type_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from compressor.surgery.arch.parts import Attention
from compressor.surgery.arch.spec import ArchSpec, register


def relative_head_flops(config, seq_len: int) -> int:
    """FLOPs of one head's relative-position terms at `seq_len` tokens: its rows of the relative-embedding
    projections (2·span rows, run once per forward, so exact per example at batch 1) and its c2p / p2c scores."""
    if not getattr(config, "relative_attention", False):
        return 0
    kinds = [kind for kind in ("c2p", "p2c") if kind in (config.pos_att_type or [])]
    buckets, span = getattr(config, "position_buckets", -1), getattr(config, "max_relative_positions", -1)
    span = buckets if buckets > 0 else (span if span >= 1 else config.max_position_embeddings)
    hidden = config.hidden_size
    size = hidden // config.num_attention_heads  # W_O is hidden × hidden: heads × head size must be the hidden size
    projections = 2 if getattr(config, "share_att_key", False) else len(kinds)
    return 2 * (projections * 2 * span * hidden * size + len(kinds) * seq_len * 2 * span * size)


@dataclass(frozen=True)
class RelativeAttention(Attention):
    """DeBERTa's disentangled attention: further Linears with one block of output rows per head (the relative
    embeddings' projections, where the module has them), sliced with Q/K/V, and each head's relative-position work
    counted in its cost."""

    head_rows: tuple[str, ...] = ("pos_key_proj", "pos_query_proj")  # from self_attn

    def projection_rows(self, module: nn.Module, index: torch.Tensor, width: int) -> dict[str, torch.Tensor]:
        extra = {name: index for name in self.head_rows if isinstance(getattr(module, name, None), nn.Linear)}
        return {**super().projection_rows(module, index, width), **extra}

    def head_flops(self, config, seq_len: int, hidden: int, size: int) -> int:
        return super().head_flops(config, seq_len, hidden, size) + relative_head_flops(config, seq_len)

    def width_refusal(self, kind: str) -> str | None:
        return f"{kind}'s relative-position embeddings form a second stream of the same width"

    def portable(self) -> dict[str, object]:
        return {"head_rows": list(self.head_rows)}

    def check(self) -> None:
        super().check()
        if isinstance(self.head_rows, str) or not all(name.isidentifier() for name in self.head_rows):
            raise ValueError(f"ArchSpec.head_rows: expected a tuple of attribute names, got {self.head_rows!r}")


DEBERTA_V2 = register(
    ArchSpec(
        attn=RelativeAttention(
            query="query_proj", key="key_proj", value="value_proj", probs_dropout="dropout", sdpa=False
        ),
        ort_fuses_attention=False,
        layer_returns_tuple=True,
        encoder_side_module="conv",
        # tiny test models take DeBERTa-v3's shape: shared relative keys, log buckets, no token types or positions
        tiny={
            "relative_attention": True,
            "position_buckets": 8,
            "pos_att_type": ["p2c", "c2p"],
            "norm_rel_ebd": "layer_norm",
            "share_att_key": True,
            "position_biased_input": False,
            "type_vocab_size": 0,
        },  # fmt: skip
    ),
    "deberta-v2",
)
