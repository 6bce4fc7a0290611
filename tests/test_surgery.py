"""Physical head removal: masked (gates at 0) == pruned across architectures, plans, empty layers and rounds."""

from __future__ import annotations

import copy
import io
import warnings
from functools import cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForSequenceClassification

from compressor.core import compat
from compressor.pruning.masking import full_gates, gated
from compressor.surgery.arch import (
    UnsupportedArchitectureError,
    arch_spec,
    get_path,
    layers,
    present_heads,
    present_neurons,
    pruned_heads,
    removed_layers,
)
from compressor.surgery.cost import encoder_flops
from compressor.surgery.slicing import EmptyAttention, PlanError, empty_layers, prune_heads, pruned_copy, validate_plan
from compressor.testing import ARCH_ATTN, ARCHS, tiny_batch, tiny_model, tiny_unsupported_model

LAYERS, HEADS, HEAD_SIZE = 3, 4, 8
BATCH = {k: v for k, v in tiny_batch(batch=3, seq=9).items() if k != "labels"}


@cache
def base(arch: str, attention: str = "eager") -> torch.nn.Module:
    """One tiny model per (arch, attention); tests copy it before modifying."""
    model = tiny_model(arch, attention=attention, layers=LAYERS, heads=HEADS, head_size=HEAD_SIZE)
    assert model.config._attn_implementation == attention  # no silent fallback to eager
    return model


def logits(model: torch.nn.Module, gates: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad(), gated(model, gates):
        return model(**BATCH).logits


def gates_for(model: torch.nn.Module, plan: dict[int, list[int]]) -> torch.Tensor:
    gates = full_gates(model)
    for layer, heads in plan.items():
        gates[layer, list(heads)] = 0.0
    return gates


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].shape == b[key].shape and torch.equal(a[key], b[key]), key


def assert_structure(model: torch.nn.Module, plan: dict[int, list[int]]) -> None:
    """Weights, head counts and config reflect exactly the heads left by `plan` (original ids)."""
    spec = arch_spec(model)
    expected = [[h for h in range(HEADS) if h not in plan.get(layer, [])] for layer in range(LAYERS)]
    assert present_heads(model) == expected
    assert pruned_heads(model) == {k: sorted(v) for k, v in plan.items() if v}
    assert empty_layers(model) == [i for i, heads in enumerate(expected) if not heads]
    for module, heads in zip(layers(model), expected, strict=True):
        if not heads:
            assert isinstance(get_path(module, spec.attention), EmptyAttention)
            assert get_path(module, spec.out_proj).weight.shape[1] == 0
            continue
        attn = get_path(module, spec.self_attn)
        width = len(heads) * HEAD_SIZE
        for name in spec.qkv:  # one fused Linear holds Q, K and V rows
            assert getattr(attn, name).weight.shape == (3 // len(spec.qkv) * width, HEADS * HEAD_SIZE)
        assert get_path(module, spec.out_proj).weight.shape == (HEADS * HEAD_SIZE, width)
        for attr, value in ((spec.heads_attr, len(heads)), (spec.width_attr, width)):
            assert attr is None or getattr(attn, attr) == value  # None: the forward infers the heads


CASES = {
    "nothing": [{}],
    "one head": [{1: [2]}],
    "uneven": [{0: [0], 1: [0, 1, 2], 2: []}],
    "empty middle layer": [{1: [0, 1, 2, 3]}],
    "every layer empty": [{0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3]}],
    "rounds disjoint": [{0: [3]}, {0: [0], 2: [1]}, {1: [0, 1, 2, 3]}],
    "rounds repeat earlier ids": [{0: [1, 3]}, {0: [1, 3, 0], 2: [2]}, {0: [0, 1, 2, 3], 2: [2]}],
    "rounds empty a layer gradually": [{2: [0]}, {2: [1, 2]}, {2: [3]}],
}


def union(rounds: list[dict[int, list[int]]]) -> dict[int, list[int]]:
    out: dict[int, set[int]] = {}
    for plan in rounds:
        for layer, heads in plan.items():
            out.setdefault(layer, set()).update(heads)
    return {k: sorted(v) for k, v in out.items() if v}


@pytest.mark.parametrize("arch,attention", ARCH_ATTN)
@pytest.mark.parametrize("case", list(CASES))
def test_masked_equals_pruned_table(arch: str, attention: str, case: str) -> None:
    model = base(arch, attention)
    rounds = CASES[case]
    plan = union(rounds)
    pruned = copy.deepcopy(model)
    for step in rounds:
        prune_heads(pruned, step)
    assert_structure(pruned, plan)
    torch.testing.assert_close(logits(pruned), logits(model, gates_for(model, plan)), atol=1e-5, rtol=0)
    if plan:  # negative control: the removed heads mattered, so the equality above is not vacuous
        assert (logits(pruned) - logits(model)).abs().max() > 1e-3


plans = st.lists(st.sets(st.integers(0, HEADS - 1)), min_size=LAYERS, max_size=LAYERS).map(
    lambda sets: {layer: sorted(heads) for layer, heads in enumerate(sets)}
)


@settings(max_examples=80, deadline=None)
@given(arch_attn=st.sampled_from(ARCH_ATTN), plan=plans, data=st.data())
def test_masked_equals_pruned_property(arch_attn: tuple[str, str], plan: dict[int, list[int]], data) -> None:
    """Any plan split into any rounds (later rounds may repeat earlier ids) equals masking its union."""
    model = base(*arch_attn)
    pairs = [(layer, head) for layer, heads in plan.items() for head in heads]
    n_rounds = data.draw(st.integers(1, 3), label="rounds")
    assign = data.draw(st.lists(st.integers(0, n_rounds - 1), min_size=len(pairs), max_size=len(pairs)))
    cumulative = data.draw(st.booleans(), label="cumulative")
    pruned = copy.deepcopy(model)
    for r in range(n_rounds):
        step: dict[int, list[int]] = {}
        for (layer, head), k in zip(pairs, assign, strict=True):
            if k == r or (cumulative and k < r):
                step.setdefault(layer, []).append(head)
        prune_heads(pruned, step)
    assert_structure(pruned, plan)
    torch.testing.assert_close(logits(pruned), logits(model, gates_for(model, plan)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_pruned_copy_leaves_original_and_replay_is_idempotent(arch: str) -> None:
    model = base(arch)
    before = state(model)
    plan = {0: [1, 2], 2: [0, 1, 2, 3]}
    pruned = pruned_copy(model, plan)
    assert_same_state(state(model), before)
    assert not hasattr(model.config, "pruned_heads")  # transformers 5 has no such field; only surgery sets ours
    assert pruned_heads(model) == {}
    once = state(pruned)
    prune_heads(pruned, plan)
    prune_heads(pruned, {"0": [1], 2: [3]})
    assert_same_state(state(pruned), once)
    assert_structure(pruned, plan)


@pytest.mark.parametrize("arch", ARCHS)
def test_empty_layers_export_to_onnx(arch: str) -> None:
    """EmptyAttention traces to a graph that matches PyTorch on a batch/length it was not traced with."""
    import onnxruntime as ort  # a core dependency: missing, the test fails rather than skips

    model = pruned_copy(base(arch), {0: [0, 1, 2, 3], 1: [2], 2: [0, 1, 2, 3]})
    names = ["input_ids", "attention_mask"]
    buffer = io.BytesIO()
    with warnings.catch_warnings(), compat.traceable(model):  # as the product's TorchScript exporter traces
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (BATCH["input_ids"], BATCH["attention_mask"]),
            buffer,
            input_names=names,
            output_names=["logits"],
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
            dynamo=False,
            opset_version=17,
        )
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    other = tiny_batch(batch=2, seq=6, seed=1)
    out = session.run(None, {n: other[n].numpy() for n in names})[0]
    with torch.no_grad():
        ref = model(input_ids=other["input_ids"], attention_mask=other["attention_mask"]).logits
    torch.testing.assert_close(torch.from_numpy(out), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("with_neurons", [False, True], ids=["heads", "heads+neurons"])
@pytest.mark.parametrize("arch", ARCHS)
def test_encoder_flops_match_flop_counter(arch: str, with_neurons: bool) -> None:
    """The analytic count equals torch's FLOP counter on the encoder, empty layer and uneven heads included; with
    neurons also uneven FFN widths, an FFN without neurons (layer 1) and a removed layer (layer 2)."""
    width = len(present_neurons(base(arch))[0])
    neurons = {0: list(range(0, width, 3)), 1: list(range(width)), 2: list(range(width))} if with_neurons else None
    model = pruned_copy(base(arch), {0: [0, 1, 2, 3], 1: [1]} | ({2: list(range(HEADS))} if neurons else {}), neurons)
    assert removed_layers(model) == ([2] if with_neurons else [])
    counter = FlopCounterMode(display=False)
    with counter:
        model(input_ids=torch.randint(4, 100, (1, 16)))
    counts = counter.get_flop_counts()
    stack = f"{type(model).__name__}.{model.base_model_prefix}.{arch_spec(model).layers}"
    per_layer = [sum(counts.get(f"{stack}.{i}", {}).values()) for i in range(LAYERS)]
    assert sum(per_layer) == encoder_flops(model, 16)
    assert encoder_flops(model, 16) < encoder_flops(base(arch), 16)


def _refused_models() -> dict[str, torch.nn.Module]:
    decoder_bert = copy.deepcopy(base("bert").config)
    decoder_bert.is_decoder = True
    return {
        "albert": tiny_unsupported_model("albert"),
        "gpt2": tiny_unsupported_model("gpt2"),
        "bert": AutoModelForSequenceClassification.from_config(decoder_bert),
    }


@pytest.mark.parametrize("name", ["albert", "gpt2", "bert"])
def test_unsupported_architectures_refused_before_any_change(name: str) -> None:
    model = _refused_models()[name]
    before = state(model)
    with pytest.raises(UnsupportedArchitectureError, match=f"architecture '{name}'"):
        prune_heads(model, {0: [0]})
    assert_same_state(state(model), before)
    assert not pruned_heads(model)


@pytest.mark.parametrize(
    "plan,message",
    [
        ({3: [0]}, r"layer 3 out of range; expected 0\.\.2"),
        ({-1: [0]}, r"layer -1 out of range"),
        ({0: [4]}, r"layer 0 heads \[4\] out of range; expected 0\.\.3"),
        ({1: [0, -2]}, r"layer 1 heads \[-2\] out of range"),
        ({0: ["x"]}, r"layer 0 head 'x' is not an integer"),
        ({0: [1.5]}, r"layer 0 head 1\.5 is not an integer"),
        ({0: [True]}, r"layer 0 head True is not an integer"),
        ({"top": [0]}, r"layer 'top' is not an integer"),
        ({0: 3}, r"layer 0 expected a list of head ids"),
        ({0: [0], "0": [1]}, r"layer 0 appears twice"),
        ([(0, [1])], r"expected a mapping"),
    ],
)
def test_validate_plan_errors(plan, message: str) -> None:
    model = copy.deepcopy(base("bert"))
    before = state(model)
    with pytest.raises(PlanError, match=message):
        validate_plan(model, plan)
    with pytest.raises(ValueError, match=message):
        prune_heads(model, plan)
    assert_same_state(state(model), before)


def test_validate_plan_normalises_and_uses_original_ids() -> None:
    model = pruned_copy(base("bert"), {0: [0, 1]})
    assert validate_plan(model, {"0": [3, 1, 3], 2: []}) == {0: [1, 3], 2: []}
    assert validate_plan(model, {0: (0, 1, 2, 3)}) == {0: [0, 1, 2, 3]}
