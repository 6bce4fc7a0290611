"""FFN neurons and whole layers as prunable units: masked == pruned == reloaded, across architectures."""

from __future__ import annotations

import json
from functools import cache

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from compressor.checkpoint import PLAN_FILE, load_pruned, save_pruned
from compressor.layout import (
    get_path,
    layers,
    neuron_presence_mask,
    original_ffn_size,
    present_heads,
    present_neurons,
    removed_layers,
)
from compressor.masking import full_gates, full_neuron_gates, gated
from compressor.surgery import PlanError, SkippedLayer, prune_neurons, pruned_copy, remove_layers
from compressor.testing import ARCHS, tiny_batch, tiny_model

LAYERS, HEADS = 3, 4
INPUTS = {k: v for k, v in tiny_batch(batch=3, seq=9).items() if k != "labels"}


@cache
def base(arch: str) -> torch.nn.Module:
    return tiny_model(arch, layers=LAYERS, heads=HEADS, head_size=8)


def every(arch: str) -> list[int]:
    return list(range(original_ffn_size(base(arch))))


def uneven_plan(arch: str) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Layer 0: some heads and every other neuron; layer 1: everything (removed); layer 2: no neuron left."""
    heads = {0: [1, 3], 1: list(range(HEADS)), 2: [2]}
    return heads, {0: every(arch)[::2], 1: every(arch), 2: every(arch)}


def gates_for(arch: str, heads: dict, neurons: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g, n = full_gates(base(arch)), full_neuron_gates(base(arch))
    for layer, ids in heads.items():
        g[layer, ids] = 0.0
    for layer, ids in neurons.items():
        n[layer, ids] = 0.0
    return g, n


def logits(model: torch.nn.Module, gates=None, neurons=None, **kwargs) -> torch.Tensor:
    with torch.no_grad(), gated(model, gates, neurons):
        return model(**INPUTS, **kwargs).logits


@pytest.mark.parametrize("arch", ARCHS)
def test_neuron_and_layer_removal_matches_masking(arch: str) -> None:
    """Gating units to 0 (the dead layer skipped) gives the pruned model's logits, with and without attentions."""
    heads, neurons = uneven_plan(arch)
    pruned = pruned_copy(base(arch), heads, neurons)
    ref = logits(base(arch), *gates_for(arch, heads, neurons))
    torch.testing.assert_close(logits(pruned), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(pruned, output_attentions=True), ref, atol=1e-5, rtol=0)
    assert removed_layers(pruned) == [1]
    assert isinstance(layers(pruned)[1], SkippedLayer) and not list(layers(pruned)[1].parameters())
    assert [len(n) for n in present_neurons(pruned)] == [len(every(arch)) - len(every(arch)[::2]), 0, 0]
    assert present_heads(pruned) == [[0, 2], [], [0, 1, 3]]


@pytest.mark.parametrize("arch", ARCHS)
def test_skipped_layer_is_identity(arch: str) -> None:
    """A removed layer passes its input through: removing every layer leaves embeddings → classifier."""
    model = remove_layers(pruned_copy(base(arch), {}), range(LAYERS))
    hidden = model(**INPUTS, output_hidden_states=True).hidden_states
    for before, after in zip(hidden, hidden[1:], strict=False):
        torch.testing.assert_close(before, after, atol=0, rtol=0)


def test_layer_is_not_skipped_while_a_unit_is_open() -> None:
    """Heads at 0 but one neuron open: the layer still runs (output differs from the skipped layer)."""
    heads, neurons = {1: list(range(HEADS))}, {1: every("bert")[1:]}
    open_one = logits(base("bert"), *gates_for("bert", heads, neurons))
    skipped = logits(base("bert"), *gates_for("bert", heads, {1: every("bert")}))
    assert not torch.allclose(open_one, skipped, atol=1e-4)
    torch.testing.assert_close(logits(pruned_copy(base("bert"), heads, neurons)), open_one, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_neuron_gates_on_pruned_model_index_original_ids(arch: str) -> None:
    """Random neuron gates on a neuron-pruned model == the same gates on the original with removed ones at 0."""
    pruned = pruned_copy(base(arch), {}, {0: every(arch)[::3], 2: every(arch)[1::2]})
    gates = torch.rand(LAYERS, len(every(arch)), generator=torch.Generator().manual_seed(0)) * 1.5
    ref = logits(base(arch), None, gates * neuron_presence_mask(pruned).float())
    torch.testing.assert_close(logits(pruned, None, gates), ref, atol=1e-5, rtol=0)


def test_neuron_rounds_compose_and_replay_idempotently() -> None:
    """Two rounds == one round with the union; replaying the cumulative plan changes nothing."""
    first, second = {0: [1, 5]}, {0: [2], 2: [7]}
    twice = prune_neurons(pruned_copy(base("bert"), {}, first), second)
    once = pruned_copy(base("bert"), {}, {0: [1, 2, 5], 2: [7]})
    torch.testing.assert_close(logits(twice), logits(once), atol=1e-6, rtol=0)
    before = logits(twice)
    prune_neurons(twice, {0: [1, 2, 5], 2: [7]})
    torch.testing.assert_close(logits(twice), before, atol=0, rtol=0)
    assert twice.config.pruned_neurons == {0: [1, 2, 5], 2: [7]}


@pytest.mark.parametrize(
    ("plan", "message"),
    [({0: [10_000]}, r"layer 0 neurons \[10000\] out of range; expected 0\.\.66"), ({5: [1]}, "layer 5 out of range")],
)
def test_bad_neuron_plan_is_refused_before_changes(plan: dict, message: str) -> None:
    model = pruned_copy(base("bert"), {})
    with pytest.raises(PlanError, match=message):
        prune_neurons(model, plan)
    assert present_neurons(model) == present_neurons(base("bert"))
    with pytest.raises(PlanError, match="layers \\[7\\] out of range"):
        remove_layers(model, [7])


@pytest.mark.parametrize("arch", ARCHS)
def test_uneven_widths_and_removed_layers_reload(arch: str, tmp_path) -> None:
    """load_pruned rebuilds uneven FFN widths and removed layers exactly; plain transformers is not promised."""
    heads, neurons = uneven_plan(arch)
    pruned = pruned_copy(base(arch), heads, neurons)
    save_pruned(pruned, tmp_path / "m", original=base(arch))
    plan = json.loads((tmp_path / "m" / PLAN_FILE).read_text())
    assert plan["removed_layers"] == [1] and plan["plain_loadable"] is False
    assert "load with `compressor.load_pruned`" in (tmp_path / "m" / "README.md").read_text()
    loaded = load_pruned(tmp_path / "m", attn_implementation="eager")
    torch.testing.assert_close(logits(loaded), logits(pruned), atol=0, rtol=0)
    assert present_neurons(loaded) == present_neurons(pruned)


@pytest.mark.parametrize("arch", ARCHS)
def test_uniform_widths_reload_in_plain_transformers(arch: str, tmp_path) -> None:
    """Equal FFN widths in every layer: the saved model also loads with AutoModelForSequenceClassification."""
    neurons = {layer: every(arch)[layer::4] for layer in range(LAYERS)}
    pruned = pruned_copy(base(arch), {0: [1]}, neurons)
    save_pruned(pruned, tmp_path / "m", original=base(arch))
    assert json.loads((tmp_path / "m" / PLAN_FILE).read_text())["plain_loadable"] is True
    card = (tmp_path / "m" / "README.md").read_text()
    assert "`AutoModelForSequenceClassification.from_pretrained` works too" in card
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m", attn_implementation="eager").eval()
    torch.testing.assert_close(logits(plain), logits(pruned), atol=1e-5, rtol=0)
    assert present_neurons(plain) == present_neurons(pruned)  # original ids survive the plain load
    ours = load_pruned(tmp_path / "m", attn_implementation="eager")
    torch.testing.assert_close(logits(ours), logits(pruned), atol=0, rtol=0)
    assert original_ffn_size(ours) == len(every(arch))
    assert pruned.config.to_dict().get("compressor_ffn_size") is None  # the in-memory config is left as it was


def test_ffn_paths_point_at_the_feed_forward_linears() -> None:
    from compressor.layout import arch_spec

    for arch in ARCHS:
        spec, layer = arch_spec(base(arch)), layers(base(arch))[0]
        width = len(every(arch))
        assert get_path(layer, spec.ffn_in).out_features == width
        assert get_path(layer, spec.ffn_out).in_features == width
