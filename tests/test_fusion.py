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
from compressor.deploy.graph import unfuse_skip_norms
from compressor.deploy.inference import cpu_session
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
    """export.json's optimized entry counts each fusion and the one undone for CPUs; the fused graph has far fewer
    nodes than fp32, and neither it nor int8 holds a `SkipLayerNormalization`."""
    arch, _, out, result = exported
    manifest = json.loads((out / ex.MANIFEST).read_text())["optimized"]
    fused = manifest["fused_ops"]
    assert fused == result["optimized"]["fused_ops"]
    assert fused["Attention"] == 3
    # the optimizer fused one after attention (the empty layer's too) and one after the FFN; all were undone
    assert manifest["unfused_ops"] == {"SkipLayerNormalization": 2 * LAYERS} and "SkipLayerNormalization" not in fused
    assert "SkipLayerNormalization" not in exporters.fused_ops(out / "int8" / "model.onnx")
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


def skip_norm_graph(read_sum: bool, read_mean: bool) -> onnx.ModelProto:
    """Two `SkipLayerNormalization`s over (batch, seq, 8) inputs: one with bias whose input+skip+bias sum is a graph
    output when `read_sum`, one without bias or beta whose mean output is a graph output when `read_mean`."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=8).astype(np.float32), n) for n in ("gamma", "beta", "bias")]
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["b", "s", 8])  # noqa: E731
    nodes = [
        helper.make_node("SkipLayerNormalization", ["x", "r", "gamma", "beta", "bias"], ["y", "", "", "sum"],
                         domain=exporters.CONTRIB_DOMAIN, epsilon=1e-5, name="sln0"),
        helper.make_node("SkipLayerNormalization", ["y", "x", "gamma"], ["z", "mean"],
                         domain=exporters.CONTRIB_DOMAIN, epsilon=1e-3, name="sln1"),
    ]  # fmt: skip
    outputs = [value("z"), *([value("sum")] if read_sum else [])]
    if read_mean:
        outputs.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "skip-norms", [value("x"), value("r")], outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(exporters.CONTRIB_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("read_sum,read_mean", [(False, False), (True, False), (True, True)])
def test_unfused_skip_norms_give_the_fused_ops_outputs(tmp_path, read_sum, read_mean):
    """`unfuse_skip_norms` replaces each `SkipLayerNormalization` by Adds and a `LayerNormalization` with the same
    outputs (its summed output too), and leaves a node whose mean is read as it is."""
    import onnxruntime as ort

    file = tmp_path / "model.onnx"
    onnx.save(skip_norm_graph(read_sum, read_mean), str(file))
    rng = np.random.default_rng(1)
    feed = {n: rng.normal(size=(3, 5, 8)).astype(np.float32) for n in ("x", "r")}
    want = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"]).run(None, feed)
    assert unfuse_skip_norms(file) == (1 if read_mean else 2)
    ops = [n.op_type for n in onnx.load(str(file)).graph.node]
    assert ops.count("SkipLayerNormalization") == (1 if read_mean else 0)
    got = cpu_session(file).run(None, feed)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_cpu_sessions_leave_add_and_layer_norm_unfused(tmp_path):
    """The sessions we create keep ONNX Runtime from fusing Add + Add + LayerNormalization into its slower
    `SkipLayerNormalization` (a session with its default options does fuse them: the control)."""
    import onnxruntime as ort

    unfused = tmp_path / "unfused.onnx"
    onnx.save(skip_norm_graph(read_sum=False, read_mean=False), str(unfused))
    unfuse_skip_norms(unfused)
    written = {}
    for name, make in (("default", lambda f, o: ort.InferenceSession(str(f), o)), ("ours", cpu_session)):
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
        make(unfused, options)
        written[name] = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    assert "SkipLayerNormalization" in written["default"]
    assert "SkipLayerNormalization" not in written["ours"] and "LayerNormalization" in written["ours"]
