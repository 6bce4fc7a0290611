"""MPNet's own parts the generic architecture tests cannot see: the relative position bias computed once in the encoder
and shared by every layer (each pruned layer selects its own heads' columns, through both load routes and ONNX), the
attention block that normalises itself (EmptyAttention), layers that return tuples (SkippedLayer, gated layers) and
the missing SDPA path."""

from __future__ import annotations

import copy
import pickle
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, MPNetForSequenceClassification

from compressor.deploy import export as ex
from compressor.pruning.masking import AttentionRecorder, full_gates, full_neuron_gates, gated
from compressor.surgery.arch import arch_spec, layers, present_heads
from compressor.surgery.checkpoint import layout, load_pruned, save_pruned
from compressor.surgery.portable import HEAD_IDS, EmptyAttention, SkippedLayer, apply_layout, select_bias_heads
from compressor.surgery.slicing import prune_heads, pruned_copy, remove_layers
from compressor.testing import tiny_batch, tiny_model

LAYERS, HEADS = 4, 4
# Different heads kept in every layer (so a layer reading another's bias columns shows), one layer empty.
PLAN = {0: [0, 1], 1: [0, 1, 2, 3], 2: [1], 3: [3]}
INPUTS = {k: v for k, v in tiny_batch(batch=3, seq=9).items() if k != "labels"}  # the last row is half padding


@cache
def base() -> torch.nn.Module:
    return tiny_model("mpnet", layers=LAYERS, heads=HEADS, head_size=8)


def logits(model: torch.nn.Module, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(**INPUTS, **kwargs).logits


def masked_logits(heads: dict, neurons: dict | None = None) -> torch.Tensor:
    """The unpruned model with `heads` (and `neurons`) gated to 0: what the pruned model must reproduce."""
    gates, cells = full_gates(base()), full_neuron_gates(base())
    for layer, ids in heads.items():
        gates[layer, ids] = 0
    for layer, ids in (neurons or {}).items():
        cells[layer, ids] = 0
    with torch.no_grad(), gated(base(), gates, cells if neurons else None):
        return base()(**INPUTS).logits


def head_ids(model: torch.nn.Module) -> list[list[int] | None]:
    """Each layer's selected bias columns (None where the layer has no selection: full or no heads)."""
    out = []
    for layer in layers(model):
        attn = getattr(getattr(layer, "attention", None), "attn", None)
        ids = getattr(attn, HEAD_IDS, None) if attn is not None else None
        out.append(None if ids is None else ids.tolist())
    return out


def test_each_layer_selects_its_own_heads_of_the_shared_position_bias() -> None:
    """Pruned == masked with different heads per layer, and the selection is what makes it so: every layer reading
    the first columns of the bias instead (what slicing Q/K/V alone would give) changes the logits."""
    pruned = pruned_copy(base(), PLAN)
    assert head_ids(pruned) == [[2, 3], None, [0, 2, 3], [0, 1, 2]]
    assert head_ids(pruned) == [h or None for h in present_heads(pruned)]
    torch.testing.assert_close(logits(pruned), masked_logits(PLAN), atol=1e-5, rtol=0)
    wrong = copy.deepcopy(pruned)
    for layer in layers(wrong):
        if hasattr(layer.attention.attn, HEAD_IDS):
            ids = getattr(layer.attention.attn, HEAD_IDS)
            ids.copy_(torch.arange(len(ids)))
    assert (logits(wrong) - logits(pruned)).abs().max() > 1e-3


def test_pruning_in_rounds_keeps_original_ids_in_the_selection() -> None:
    """A second round refers to original ids and replaces each layer's selection (one hook per module)."""
    model = prune_heads(copy.deepcopy(base()), {0: [0], 2: [1]})
    model = prune_heads(model, {0: [1], 2: [1, 3], 3: [3]})
    assert head_ids(model) == [[2, 3], None, [0, 2], [0, 1, 2]]
    attn = layers(model)[0].attention.attn
    assert len(attn._forward_pre_hooks) == 1
    once = {0: [0, 1], 2: [1, 3], 3: [3]}
    torch.testing.assert_close(logits(model), masked_logits(once), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(prune_heads(copy.deepcopy(base()), once)), logits(model), atol=0, rtol=0)


def test_selection_reads_the_bias_passed_by_keyword_too() -> None:
    attn = layers(pruned_copy(base(), PLAN))[0].attention.attn
    hidden = torch.randn(2, 5, 32)
    bias = torch.randn(2, HEADS, 5, 5)
    with torch.no_grad():
        positional = attn(hidden, None, bias)[0]
        keyword = attn(hidden, attention_mask=None, position_bias=bias)[0]
    torch.testing.assert_close(positional, keyword, atol=0, rtol=0)


def test_a_missing_argument_or_missing_ids_is_refused() -> None:
    attn = copy.deepcopy(layers(base())[0].attention.attn)
    with pytest.raises(ValueError, match="MPNetSelfAttention.forward has no argument 'relative_bias'"):
        select_bias_heads(attn, "relative_bias", [0])
    fresh = apply_layout(copy.deepcopy(base()), layout(pruned_copy(base(), PLAN)))  # no saved weights loaded over
    with pytest.raises((IndexError, RuntimeError)):  # placeholder ids are invalid: never silently the wrong heads
        logits(fresh)


def test_empty_attention_normalises_like_the_block() -> None:
    """MPNet's attention block applies LayerNorm(dropout(W_O) + residual) itself: an emptied block keeps that, under
    the architecture's own state-dict names."""
    pruned = pruned_copy(base(), {1: list(range(HEADS))})
    block = layers(pruned)[1].attention
    assert isinstance(block, EmptyAttention) and block._norm == arch_spec("mpnet").norms.attention_norm == "LayerNorm"
    assert {k for k in block.state_dict()} == {"attn.o.weight", "attn.o.bias", "LayerNorm.weight", "LayerNorm.bias"}
    hidden = torch.randn(2, 5, 32)
    with torch.no_grad():
        out, probs = block(hidden, None, position_bias=torch.zeros(2, HEADS, 5, 5))
        expected = block.LayerNorm(block.attn.o.bias + hidden)
    assert probs is None
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(logits(pruned), masked_logits({1: list(range(HEADS))}), atol=1e-5, rtol=0)


def test_tuple_layers_skip_and_report_attentions() -> None:
    """The encoder indexes each layer's tuple: a removed layer returns (input, None), a fully gated one its input
    first, and `output_attentions` gives present heads' maps with None for layers without heads."""
    heads, neurons = {1: list(range(HEADS)), 3: [3]}, {1: list(range(10))}
    model = remove_layers(pruned_copy(base(), heads, neurons), [2])
    assert isinstance(layers(model)[2], SkippedLayer) and layers(model)[2].returns_tuple
    with torch.no_grad():
        out = model(**INPUTS, output_attentions=True, output_hidden_states=True)
    assert [None if a is None else tuple(a.shape) for a in out.attentions] == [
        (3, HEADS, 9, 9),
        None,
        None,
        (3, 3, 9, 9),
    ]
    assert len(out.hidden_states) == LAYERS + 1 and torch.equal(out.hidden_states[2], out.hidden_states[3])
    everything = {**heads, 2: list(range(HEADS))}
    all_neurons = {**neurons, 2: list(range(67))}
    torch.testing.assert_close(out.logits, masked_logits(everything, all_neurons), atol=1e-5, rtol=0)


def test_attention_recorder_reads_present_heads_at_the_dropout() -> None:
    pruned = pruned_copy(base(), PLAN)
    assert arch_spec(pruned).probs_dropout == "dropout"
    with torch.no_grad(), AttentionRecorder().attach(pruned) as rec:
        pruned(**INPUTS)
    assert {layer: p.shape[1] for layer, p in rec.probs.items()} == {0: 2, 2: 3, 3: 3}
    for probs in rec.probs.values():
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]), atol=1e-5, rtol=0)


def test_no_sdpa_path_loads_eager_and_is_declared() -> None:
    """transformers has no SDPA attention for MPNet (the declaration says so); asking for SDPA falls back to eager
    (`load_pruned`'s default, below; `as_sdpa` here)."""
    from compressor.bench.candidates import as_sdpa

    assert arch_spec("mpnet").sdpa is MPNetForSequenceClassification._supports_sdpa is False
    with pytest.raises(ValueError, match="does not support"):
        tiny_model("mpnet", attention="sdpa")
    pruned = remove_layers(pruned_copy(base(), PLAN), [3])
    fast = as_sdpa(pruned)  # what the benchmarks time: rebuilt, replayed and loaded in memory (eager here)
    assert fast.config._attn_implementation == "eager" and head_ids(fast) == head_ids(pruned)
    torch.testing.assert_close(logits(fast), logits(pruned), atol=0, rtol=0)


def test_both_routes_and_pickle_keep_the_selection(tmp_path: Path) -> None:
    pruned = remove_layers(pruned_copy(base(), PLAN, {0: list(range(0, 67, 2))}), [3])
    path = save_pruned(pruned, tmp_path / "model")
    shipped = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
    assert type(shipped).__module__.startswith("transformers_modules.")
    for loaded in (load_pruned(path), load_pruned(path, attn_implementation="eager"), shipped):
        assert loaded.config._attn_implementation == "eager"
        assert head_ids(loaded) == head_ids(pruned) == [[2, 3], None, [0, 2, 3], None]
        assert getattr(layers(loaded)[0].attention.attn, HEAD_IDS).dtype == torch.long
        assert (logits(loaded) - logits(pruned)).abs().max() <= 1e-5
    again = pickle.loads(pickle.dumps(pruned))
    assert torch.equal(logits(again), logits(pruned))
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForSequenceClassification.from_pretrained(path)


def test_onnx_graph_selects_each_layers_bias_heads(tmp_path: Path) -> None:
    """The exported graph carries each layer's selection (fp32 and optimised parity with the masked model); ORT's
    optimizer does not fuse MPNet's attention (position bias before the softmax), as the declaration says."""
    from conftest import make_tokenizer_dir
    from transformers import AutoTokenizer

    pruned = pruned_copy(base(), PLAN)
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    model_dir = save_pruned(pruned, tmp_path / "model", tokenizer)
    batches = [tiny_batch(batch=4, seq=11, seed=s) for s in range(2)]
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], batches)
    assert result["fp32"]["max_abs_diff"] <= 1e-4 and result["optimized"]["max_abs_diff"] <= 1e-4
    assert not arch_spec("mpnet").ort_fusion().fuses_attention and result["optimized"]["fused_attention_nodes"] == 0
    onnx_logits = ex.OnnxClassifier(tmp_path / "onnx" / "fp32")(INPUTS)
    assert np.abs(onnx_logits - masked_logits(PLAN).numpy()).max() <= 1e-4


def test_head_analysis_maps_only_present_heads(tmp_path: Path) -> None:
    """The analysis reads MPNet's maps at its probability dropout: confidence for every present head (per layer),
    none for removed ones, equal on the pruned model and the unpruned one where heads survive."""
    from conftest import make_tokenizer_dir
    from transformers import AutoTokenizer

    from compressor.analysis import analyze_heads

    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    texts = ["the movie was good , but the plot was dull .", "a really fun film", "the acting was quite weak"]
    pruned = pruned_copy(base(), PLAN)
    maps = analyze_heads(pruned, tokenizer, texts, texts, max_length=16, syntax=False)["maps"]["confidence"]
    full = analyze_heads(base(), tokenizer, texts, texts, max_length=16, syntax=False)["maps"]["confidence"]
    alive = [[h in heads for h in range(HEADS)] for heads in present_heads(pruned)]
    assert [[value is not None for value in row] for row in maps] == alive
    assert maps[0][2] == pytest.approx(full[0][2]) and maps[0][3] == pytest.approx(full[0][3])  # layer 0 kept 2, 3


def test_load_model_asking_for_sdpa_gets_eager(tmp_path: Path) -> None:
    """`sources.load_model` defaults to SDPA; an MPNet directory (plain or pruned) loads with eager attention."""
    from compressor.recipe import ModelSpec
    from compressor.sources.models import load_model

    base().save_pretrained(tmp_path / "plain")
    save_pruned(pruned_copy(base(), PLAN), tmp_path / "pruned")
    for name, expected in (("plain", base()), ("pruned", pruned_copy(base(), PLAN))):
        model = load_model(ModelSpec(source=str(tmp_path / name), task_tuned=True)).eval()
        assert model.config._attn_implementation == "eager"
        assert (logits(model) - logits(expected)).abs().max() <= 1e-5
