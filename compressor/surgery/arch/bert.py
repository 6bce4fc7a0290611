"""The BERT family: BERT and the models that share its module layout (RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA).

Separate `query`/`key`/`value` Linears under `attention.self`, `attention.output.dense` mixing heads back, and a
two-Linear FFN (`intermediate.dense` → `output.dense`). RoBERTa-style position ids start after the padding id.
"""

from __future__ import annotations

from dataclasses import replace

from compressor.surgery.arch.spec import ArchSpec, register

BERT = ArchSpec(
    layers="encoder.layer",
    attention="attention",
    self_attn="attention.self",
    query="query",
    key="key",
    value="value",
    out_proj="attention.output.dense",
    heads_attr="num_attention_heads",
    width_attr="all_head_size",
    head_size_attr="attention_head_size",
)
register(BERT, "bert")
register(replace(BERT, tiny={"embedding_size": 32}), "electra")  # tiny ELECTRA: embeddings at the tiny hidden size
ROBERTA = register(
    replace(BERT, padding_positions=True, tiny={"pad_token_id": 1}), "roberta", "xlm-roberta", "camembert"
)
