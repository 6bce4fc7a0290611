"""Gates and attention recording on physically pruned models (original head ids throughout)."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from compressor.pruning.masking import AttentionRecorder, full_gates, gated
from compressor.surgery.arch import presence_mask, present_heads
from compressor.surgery.slicing import pruned_copy
from compressor.testing import ARCHS, tiny_batch, tiny_model

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
    """Empty layers report [batch, 0, T, T]; gates and output_attentions do not change the logits."""
    model = pruned(arch)
    gates = random_gates(1)
    with torch.no_grad(), gated(model, gates):
        out = model(**INPUTS, output_attentions=True)
        plain = model(**INPUTS).logits
    b, t = INPUTS["input_ids"].shape
    assert [tuple(a.shape) for a in out.attentions] == [(b, len(h), t, t) for h in present_heads(model)]
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


def test_recorder_requires_eager() -> None:
    model = tiny_model("bert", attention="sdpa", layers=LAYERS, heads=HEADS, head_size=8)
    with pytest.raises(RuntimeError, match="attn_implementation='eager'"):
        with AttentionRecorder().attach(model):
            pass
