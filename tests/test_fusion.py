"""ORT's fusions on pruned graphs: one fused Attention per layer that kept heads, each with its own head count (uneven
counts and a layer with none), parity with PyTorch, the fusions recorded in export.json, and int8 quantised from
the fused graph."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_tokenizer_dir

from compressor.deploy import export as ex
from compressor.deploy import exporters
from compressor.surgery.arch import arch_spec, head_size, present_heads
from compressor.surgery.checkpoint import load_pruned, save_pruned
from compressor.surgery.slicing import prune_heads
from compressor.testing import ARCHS, tiny_batch, tiny_model

LAYERS, HEADS = 4, 4
# Heads left per layer: 1, 0 (attention pruned whole), 3, 4 (unpruned).
PLAN = {0: [0, 2, 3], 1: [0, 1, 2, 3], 2: [1]}
KEPT = [1, 0, 3, 4]
FUSING = [arch for arch in ARCHS if arch_spec(arch).ort_fusion().fuses_attention]
CHECK = [tiny_batch(batch=4, seq=11, seed=s) for s in range(3)]


def saved(root: Path, arch: str) -> Path:
    """A tiny `arch` classifier pruned to `KEPT` heads per layer, saved with a tokenizer as the pipeline saves it."""
    from transformers import AutoTokenizer

    model = prune_heads(tiny_model(arch, layers=LAYERS, heads=HEADS), PLAN)
    assert [len(h) for h in present_heads(model)] == KEPT
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(root / "tok"))
    return save_pruned(model, root / "model", tokenizer)


def fused_attention(file: Path, op_type: str) -> list[tuple[int, list[int]]]:
    """(num_heads, packed Q/K/V weight shape) of each `op_type` node, in graph (= layer) order."""
    graph = onnx.load(str(file)).graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    found = []
    for node in graph.node:
        if node.op_type == op_type:
            heads = next(a.i for a in node.attribute if a.name == "num_heads")
            found.append((heads, shapes.get(node.input[1], [])))
    return found


@pytest.fixture(scope="module", params=FUSING)
def exported(request, tmp_path_factory):
    """(arch, model dir, out dir, result) of fp32 + optimized + int8 exports of the uneven, partly empty model."""
    root = tmp_path_factory.mktemp(f"fusion-{request.param}")
    model_dir = saved(root, request.param)
    result = ex.export_onnx(model_dir, root / "onnx", ["fp32", "optimized", "int8"], CHECK)
    return request.param, model_dir, root / "onnx", result


def test_one_fused_attention_per_layer_with_heads_and_its_own_head_count(exported):
    """The optimizer reads each layer's head count off the graph: 1, 3 and 4 heads in layer order, the packed Q/K/V
    weight 3 × heads × head_size wide; the layer without heads has no Attention node."""
    _, model_dir, out, result = exported
    model = load_pruned(model_dir)
    size, hidden = head_size(model), model.config.hidden_size
    nodes = fused_attention(out / "optimized" / "model.onnx", "Attention")
    assert nodes == [(h, [hidden, 3 * h * size]) for h in KEPT if h]
    opt = result["optimized"]
    assert opt["attention_fusion"] == "full" and opt["attention_layers"] == 3
    assert opt["attention_heads_per_node"] == [1, 3, 4]


def test_optimized_graph_matches_pytorch(exported):
    """Fused attention over uneven heads and an empty layer gives PyTorch's logits within the parity gate, at shapes
    unlike the export sample and the check batches (padding in the last row)."""
    _, model_dir, out, result = exported
    assert result["optimized"]["max_abs_diff"] <= 1e-4
    model = load_pruned(model_dir)
    for shape in [(1, 5), (6, 19)]:
        batch = tiny_batch(*shape, seed=7)
        got = ex.OnnxClassifier(out / "optimized", threads=1)(batch)
        assert np.abs(got - ex.torch_logits(model, batch)).max() <= 1e-4, shape


def test_fusions_are_recorded_in_the_manifest(exported):
    """export.json's optimized entry counts each fusion; the fused graph has far fewer nodes than fp32."""
    arch, _, out, result = exported
    manifest = json.loads((out / ex.MANIFEST).read_text())["optimized"]
    fused = manifest["fused_ops"]
    assert fused == result["optimized"]["fused_ops"]
    assert fused["Attention"] == 3
    assert fused["SkipLayerNormalization"] == 2 * LAYERS  # after attention (the empty layer's too) and after the FFN
    assert fused.get("BiasGelu", 0) + fused.get("Gelu", 0) >= LAYERS
    spec, config = arch_spec(arch), tiny_model(arch, layers=LAYERS, heads=HEADS).config
    if spec.takes_token_types(config) and not spec.reserved_positions(config):
        assert fused["EmbedLayerNormalization"] == 1  # RoBERTa's position ids (a cumsum of the mask) do not fuse
    assert manifest["graph_nodes"] < result["fp32"]["graph_nodes"] / 3


def test_int8_is_quantized_from_the_fused_graph(exported):
    """int8 turns each fused Attention into a QAttention with the same head count, and keeps the predictions. Its
    logits are compared by correlation and agreement only: int8 rounding differs between CPUs (VNNI or not)."""
    _, model_dir, out, result = exported
    int8 = result["int8"]
    assert int8["quantized_from"] == "optimized"
    assert [h for h, _ in fused_attention(out / "int8" / "model.onnx", "QAttention")] == [1, 3, 4]
    assert int8["graph_nodes"] < result["fp32"]["graph_nodes"] / 2
    model = load_pruned(model_dir)
    batches = [tiny_batch(batch=16, seq=13, seed=20 + s) for s in range(4)]
    got = np.concatenate([ex.OnnxClassifier(out / "int8", threads=1)(b) for b in batches])
    want = np.concatenate([ex.torch_logits(model, b) for b in batches])
    margin_got, margin_want = got[:, 1] - got[:, 0], want[:, 1] - want[:, 0]
    assert np.corrcoef(margin_got, margin_want)[0, 1] > 0.9
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.8


def test_without_pinned_head_counts_nothing_fuses(tmp_path, monkeypatch, caplog):
    """Negative control: with transformers' -1 left in TorchScript's attention reshapes, ORT cannot read a layer's
    head count and fuses no attention; the export says so (label and a warning) and the graph still matches PyTorch."""
    monkeypatch.setattr(exporters, "pin_head_counts", lambda *args: 0)
    model_dir = saved(tmp_path, "bert")
    with caplog.at_level(logging.WARNING, logger=ex.log.name):
        result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK[:1], exporter="torchscript")
    opt = result["optimized"]
    assert opt["attention_fusion"] == "none" and opt["fused_attention_nodes"] == 0
    assert "Attention" not in opt["fused_ops"] and opt["max_abs_diff"] <= 1e-4
    assert "fused attention in 0 of the 3 layers" in caplog.text
