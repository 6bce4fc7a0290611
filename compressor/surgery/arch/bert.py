"""The BERT architecture: BERT and the models that share its module layout (RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA).

Separate `query`/`key`/`value` Linears under `attention.self`, `attention.output.dense` mixing heads back, and a
two-Linear FFN (`intermediate.dense` → `output.dense`): `ArchSpec`'s defaults. RoBERTa-style position ids start after
the padding id.
"""

from __future__ import annotations

from dataclasses import replace

from compressor.surgery.arch.spec import ArchSpec, register

BERT = register(ArchSpec(), "bert")
register(replace(BERT, tiny={"embedding_size": 32}), "electra")  # tiny ELECTRA: embeddings at the tiny hidden size
ROBERTA = register(
    replace(BERT, padding_positions=True, tiny={"pad_token_id": 1}), "roberta", "xlm-roberta", "camembert"
)
