"""An architecture is an `ArchSpec` of attention, FFN and norm parts whose methods the stages call: a part an
architecture overrides is what slicing and cost use, the saved layout each architecture writes is unchanged, and the
spec's answers about the model as a whole (token types, reserved positions) follow the config."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest
import torch
from torch import nn

from compressor.sources.models import max_positions
from compressor.surgery.arch import ARCHITECTURES, FFN, Attention, arch_spec, present_heads
from compressor.surgery.cost import unit_costs
from compressor.surgery.slicing import prune_heads
from compressor.testing import ARCHS, DISTINCT_ARCHS, tiny_config, tiny_model

# What saved models' config.json carries under compressor_layout["family"] (key order included): a model saved
# before architectures were made of parts must load, and one saved after must load in an older install.
SAVED = {
    "bert": '{"layers": "encoder.layer", "attention": "attention", "self_attn": "attention.self", "query": "query", '
    '"key": "key", "value": "value", "out_proj": "attention.output.dense", "heads_attr": "num_attention_heads", '
    '"width_attr": "all_head_size", "ffn_in": "intermediate.dense", "ffn_out": "output.dense", '
    '"attention_norm": "output.LayerNorm", "attention_out": "output.dense"}',
    "distilbert": '{"layers": "transformer.layer", "attention": "attention", "self_attn": "attention", '
    '"query": "q_lin", "key": "k_lin", "value": "v_lin", "out_proj": "attention.out_lin", "heads_attr": "n_heads", '
    '"width_attr": "dim", "ffn_in": "ffn.lin1", "ffn_out": "ffn.lin2", "attention_norm": null, '
    '"attention_out": "out_lin"}',
    "deberta-v2": '{"layers": "encoder.layer", "attention": "attention", "self_attn": "attention.self", '
    '"query": "query_proj", "key": "key_proj", "value": "value_proj", "out_proj": "attention.output.dense", '
    '"heads_attr": "num_attention_heads", "width_attr": "all_head_size", "ffn_in": "intermediate.dense", '
    '"ffn_out": "output.dense", "attention_norm": "output.LayerNorm", "attention_out": "output.dense", '
    '"head_rows": ["pos_key_proj", "pos_query_proj"], "layer_tuple": true}',
    "modernbert": '{"layers": "layers", "attention": "attn", "self_attn": "attn", "query": "Wqkv", "key": "Wqkv", '
    '"value": "Wqkv", "out_proj": "attn.Wo", "heads_attr": null, "width_attr": null, "ffn_in": "mlp.Wi", '
    '"ffn_out": "mlp.Wo", "attention_norm": null, "attention_out": "Wo", "fused_qkv": true, "gated_ffn": true}',
    "mpnet": '{"layers": "encoder.layer", "attention": "attention", "self_attn": "attention.attn", "query": "q", '
    '"key": "k", "value": "v", "out_proj": "attention.attn.o", "heads_attr": "num_attention_heads", '
    '"width_attr": "all_head_size", "ffn_in": "intermediate.dense", "ffn_out": "output.dense", '
    '"attention_norm": "LayerNorm", "attention_out": "attn.o", "layer_tuple": true, "shared_bias": "position_bias"}',
}


@pytest.mark.parametrize("arch", sorted(SAVED))
def test_each_architecture_saves_the_layout_it_always_saved(arch: str) -> None:
    assert json.dumps(arch_spec(arch).portable()) == SAVED[arch]


def test_bert_like_architectures_share_bert_s_parts() -> None:
    """RoBERTa, XLM-R, CamemBERT and ELECTRA differ from BERT only in what the spec says of the whole model: they are
    the architectures of ARCHS outside DISTINCT_ARCHS, which the costliest per-architecture tests leave to CI."""
    assert set(ARCHS) - set(DISTINCT_ARCHS) == {"roberta", "xlm-roberta", "camembert", "electra"}
    for arch in set(ARCHS) - set(DISTINCT_ARCHS):
        assert arch_spec(arch).portable() == arch_spec("bert").portable()


KEPT: list[list[int]] = []


@dataclass(frozen=True)
class RecordingAttention(Attention):
    """BERT's attention, recording what slicing tells it about the heads kept."""

    def keep_heads(self, module: nn.Module, head_ids: list[int]) -> None:
        KEPT.append(list(head_ids))


@dataclass(frozen=True)
class CostlyFFN(FFN):
    """BERT's FFN, with neurons counted as if each had three rows of ffn_in."""

    def in_rows(self, index: torch.Tensor, width: int) -> torch.Tensor:
        return torch.cat([index, index + width, index + 2 * width])


def test_slicing_and_cost_call_the_part_an_architecture_overrides(monkeypatch) -> None:
    bert = ARCHITECTURES["bert"]
    monkeypatch.setitem(ARCHITECTURES, "bert", replace(bert, attn=RecordingAttention(), ffn=CostlyFFN()))
    KEPT.clear()
    model = prune_heads(tiny_model("bert", layers=2, heads=4, head_size=8), {0: [1, 2], 1: [0, 1, 2, 3]})
    assert present_heads(model) == [[0, 3], []]
    assert KEPT == [[0, 3]]  # told once, for the layer that keeps heads, by original id
    hidden, t = model.config.hidden_size, 5
    assert unit_costs(model, t).neuron == 2 * (4 * t * hidden)  # three rows of ffn_in and the ffn_out column


@pytest.mark.parametrize("arch", ARCHS)
def test_the_spec_answers_from_the_config(arch: str) -> None:
    config, spec = tiny_config(arch), arch_spec(arch)
    types = arch in ("bert", "roberta", "xlm-roberta", "camembert", "electra")  # DeBERTa-v3's tiny has none
    assert spec.takes_token_types(config) is types
    reserved = config.pad_token_id + 1 if arch in ("roberta", "xlm-roberta", "camembert", "mpnet") else 0
    assert max_positions(config) == config.max_position_embeddings - reserved
