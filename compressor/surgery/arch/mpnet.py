"""MPNet: `q`/`k`/`v` and the output projection `o` on one module (`attention.attn`), the residual LayerNorm on the
attention block itself, a BERT-like FFN, RoBERTa-style position ids and no token type input.

Its relative position bias is one `nn.Embedding(buckets, heads)` in the encoder, turned once per forward into a
[batch, heads, T, T] `position_bias` that every layer's attention adds to its scores: a pruned layer keeps its
present heads' original ids and selects those columns (`SharedBiasAttention`). Its layers return tuples, its
attention has no SDPA path in transformers, and ONNX Runtime's optimizer does not fuse attention with that bias in
front of the softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from compressor.surgery.arch.parts import Attention, Norms
from compressor.surgery.arch.spec import ArchSpec, register
from compressor.surgery.portable import select_bias_heads


@dataclass(frozen=True)
class SharedBiasAttention(Attention):
    """Attention that adds a [batch, original heads, q, k] bias computed once for all layers and passed to
    self_attn's forward as `shared_bias`: a pruned layer selects its present heads' columns of it."""

    shared_bias: str = "position_bias"  # self_attn's forward argument carrying the bias

    def keep_heads(self, module: nn.Module, head_ids: list[int]) -> None:
        select_bias_heads(module, self.shared_bias, head_ids)

    def portable(self) -> dict[str, object]:
        return {"shared_bias": self.shared_bias}

    def check(self) -> None:
        super().check()
        if not self.shared_bias.isidentifier():
            raise ValueError(f"ArchSpec.shared_bias: expected an argument name, got {self.shared_bias!r}")


MPNET = register(
    ArchSpec(
        attn=SharedBiasAttention(
            self_attn="attention.attn",
            query="q",
            key="k",
            value="v",
            out_proj="attention.attn.o",
            probs_dropout="dropout",
            sdpa=False,
        ),
        norms=Norms(attention_norm="LayerNorm"),
        token_type_ids=False,
        padding_positions=True,
        ort_fuses_attention=False,
        layer_returns_tuple=True,
    ),
    "mpnet",
)
