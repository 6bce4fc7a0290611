"""ModernBERT: pre-norm layers (`attn_norm`, `mlp_norm`) under `model.layers`, one fused `attn.Wqkv` Linear whose
rows are [Q | K | V] (each heads × head_dim, head-major: the forward views them as `(3, -1, head_dim)`, so the head
count follows from the weights and no attribute holds it), `attn.Wo` mixing heads back, and a gated (GeGLU) FFN:
`mlp.Wi` gives 2 × intermediate_size rows chunked into input and gate halves, `mlp.Wo` maps the width back.

Rotary embeddings act per head_dim and alternate global / sliding-window layers only change the mask, so neither
depends on the head count. Attention goes through transformers' attention interface; there are no token types.
"""

from __future__ import annotations

from compressor.surgery.arch.spec import ArchSpec, register

MODERNBERT = register(
    ArchSpec(
        layers="layers",
        attention="attn",
        self_attn="attn",
        query="Wqkv",
        key="Wqkv",
        value="Wqkv",
        out_proj="attn.Wo",
        heads_attr=None,
        width_attr=None,
        head_size_attr="head_dim",
        ffn_in="mlp.Wi",
        ffn_out="mlp.Wo",
        token_type_ids=False,
        fused_qkv=True,
        gated_ffn=True,
        pre_norm=True,
        pooling_attr="classifier_pooling",
        ort_fuses_attention=False,  # ORT's optimizer has no pattern for rotary attention
        attention_norm=None,
        ffn_norm=None,
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
