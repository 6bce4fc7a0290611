"""DistilBERT: `q_lin`/`k_lin`/`v_lin` and `out_lin` on one attention module, an FFN of `lin1` → `lin2`, the layer
(not the attention block) normalising after attention, and no token type input.
"""

from __future__ import annotations

from compressor.surgery.arch.parts import FFN, Attention, Norms
from compressor.surgery.arch.spec import ArchSpec, register

DISTILBERT = register(
    ArchSpec(
        layers="transformer.layer",
        attn=Attention(
            self_attn="attention",
            query="q_lin",
            key="k_lin",
            value="v_lin",
            out_proj="attention.out_lin",
            heads_attr="n_heads",
            width_attr="dim",
        ),
        ffn=FFN(ffn_in="ffn.lin1", ffn_out="ffn.lin2", size_attr="hidden_dim"),
        norms=Norms(attention_norm=None, ffn_norm="output_layer_norm"),
        token_type_ids=False,
    ),
    "distilbert",
)
