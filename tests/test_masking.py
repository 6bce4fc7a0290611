"""Gates and attention recording on physically pruned models (original head ids throughout)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
import torch

from compressor.pruning.masking import AttentionRecorder, full_gates, full_neuron_gates, gated
from compressor.surgery.arch import original_ffn_size, presence_mask, present_heads
from compressor.surgery.slicing import prune_neurons, pruned_copy
from compressor.testing import ARCHS, SDPA_ARCHS, tiny_batch, tiny_model

LAYERS, HEADS = 3, 4
PLAN = {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}  # uneven, with an empty middle layer
BATCH = tiny_batch(batch=3, seq=9)
INPUTS = {k: v for k, v in BATCH.items() if k != "labels"}


@cache
def base(arch: str) -> torch.nn.Module:
    return tiny_model(arch, layers=LAYERS, heads=HEADS, head_size=8)


@cache
def pruned(arch: str) -> torch.nn.Module:
    return pruned_copy(base(arch), PLAN)


def random_gates(seed: int = 0) -> torch.Tensor:
    return torch.rand(LAYERS, HEADS, generator=torch.Generator().manual_seed(seed)) * 1.5


@pytest.mark.parametrize("arch", ARCHS)
def test_gates_on_pruned_model_index_original_heads(arch: str) -> None:
    """Arbitrary gates on a pruned model == the same gates on the original with the pruned heads at 0."""
    gates = random_gates()
    keep = presence_mask(pruned(arch)).float()
    with torch.no_grad(), gated(pruned(arch), gates):
        out = pruned(arch)(**INPUTS).logits
    with torch.no_grad(), gated(base(arch), gates * keep):
        ref = base(arch)(**INPUTS).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_gate_gradients_flow_on_pruned_model(arch: str) -> None:
    """d loss / d ξ on the pruned model equals the masked original's for present heads and is 0 for removed ones."""
    keep = presence_mask(pruned(arch)).float()
    grads = []
    for model, mask in ((pruned(arch), torch.ones_like(keep)), (base(arch), keep)):
        gates = full_gates(model).requires_grad_(True)
        with gated(model, gates * mask):
            model(**BATCH).loss.backward()
        grads.append(gates.grad)
    on_pruned, on_masked = grads
    assert on_pruned is not None and torch.isfinite(on_pruned).all()
    assert (on_pruned[keep.bool()] != 0).all()
    assert (on_pruned[~keep.bool()] == 0).all()
    torch.testing.assert_close(on_pruned, on_masked, atol=1e-5, rtol=1e-4)


def test_gates_shape_checked() -> None:
    with pytest.raises(ValueError, match=r"gates: expected shape \(3, 4\), got \(3, 3\)"):
        with gated(pruned("bert"), torch.ones(3, 3)):
            pass


def test_gates_are_read_at_every_forward_and_hooks_removed() -> None:
    model = pruned("bert")
    gates = full_gates(model)
    with torch.no_grad():
        plain = model(**INPUTS).logits
        with gated(model, gates):
            same = model(**INPUTS).logits
            gates[0] = 0.0
            changed = model(**INPUTS).logits
        after = model(**INPUTS).logits
    assert torch.equal(same, plain) and torch.equal(after, plain)
    assert not torch.allclose(changed, plain)


@pytest.mark.parametrize("arch", ARCHS)
def test_output_attentions_on_pruned_model(arch: str) -> None:
    """transformers 5 lists attentions only for layers whose attention ran: one [batch, present heads, T, T] entry per
    layer that has heads, in layer order (an empty layer gives none; DeBERTa's and MPNet's own encoder loops give None
    there), equal to what `AttentionRecorder` records; gates and output_attentions do not change the logits."""
    model = pruned(arch)
    gates = random_gates(1)
    with torch.no_grad(), gated(model, gates):
        out = model(**INPUTS, output_attentions=True)
        plain = model(**INPUTS).logits
        with AttentionRecorder().attach(model) as rec:
            model(**INPUTS)
    b, t = INPUTS["input_ids"].shape
    kept = [layer for layer, h in enumerate(present_heads(model)) if h]
    assert kept == [0, 2]
    attentions = out.attentions
    if arch in ("deberta-v2", "mpnet"):  # layers that return tuples: a removed one returns (input, None)
        assert [a is None for a in attentions] == [not h for h in present_heads(model)]
        attentions = [a for a in attentions if a is not None]
    assert [tuple(a.shape) for a in attentions] == [(b, len(present_heads(model)[i]), t, t) for i in kept]
    for layer, probs in zip(kept, attentions, strict=True):
        torch.testing.assert_close(probs, rec.probs[layer], atol=1e-6, rtol=0)
    torch.testing.assert_close(out.logits, plain, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_recorder_on_pruned_model_matches_masked_original(arch: str) -> None:
    """Probabilities of the heads left equal the masked original's for those heads; empty layers record nothing."""
    model = pruned(arch)
    with torch.no_grad(), AttentionRecorder().attach(model) as rec:
        model(**INPUTS)
    gates = full_gates(base(arch)) * presence_mask(model).float()
    with torch.no_grad(), gated(base(arch), gates), AttentionRecorder().attach(base(arch)) as ref:
        base(arch)(**INPUTS)
    b, t = INPUTS["input_ids"].shape
    heads = present_heads(model)
    assert sorted(rec.probs) == [layer for layer, h in enumerate(heads) if h]
    for layer, probs in rec.probs.items():
        assert probs.shape == (b, len(heads[layer]), t, t)
        torch.testing.assert_close(probs.sum(-1), torch.ones(b, len(heads[layer]), t))
        torch.testing.assert_close(probs, ref.probs[layer][:, heads[layer]], atol=1e-6, rtol=0)


def test_recorder_scale_zero_equals_removing_the_layer() -> None:
    """Scaling a layer's probabilities by 0 (AttAttr α=0) on a pruned model == pruning that layer's heads too."""
    model = pruned("distilbert")
    with torch.no_grad(), AttentionRecorder(scale={2: 0.0}).attach(model):
        scaled = model(**INPUTS).logits
    with torch.no_grad():
        ref = pruned_copy(model, {2: list(range(HEADS))})(**INPUTS).logits
    torch.testing.assert_close(scaled, ref, atol=1e-5, rtol=0)


def test_recorder_gradients_on_pruned_model() -> None:
    model = pruned("bert")
    scale = {layer: torch.tensor(1.0) for layer, h in enumerate(present_heads(model)) if h}
    with AttentionRecorder(scale=scale, retain_grad=True).attach(model) as rec:
        model(**BATCH).loss.backward()
    for layer in scale:
        assert rec.probs[layer].grad is not None
        assert rec.probs[layer].grad.shape == rec.probs[layer].shape


@pytest.mark.parametrize("arch", SDPA_ARCHS)
def test_recorder_works_on_sdpa_models(arch: str) -> None:
    """A model loaded with SDPA is switched to the recorded attention while attached (same probabilities and scaled
    logits as the eager model) and gets its own implementation back after, also when the block raises."""
    sdpa = pruned_copy(tiny_model(arch, attention="sdpa", layers=LAYERS, heads=HEADS, head_size=8), PLAN)
    eager = pruned(arch)
    assert sdpa.config._attn_implementation == "sdpa"
    with torch.no_grad():
        fast = sdpa(**INPUTS).logits
        with AttentionRecorder().attach(sdpa) as rec:
            recorded = sdpa(**INPUTS).logits
        with AttentionRecorder().attach(eager) as ref:
            eager(**INPUTS)
        torch.testing.assert_close(recorded, fast, atol=1e-5, rtol=0)
        assert sorted(rec.probs) == sorted(ref.probs) == [0, 2]
        for layer in rec.probs:
            torch.testing.assert_close(rec.probs[layer], ref.probs[layer], atol=1e-6, rtol=0)
        scale = {0: 0.5, 2: 0.0}
        with AttentionRecorder(scale=scale).attach(sdpa):
            scaled = sdpa(**INPUTS).logits
        with AttentionRecorder(scale=scale).attach(eager):
            scaled_eager = eager(**INPUTS).logits
    assert (scaled - fast).abs().max() > 1e-3  # the scale reached the SDPA model's attention
    torch.testing.assert_close(scaled, scaled_eager, atol=1e-5, rtol=0)
    assert sdpa.config._attn_implementation == "sdpa"
    with pytest.raises(KeyError), AttentionRecorder().attach(sdpa):
        raise KeyError("inside")
    assert sdpa.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.equal(sdpa(**INPUTS).logits, fast)


def test_recorder_hooked_at_dropout_requires_eager(monkeypatch) -> None:
    """An architecture whose eager attention is hooked at its probability dropout (`probs_dropout`) is refused in one
    line when loaded with another implementation (DeBERTa-v2, the architecture that declares one, has no other: BERT
    stands in)."""
    from compressor.surgery.arch import ARCHITECTURES

    bert = ARCHITECTURES["bert"]
    monkeypatch.setitem(ARCHITECTURES, "bert", replace(bert, attn=replace(bert.attn, probs_dropout="dropout")))
    model = tiny_model("bert", attention="sdpa", layers=LAYERS, heads=HEADS, head_size=8)
    with pytest.raises(RuntimeError, match=r"need attn_implementation='eager' \(model has 'sdpa'\)"):
        with AttentionRecorder().attach(model):
            pass


def test_hidden_states_of_a_gated_skipped_layer() -> None:
    """A layer gated to nothing is skipped: its hidden state is its input, whatever ran on the model before."""
    model = tiny_model("bert", layers=LAYERS, heads=HEADS, head_size=8)
    width = original_ffn_size(model)
    heads, neurons = full_gates(model), full_neuron_gates(model)
    heads[1], neurons[1] = 0.0, 0.0
    with torch.no_grad():
        model(**INPUTS, output_hidden_states=True)  # transformers installs its capture hooks now
        with gated(model, heads, neurons):
            states = model(**INPUTS, output_hidden_states=True).hidden_states
    reference = pruned_copy(tiny_model("bert", layers=LAYERS, heads=HEADS, head_size=8), {1: [0, 1, 2, 3]})
    reference = prune_neurons(reference, {1: list(range(width))})
    with torch.no_grad():
        expected = reference(**INPUTS, output_hidden_states=True).hidden_states
    assert len(states) == len(expected) == LAYERS + 1
    for mine, theirs in zip(states, expected, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
