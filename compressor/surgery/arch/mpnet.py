"""MPNet: `q`/`k`/`v` and the output projection `o` on one module (`attention.attn`), the residual LayerNorm on the
attention block itself, a BERT-like FFN, RoBERTa-style position ids and no token type input.

Its relative position bias is one `nn.Embedding(buckets, heads)` in the encoder, turned once per forward into a
[batch, heads, T, T] `position_bias` that every layer's attention adds to its scores: a pruned layer keeps its
present heads' original ids and selects those columns (`shared_bias`). Its layers return tuples, its attention has
no SDPA path in transformers, and ONNX Runtime's optimizer does not fuse attention with that bias in front of the
softmax.
"""

from __future__ import annotations

from compressor.surgery.arch.spec import ArchSpec, register

MPNET = register(
    ArchSpec(
        layers="encoder.layer",
        attention="attention",
        self_attn="attention.attn",
        query="q",
        key="k",
        value="v",
        out_proj="attention.attn.o",
        heads_attr="num_attention_heads",
        width_attr="all_head_size",
        head_size_attr="attention_head_size",
        token_type_ids=False,
        probs_dropout="dropout",
        padding_positions=True,
        ort_fuses_attention=False,
        sdpa=False,
        shared_bias="position_bias",
        layer_returns_tuple=True,
        attention_norm="LayerNorm",
    ),
    "mpnet",
)
