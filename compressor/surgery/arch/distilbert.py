"""DistilBERT: `q_lin`/`k_lin`/`v_lin` and `out_lin` on one attention module, an FFN of `lin1` → `lin2`, and no
token type input.
"""

from __future__ import annotations

from compressor.surgery.arch.spec import ArchSpec, register

DISTILBERT = register(
    ArchSpec(
        layers="transformer.layer",
        attention="attention",
        self_attn="attention",
        query="q_lin",
        key="k_lin",
        value="v_lin",
        out_proj="attention.out_lin",
        heads_attr="n_heads",
        width_attr="dim",
        head_size_attr="attention_head_size",
        ffn_in="ffn.lin1",
        ffn_out="ffn.lin2",
        token_type_ids=False,
        attention_norm=None,
        ffn_norm="output_layer_norm",
        ffn_size_attr="hidden_dim",
    ),
    "distilbert",
)
