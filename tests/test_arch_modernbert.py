"""ModernBERT's own parts, which the generic tests over ARCHS do not look at: the fused Q/K/V Linear and the gated
(GeGLU) FFN sliced by original ids, biases off (EmptyAttention and an FFN without neurons give zeros) and on,
sliding-window layers in recorded attention, mean pooling, the removed-layer marker without a bias, and the
gated FFN's FLOPs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from compressor.pruning.masking import AttentionRecorder, gated
from compressor.surgery.arch import (
    ArchSpec,
    arch_spec,
    layers,
    neuron_presence_mask,
    presence_mask,
    present_heads,
    present_neurons,
)
from compressor.surgery.arch.spec import register
from compressor.surgery.checkpoint import load_pruned, save_pruned
from compressor.surgery.cost import unit_costs
from compressor.surgery.portable import EmptyAttention, SkippedLayer
from compressor.surgery.slicing import pruned_copy, remove_layers
from compressor.testing import randomize, tiny_batch, tiny_config

LAYERS, HEADS, SIZE = 4, 4, 8
HIDDEN = HEADS * SIZE
INPUTS = {k: v for k, v in tiny_batch(batch=3, seq=11).items() if k != "labels"}  # longer than the ±2 window


def model(attention: str = "eager", seed: int = 0, **config) -> torch.nn.Module:
    cfg = tiny_config("modernbert", layers=LAYERS, heads=HEADS, head_size=SIZE)
    for key, value in config.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    built = AutoModelForSequenceClassification.from_config(cfg, attn_implementation=attention)
    return randomize(built, seed).eval()


def logits(m: torch.nn.Module, heads=None, neurons=None) -> torch.Tensor:
    with torch.no_grad(), gated(m, heads, neurons):
        return m(**INPUTS).logits


def width(m: torch.nn.Module) -> int:
    return m.config.intermediate_size


PLAN = {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}


def neuron_plan(m: torch.nn.Module) -> dict[int, list[int]]:
    return {0: list(range(0, width(m), 2)), 2: list(range(width(m))), 3: list(range(7))}


def test_declaration_matches_the_modules() -> None:
    m = model()
    spec, layer = arch_spec(m), layers(m)[1]
    assert m.config.layer_types[:3] == ["full_attention", "sliding_attention", "sliding_attention"]
    rows = spec.attn.projection_rows(layer.attn, torch.tensor([1]), 2)  # head 1 of 2 keeps a row in each of Q, K, V
    assert spec.qkv == ("Wqkv",) and rows["Wqkv"].tolist() == [1, 3, 5]
    assert spec.ffn.in_rows(torch.tensor([0, 2]), 4).tolist() == [0, 2, 4, 6]  # its input row and its gate row
    assert layer.attn.Wqkv.out_features == 3 * HIDDEN and layer.attn.head_dim == SIZE
    assert layer.mlp.Wi.out_features == 2 * width(m) and layer.mlp.Wo.in_features == width(m)
    assert spec.portable()["fused_qkv"] is True and spec.portable()["gated_ffn"] is True
    assert "fused_qkv" not in arch_spec("bert").portable()  # other architectures' saved layouts are unchanged


def test_fused_qkv_and_gated_rows_are_sliced_by_original_id() -> None:
    """Wqkv keeps heads' rows in each of its Q, K and V blocks; Wi keeps each neuron's input and gate rows."""
    m = model(attention_bias=True, mlp_bias=True)
    neurons = {0: [0, 5, 6]}
    pruned = pruned_copy(m, {0: [1, 3]}, neurons)
    old, new = layers(m)[0], layers(pruned)[0]
    kept = torch.cat([torch.arange(h * SIZE, (h + 1) * SIZE) for h in (0, 2)])
    rows = torch.cat([kept + block * HIDDEN for block in range(3)])
    assert torch.equal(new.attn.Wqkv.weight, old.attn.Wqkv.weight[rows])
    assert torch.equal(new.attn.Wqkv.bias, old.attn.Wqkv.bias[rows])
    assert torch.equal(new.attn.Wo.weight, old.attn.Wo.weight[:, kept])
    keep = torch.tensor([i for i in range(width(m)) if i not in neurons[0]])
    pairs = torch.cat([keep, keep + width(m)])
    assert torch.equal(new.mlp.Wi.weight, old.mlp.Wi.weight[pairs])
    assert torch.equal(new.mlp.Wi.bias, old.mlp.Wi.bias[pairs])
    assert torch.equal(new.mlp.Wo.weight, old.mlp.Wo.weight[:, keep])
    assert torch.equal(new.mlp.Wo.bias, old.mlp.Wo.bias)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_masked_equals_pruned_and_both_load_routes(tmp_path: Path, attention: str, bias: bool) -> None:
    """Gating == removing heads and neurons (a no-head layer, an FFN without neurons, a removed layer) with and
    without biases, and both load routes give the in-memory pruned model's logits."""
    m = model(attention, attention_bias=bias, mlp_bias=bias)
    pruned = remove_layers(pruned_copy(m, PLAN, neuron_plan(m)), [3])
    assert [len(h) for h in present_heads(pruned)] == [2, 0, 3, 0]
    assert [len(n) for n in present_neurons(pruned)] == [width(m) - len(neuron_plan(m)[0]), width(m), 0, 0]
    masked = logits(m, presence_mask(pruned).float(), neuron_presence_mask(pruned).float())
    torch.testing.assert_close(logits(pruned), masked, atol=1e-5, rtol=0)
    assert (logits(pruned) - logits(m)).abs().max() > 1e-2
    path = save_pruned(pruned, tmp_path / "model")
    remote = AutoModelForSequenceClassification.from_pretrained(
        path, trust_remote_code=True, attn_implementation=attention
    )
    for loaded in (load_pruned(path, attn_implementation=attention), remote.eval()):
        assert (logits(loaded) - logits(pruned)).abs().max() <= 1e-5
        blocks = [type(layers(loaded)[1].attn), type(layers(loaded)[3])]  # the remote route has the shipped classes
        assert [c.__name__ for c in blocks] == [EmptyAttention.__name__, SkippedLayer.__name__]


def test_without_bias_an_empty_block_adds_nothing() -> None:
    """No heads: the attention block outputs zeros (W_O has no bias); no neurons: the MLP outputs zeros."""
    pruned = pruned_copy(model(), {1: list(range(HEADS))}, {2: list(range(width(model())))})
    x = torch.randn(2, 5, HIDDEN)
    block = layers(pruned)[1].attn
    assert block.Wo.bias is None and block.Wo.weight.shape == (HIDDEN, 0)
    assert torch.equal(block(x)[0], torch.zeros_like(x))
    mlp = layers(pruned)[2].mlp
    assert mlp.Wi.weight.shape == (0, HIDDEN) and torch.equal(mlp(x), torch.zeros_like(x))


def test_recorded_attention_keeps_the_sliding_window() -> None:
    """The recorder's eager arithmetic sees each layer's own mask: sliding layers attend within ±sliding_window
    tokens (and not to padding), the global layer beyond; SDPA models record the same probabilities."""
    window, seen = model().config.sliding_window, {}
    for attention in ("eager", "sdpa"):
        pruned = pruned_copy(model(attention), PLAN)
        with torch.no_grad(), AttentionRecorder().attach(pruned) as rec:
            pruned(**INPUTS)
        assert sorted(rec.probs) == [0, 2, 3]
        for layer, probs in seen.items():
            torch.testing.assert_close(rec.probs[layer], probs, atol=1e-6, rtol=0)
        seen = rec.probs
        t = INPUTS["input_ids"].shape[1]
        far = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs() > window
        real = INPUTS["attention_mask"].bool()[:, None, :, None]  # real queries (a padded query sees every key)
        assert (rec.probs[2] * real)[..., far].eq(0).all()  # layer 2: sliding
        assert (rec.probs[0][..., far] > 0).any() and (rec.probs[3][..., far] > 0).any()  # layers 0 and 3: global
        pad = INPUTS["attention_mask"][-1] == 0
        for probs in rec.probs.values():
            assert (probs[-1][:, ~pad][..., pad] == 0).all()
            torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))


def test_recorder_scale_zero_equals_removing_the_heads() -> None:
    """Probabilities scaled by 0 (AttAttr α=0) leave W_O nothing to mix and no bias to add: the same logits as
    the layer's heads removed (EmptyAttention's zeros)."""
    pruned = pruned_copy(model(), PLAN)
    with torch.no_grad(), AttentionRecorder(scale={2: 0.0}).attach(pruned):
        scaled = pruned(**INPUTS).logits
    torch.testing.assert_close(scaled, logits(pruned_copy(pruned, {2: list(range(HEADS))})), atol=1e-5, rtol=0)


def test_mean_pooling_prunes_and_reloads(tmp_path: Path) -> None:
    m = model(classifier_pooling="mean")
    pruned = pruned_copy(m, PLAN, neuron_plan(m))
    masked = logits(m, presence_mask(pruned).float(), neuron_presence_mask(pruned).float())
    torch.testing.assert_close(logits(pruned), masked, atol=1e-5, rtol=0)
    path = save_pruned(pruned, tmp_path / "mean")
    assert (logits(load_pruned(path)) - logits(pruned)).abs().max() <= 1e-5


def test_removed_layer_marker_is_the_weight_where_there_is_no_bias(tmp_path: Path) -> None:
    """The removed layer keeps a zero-size `mlp.Wo.weight` (no bias to stand in for) and its `attention_type`
    (ModernBERT's loop picks the mask by it), so stock transformers refuses a model with only a layer removed."""
    pruned = remove_layers(pruned_copy(model(), {}), [1])
    skipped = layers(pruned)[1]
    assert [name for name, _ in skipped.named_buffers()] == ["mlp.Wo.weight"]
    assert skipped.attention_type == "sliding_attention"
    path = save_pruned(pruned, tmp_path / "removed")
    remote = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
    assert (logits(remote) - logits(pruned)).abs().max() <= 1e-5
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForSequenceClassification.from_pretrained(path)


def test_a_gated_neuron_costs_three_linear_rows() -> None:
    costs = unit_costs(model(), seq_len=16)
    assert costs.neuron == 2 * 3 * 16 * HIDDEN
    assert costs.head == 2 * (4 * 16 * HIDDEN * SIZE + 2 * 16 * 16 * SIZE)


def test_fused_qkv_must_name_one_linear() -> None:
    spec = arch_spec("modernbert")
    spec = replace(spec, attn=replace(spec.attn, key="Wk"))
    with pytest.raises(ValueError, match="ArchSpec.fused_qkv: query, key and value must name the one fused Linear"):
        register(spec, "not-an-architecture")
    assert isinstance(spec, ArchSpec)
