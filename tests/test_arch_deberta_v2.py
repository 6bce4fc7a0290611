"""DeBERTa-v2 specifics the generic architecture tests (run on DeBERTa-v3's shape: relative keys shared with the layer's
own projections) cannot see: the per-head relative-position projections of `share_att_key=False`, c2p- or p2c-only
scores, absolute positions and token types, the convolution after layer 0, plain attention, and the relative terms
in the FLOP count."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import int8_tol
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForSequenceClassification

from compressor.deploy import export as ex
from compressor.pruning import criteria
from compressor.pruning.criteria import attribution as attribution_module
from compressor.pruning.masking import AttentionRecorder, full_gates, full_neuron_gates, gated
from compressor.surgery.arch import layers, original_ffn_size, presence_mask, present_heads
from compressor.surgery.checkpoint import load_pruned, save_pruned
from compressor.surgery.cost import encoder_flops
from compressor.surgery.portable import LAYOUT_KEY
from compressor.surgery.slicing import EmptyAttention, SkippedLayer, prune_heads, pruned_copy, remove_layers
from compressor.testing import randomize, tiny_batch, tiny_config

LAYERS, HEADS, SIZE = 3, 4, 8
VARIANTS = {
    "unshared": {"share_att_key": False},  # pos_key_proj and pos_query_proj in every layer
    "c2p unshared": {"share_att_key": False, "pos_att_type": ["c2p"]},  # pos_key_proj only
    "p2c shared": {"pos_att_type": ["p2c"]},
    "v2 conv": {  # deberta-v2-xlarge's conv after layer 0, plus absolute positions, token types, no log buckets
        "share_att_key": False,
        "conv_kernel_size": 3,
        "conv_act": "gelu",
        "position_biased_input": True,
        "type_vocab_size": 2,
        "position_buckets": -1,
        "max_relative_positions": 16,
        "norm_rel_ebd": "none",
    },
    "no relative attention": {"relative_attention": False, "pos_att_type": None},
}
BATCH = tiny_batch(batch=3, seq=11)
INPUTS = {k: v for k, v in BATCH.items() if k != "labels"}
TYPES = (torch.arange(11)[None, :] >= 5).long().expand(3, 11)  # two segments


@cache
def base(variant: str, n_layers: int = LAYERS) -> torch.nn.Module:
    config = tiny_config("deberta-v2", layers=n_layers, heads=HEADS, head_size=SIZE)
    for key, value in VARIANTS[variant].items():
        setattr(config, key, value)
    torch.manual_seed(0)
    return randomize(AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")).eval()


def inputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return INPUTS | ({"token_type_ids": TYPES} if model.config.type_vocab_size else {})


def logits(model: torch.nn.Module, gates=None, neurons=None) -> torch.Tensor:
    with torch.no_grad(), gated(model, gates, neurons):
        return model(**inputs(model)).logits


def gates_for(model: torch.nn.Module, plan: dict[int, list[int]]) -> torch.Tensor:
    gates = full_gates(model)
    for layer, heads in plan.items():
        gates[layer, heads] = 0.0
    return gates


def test_variants_build_what_they_claim() -> None:
    attn = [layers(base(v))[0].attention.self for v in VARIANTS]
    assert [(hasattr(a, "pos_key_proj"), hasattr(a, "pos_query_proj")) for a in attn] == [
        (True, True),
        (True, False),
        (False, False),
        (True, True),
        (False, False),
    ]
    assert base("v2 conv").deberta.encoder.conv is not None
    assert base("unshared").config.type_vocab_size == 0 and base("v2 conv").config.type_vocab_size == 2


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("rounds", [[{0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}], [{0: [3]}, {0: [0], 2: [1, 2]}]])
def test_masked_equals_pruned(variant: str, rounds: list[dict[int, list[int]]]) -> None:
    """Gates at 0 == heads removed, per-head relative projections sliced with their heads (in rounds too)."""
    model = base(variant)
    pruned = copy.deepcopy(model)
    plan: dict[int, list[int]] = {}
    for step in rounds:
        prune_heads(pruned, step)
        for layer, heads in step.items():
            plan[layer] = sorted(set(plan.get(layer, [])) | set(heads))
    for layer, (module, heads) in enumerate(zip(layers(pruned), present_heads(pruned), strict=True)):
        if not heads:
            assert isinstance(module.attention, EmptyAttention)
            continue
        attn = module.attention.self
        assert attn.num_attention_heads == len(heads) and attn.all_head_size == len(heads) * SIZE
        for name in ("query_proj", "key_proj", "value_proj", "pos_key_proj", "pos_query_proj"):
            if hasattr(attn, name):
                assert getattr(attn, name).weight.shape == (len(heads) * SIZE, HEADS * SIZE), (layer, name)
    torch.testing.assert_close(logits(pruned), logits(model, gates_for(model, plan)), atol=1e-5, rtol=0)
    assert (logits(pruned) - logits(model)).abs().max() > 1e-3


def combined(variant: str) -> torch.nn.Module:
    """4 layers: uneven heads and FFN widths, a layer without heads, a removed layer."""
    model = base(variant, 4)
    width = original_ffn_size(model)
    heads = {0: [1, 3], 1: list(range(HEADS)), 2: [2]}
    return remove_layers(pruned_copy(model, heads, {0: list(range(0, width, 2)), 1: list(range(5))}), [3])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_unit_kind_masks_and_reloads_through_both_routes(tmp_path: Path, variant: str) -> None:
    pruned = combined(variant)
    assert isinstance(layers(pruned)[3], SkippedLayer) and isinstance(layers(pruned)[1].attention, EmptyAttention)
    width = original_ffn_size(pruned)
    gates = gates_for(base(variant, 4), {0: [1, 3], 1: list(range(HEADS)), 2: [2], 3: list(range(HEADS))})
    cells = full_neuron_gates(base(variant, 4))
    cells[0, list(range(0, width, 2))], cells[1, :5], cells[3] = 0.0, 0.0, 0.0
    torch.testing.assert_close(logits(pruned), logits(base(variant, 4), gates, cells), atol=1e-5, rtol=0)

    path = save_pruned(pruned, tmp_path / "model")
    paths = json.loads((path / "config.json").read_text())[LAYOUT_KEY]["family"]  # the architecture's paths
    assert paths["head_rows"] == ["pos_key_proj", "pos_query_proj"] and paths["layer_tuple"] is True
    with torch.no_grad():
        reference = pruned(**inputs(pruned), output_hidden_states=True)
    remote = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
    assert type(remote).__module__.startswith("transformers_modules.")
    for loaded in (load_pruned(path), remote):
        assert loaded.config._attn_implementation == "eager"  # DeBERTa-v2 has no SDPA: load_pruned falls back
        with torch.no_grad():
            out = loaded(**inputs(loaded), output_hidden_states=True)
        assert float((out.logits - reference.logits).abs().max()) <= 1e-5
        assert len(out.hidden_states) == 5
        for mine, theirs in zip(out.hidden_states, reference.hidden_states, strict=True):
            assert float((mine - theirs).abs().max()) <= 1e-5


def test_conv_still_follows_a_removed_layer_0(tmp_path: Path) -> None:
    """The encoder's conv runs on layer 0's output whatever layer 0 is: removed, it follows the identity, as it does
    when layer 0 is gated to nothing; the reloaded model agrees."""
    model = base("v2 conv")
    pruned = remove_layers(pruned_copy(model, {}), [0])
    gates, cells = gates_for(model, {0: list(range(HEADS))}), full_neuron_gates(model)
    cells[0] = 0.0
    torch.testing.assert_close(logits(pruned), logits(model, gates, cells), atol=1e-5, rtol=0)
    assert (logits(pruned) - logits(model)).abs().max() > 1e-3
    torch.testing.assert_close(logits(load_pruned(save_pruned(pruned, tmp_path / "m"))), logits(pruned), atol=0, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_flops_count_the_relative_terms(variant: str) -> None:
    """The analytic count (relative-embedding projections and c2p/p2c scores per head included) equals torch's
    FLOP counter on the encoder, with an empty layer, uneven heads and a removed layer; the conv after layer 0 is a
    fixed cost that no pruning changes, left out like the embeddings."""
    width = original_ffn_size(base(variant))
    model = pruned_copy(base(variant), {0: [0, 1, 2, 3], 1: [1], 2: [0, 1, 2, 3]}, {0: [1, 4], 2: list(range(width))})
    counter = FlopCounterMode(display=False)
    with counter:
        model(input_ids=torch.randint(4, 100, (1, 16)))
    counts = counter.get_flop_counts()
    (encoder,) = [k for k in counts if k.endswith(".encoder")]
    conv = sum(counts.get(encoder + ".conv", {}).values())  # fixed cost, not a unit's (like the embeddings)
    assert (conv > 0) is (variant == "v2 conv")
    assert sum(counts[encoder].values()) - conv == encoder_flops(model, 16)


@pytest.mark.parametrize("variant", ["unshared", "v2 conv"])
def test_recorder_reads_the_probabilities_of_the_heads_left(variant: str) -> None:
    """AttentionRecorder (hooked at the probabilities' dropout) == output_attentions on the pruned model == the masked
    original's maps of the heads left; an empty layer records nothing (DeBERTa reports None for it)."""
    model = pruned_copy(base(variant), {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]})
    with torch.no_grad(), AttentionRecorder().attach(model) as rec:
        out = model(**inputs(model), output_attentions=True)
    gates = full_gates(base(variant)) * presence_mask(model).float()
    with torch.no_grad(), gated(base(variant), gates), AttentionRecorder().attach(base(variant)) as ref:
        base(variant)(**inputs(model))
    heads = present_heads(model)
    assert sorted(rec.probs) == [0, 2] and out.attentions[1] is None
    for layer in (0, 2):
        assert rec.probs[layer].shape == (3, len(heads[layer]), 11, 11)
        torch.testing.assert_close(out.attentions[layer], rec.probs[layer], atol=0, rtol=0)
        torch.testing.assert_close(rec.probs[layer], ref.probs[layer][:, heads[layer]], atol=1e-6, rtol=0)


def test_attribution_runs_the_whole_encoder_when_a_conv_follows_layer_0(monkeypatch) -> None:
    """Attribution feeds cached hidden states into the layer it scores; DeBERTa-v2's conv runs after whatever layer
    comes first in the list, so with a conv the shortcut is not taken (same scores as without it)."""
    model = pruned_copy(base("v2 conv"), {0: [1]})
    ctx = criteria.ScoreContext(model=model, alive=presence_mask(model), batches=[BATCH], target_remove=2)
    params = {"steps": 2, "examples": 3}
    scores = criteria.score_heads("attribution", ctx, params)

    def whole_model(*_args, **_kwargs):
        from contextlib import nullcontext

        return nullcontext()

    monkeypatch.setattr(attribution_module, "start_at", whole_model)
    torch.testing.assert_close(scores, criteria.score_heads("attribution", ctx, params), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", ["unshared", "v2 conv"])
def test_onnx_export_parity(tmp_path: Path, variant: str) -> None:
    """fp32 and optimised graphs within 1e-4 of PyTorch (int8 within its simulated deviation's bound) with every unit
    kind removed."""
    model_dir = save_pruned(combined(variant), tmp_path / "model")
    check = [tiny_batch(batch=4, seq=11, seed=s) for s in range(2)]
    if base(variant).config.type_vocab_size:
        check = [b | {"token_type_ids": (torch.rand(b["input_ids"].shape) > 0.5).long()} for b in check]
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized", "int8"], check)
    assert result["fp32"]["max_abs_diff"] <= 1e-4 and result["optimized"]["max_abs_diff"] <= 1e-4
    assert result["int8"]["max_abs_diff"] < int8_tol(model_dir, check) and result["int8"]["agreement"] >= 0.75
    assert result["optimized"]["attention_fusion"].startswith("n/a") and result["optimized"]["attention_layers"] == 2
    names = ex.OnnxClassifier(tmp_path / "onnx" / "fp32").input_names
    assert ("token_type_ids" in names) is bool(base(variant).config.type_vocab_size)
    batch = check[0]
    expected = ex.torch_logits(combined(variant), batch)
    assert np.abs(ex.OnnxClassifier(tmp_path / "onnx" / "fp32")(batch) - expected).max() <= 1e-4
