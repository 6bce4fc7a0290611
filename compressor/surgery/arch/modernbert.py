"""ModernBERT: pre-norm layers (`attn_norm`, `mlp_norm`) under `model.layers`, one fused `attn.Wqkv` Linear whose
rows are [Q | K | V] (each heads × head_dim, head-major: the forward views them as `(3, -1, head_dim)`, so the head
count follows from the weights and no attribute holds it), `attn.Wo` mixing heads back, and a gated (GeGLU) FFN:
`mlp.Wi` gives 2 × intermediate_size rows chunked into input and gate halves, `mlp.Wo` maps the width back.

Rotary embeddings act per head_dim and alternate global / sliding-window layers only change the mask, so neither
depends on the head count. Attention goes through transformers' attention interface; there are no token types.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from compressor.surgery.arch.parts import FFN, Attention, PreNorm, blocks
from compressor.surgery.arch.spec import ArchSpec, register


@dataclass(frozen=True)
class FusedAttention(Attention):
    """Query, key and value are ONE Linear whose output rows are [Q | K | V], each heads × head size in head order:
    a head is three row blocks of it."""

    def projection_rows(self, module: nn.Module, index: torch.Tensor, width: int) -> dict[str, torch.Tensor]:
        return {name: blocks(index, width, 3) for name in self.qkv}

    def portable(self) -> dict[str, object]:
        return {"fused_qkv": True}

    def check(self) -> None:
        super().check()
        if len(self.qkv) != 1:
            raise ValueError(f"ArchSpec.fused_qkv: query, key and value must name the one fused Linear, got {self.qkv}")


@dataclass(frozen=True)
class GatedFFN(FFN):
    """A GLU: ffn_in's output rows are [input | gate] halves of the FFN width, so neuron i is rows i and i + width of
    ffn_in, plus column i of ffn_out."""

    def in_rows(self, index: torch.Tensor, width: int) -> torch.Tensor:
        return blocks(index, width, 2)

    def portable(self) -> dict[str, object]:
        return {"gated_ffn": True}


MODERNBERT = register(
    ArchSpec(
        layers="layers",
        attn=FusedAttention(
            block="attn",
            self_attn="attn",
            query="Wqkv",
            key="Wqkv",
            value="Wqkv",
            out_proj="attn.Wo",
            heads_attr=None,
            width_attr=None,
            head_size_attr="head_dim",
        ),  # fmt: skip
        ffn=GatedFFN(ffn_in="mlp.Wi", ffn_out="mlp.Wo"),
        norms=PreNorm(),
        token_type_ids=False,
        pooling_attr="classifier_pooling",
        ort_fuses_attention=False,  # ORT's optimizer has no pattern for rotary attention
        # tiny test models: layers 0, 3, ... global, the others a sliding window of ±2 tokens (local_attention 4)
        tiny={
            "local_attention": 4,
            "pad_token_id": 0,
            "bos_token_id": 2,
            "cls_token_id": 2,
            "eos_token_id": 3,
            "sep_token_id": 3,
        },  # fmt: skip
    ),
    "modernbert",
)
