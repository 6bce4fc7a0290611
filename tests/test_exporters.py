"""The exporters (`compressor.deploy.exporters`): which one "auto" and a named choice try, the fallback from
torch.export to TorchScript (an exporter error or a graph failing parity), what the manifest and the log say about
it, and the one-line errors for an unknown exporter. torch.export itself is exercised per architecture by
tests/test_export.py (every unit kind) and on the demo model below."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_tokenizer_dir
from typer.testing import CliRunner

from compressor.cli import app
from compressor.core.errors import UserError
from compressor.deploy import export as ex
from compressor.deploy import exporters
from compressor.deploy.inference import ExportParityError
from compressor.surgery.checkpoint import load_pruned, save_pruned
from compressor.surgery.slicing import prune_heads
from compressor.testing import tiny_batch, tiny_model

CHECK = [tiny_batch(batch=4, seq=11, seed=s) for s in range(2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny BERT with uneven heads (one layer without any), saved with a tokenizer."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("exporters")
    model = prune_heads(tiny_model("bert", layers=3, heads=4), {0: [1, 3], 1: [0, 1, 2, 3]})
    return save_pruned(model, root / "model", AutoTokenizer.from_pretrained(make_tokenizer_dir(root / "tok")))


def _failing(monkeypatch, error: Exception) -> None:
    def write(self, model, file, inputs, opset):
        raise error

    monkeypatch.setattr(exporters.TorchExport, "write", write)


@pytest.mark.parametrize(
    ("choice", "env", "expected"),
    [
        ("auto", "", ["torch.export", "torchscript"]),
        ("auto", "torch.export", ["torch.export", "torchscript"]),
        ("auto", "torchscript", ["torchscript", "torch.export"]),  # the env var reorders "auto", keeps the fallback
        ("torchscript", "torch.export", ["torchscript"]),  # a named exporter is that one only, whatever the env
        ("torch.export", "", ["torch.export"]),
    ],
)
def test_preference(monkeypatch, choice, env, expected):
    monkeypatch.setenv(exporters.EXPORTER_ENV, env)
    assert exporters.preference(choice) == expected


@pytest.mark.parametrize(("choice", "env", "field"), [("onnx", "", "export.exporter"), ("auto", "dynamo", "EXPORTER")])
def test_unknown_exporter_is_one_line_error_naming_the_field(monkeypatch, choice, env, field):
    monkeypatch.setenv(exporters.EXPORTER_ENV, env)
    with pytest.raises(UserError, match=f"{field}.*expected one of auto, torch.export, torchscript") as caught:
        exporters.preference(choice)
    assert "\n" not in str(caught.value)


def test_auto_falls_back_to_torchscript_and_says_why(monkeypatch, model_dir, tmp_path, caplog):
    """The default order: torch.export failing on a model, "auto" exports it through TorchScript, every variant passes
    parity, and the manifest and one warning name the exporter that failed and its error's first line."""
    monkeypatch.delenv(exporters.EXPORTER_ENV)
    _failing(monkeypatch, RuntimeError("Unsupported: data-dependent control flow\nlong traceback follows"))
    with caplog.at_level(logging.WARNING, logger=exporters.log.name):
        result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK)
    fp32 = result["fp32"]
    assert fp32["exporter"] == "torchscript"
    assert fp32["exporter_fallback"] == {"torch.export": "RuntimeError: Unsupported: data-dependent control flow"}
    assert json.loads((tmp_path / "onnx" / ex.MANIFEST).read_text())["fp32"]["exporter_fallback"]
    assert fp32["max_abs_diff"] <= 1e-4 and result["optimized"]["attention_fusion"] == "full"
    assert "torch.export could not export this model (RuntimeError: Unsupported" in caplog.text
    assert "falling back to torchscript" in caplog.text


def test_a_graph_failing_parity_counts_as_a_failed_exporter(monkeypatch, model_dir, tmp_path):
    """torch.export writing a wrong graph (here: another model's): the parity gate rejects it and "auto" falls back
    to TorchScript, whose graph passes; the reason names the parity failure."""
    monkeypatch.setenv(exporters.EXPORTER_ENV, "torch.export")
    other = tiny_model("bert", layers=3, heads=4, seed=5)
    real = exporters.TorchScript.write

    def wrong(self, model, file, inputs, opset):
        real(exporters.EXPORTERS["torchscript"], other, file, inputs, opset)

    monkeypatch.setattr(exporters.TorchExport, "write", wrong)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32"], CHECK)
    assert result["fp32"]["exporter"] == "torchscript" and result["fp32"]["max_abs_diff"] <= 1e-4
    assert result["fp32"]["exporter_fallback"]["torch.export"].startswith("ExportParityError")


def test_auto_falls_back_to_torch_export_where_torchscript_fails(monkeypatch, model_dir, tmp_path):
    """With "auto" started from TorchScript (`COMPRESSOR_EXPORTER`), TorchScript failing on a model (as it does inside
    transformers' mask code below 5.9, or once torch removes it): "auto" exports it through torch.export, with parity,
    and says why."""
    monkeypatch.setenv(exporters.EXPORTER_ENV, "torchscript")

    def write(self, model, file, inputs, opset):
        raise RuntimeError("IndexError inside sdpa_mask")

    monkeypatch.setattr(exporters.TorchScript, "write", write)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK)
    assert result["fp32"]["exporter"] == "torch.export" and result["fp32"]["max_abs_diff"] <= 1e-4
    assert result["fp32"]["exporter_fallback"] == {"torchscript": "RuntimeError: IndexError inside sdpa_mask"}
    assert result["optimized"]["attention_fusion"] == "full" and result["optimized"]["max_abs_diff"] <= 1e-4


def test_a_named_exporter_does_not_fall_back(monkeypatch, model_dir, tmp_path):
    """`exporter: torch.export` failing is the export's error, and nothing is written."""
    _failing(monkeypatch, RuntimeError("cannot export"))
    with pytest.raises(RuntimeError, match="cannot export"):
        ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32"], CHECK, exporter="torch.export")
    assert not (tmp_path / "onnx").exists()


def test_every_exporter_failing_raises_the_last_error(monkeypatch, model_dir, tmp_path):
    """Both exporters failing parity: the parity error is raised and nothing is written."""
    monkeypatch.setattr(ex, "check_parity", _always_fails)
    with pytest.raises(ExportParityError):
        ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32"], CHECK)
    assert not (tmp_path / "onnx").exists()


def _always_fails(name, stats, atol):
    raise ExportParityError(f"{name}: planted parity failure")


def test_cli_refuses_an_unknown_exporter(model_dir, tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["export", str(model_dir), str(tmp_path / "x"), "--exporter", "dynamo"])
    assert bad.exit_code == 2 and "--exporter: unknown exporter 'dynamo'" in bad.output
    assert not (tmp_path / "x").exists()


def test_recipe_refuses_an_unknown_exporter():
    from compressor.recipe import parse_recipe

    with pytest.raises(UserError, match="export.exporter"):
        parse_recipe({"name": "x", "export": {"exporter": "dynamo"}})


@pytest.mark.e2e
def test_torch_export_of_the_demo_model_with_uneven_heads(tmp_path):
    """The demo's model (MiniLM-L6, the built-in default) with uneven heads per layer and one layer without any,
    through torch.export: fp32 and the fused graph match PyTorch on real-length (padded) batches, one fused Attention
    per layer that kept heads, each with that layer's head count, its Q/K/V weight one initializer and its padding
    mask a mask index; so int8 quantizes every one of them into a `QAttention`."""
    from compressor.recipe.schema import ModelSpec
    from compressor.sources.models import load_model, load_tokenizer

    spec = ModelSpec()  # the built-in default, MiniLM-L6
    model, tokenizer = load_model(spec, ["neg", "pos"]), load_tokenizer(spec)
    plan = {0: list(range(6)), 1: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 3: [1, 4, 7]}
    model = prune_heads(model, plan)
    model_dir = save_pruned(model, tmp_path / "model", tokenizer)
    texts = ["a gorgeous, witty film", "tedious and overlong, with a plot that goes nowhere at all", "fine"]
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    variants = ["fp32", "optimized", "int8"]
    result = ex.export_onnx(model_dir, tmp_path / "onnx", variants, [batch], exporter="torch.export")
    assert result["fp32"]["exporter"] == "torch.export" and result["fp32"]["max_abs_diff"] <= 1e-4
    opt = result["optimized"]
    assert opt["max_abs_diff"] <= 1e-4 and opt["attention_fusion"] == "full"
    assert opt["attention_heads_per_node"] == [6, 12, 9, 12, 12]
    graph = onnx.load(opt["file"], load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    inputs = [list(n.input) + [""] * 6 for n in graph.node if n.op_type == "Attention"]
    assert len(inputs) == 5 and all(i[1] in weights and i[3] and not i[5] for i in inputs)  # weight folded, mask index
    assert exporters.fused_ops(Path(result["int8"]["file"])).get("QAttention") == 5
    assert opt["fused_ops"].get("EmbedLayerNormalization") == 1  # as ONNX Runtime's optimizer fuses TorchScript's
    got = ex.OnnxClassifier(tmp_path / "onnx" / "optimized")(batch)
    assert np.abs(got - ex.torch_logits(load_pruned(model_dir), batch)).max() <= 1e-4


@pytest.mark.parametrize(("arch", "fused"), [("bert", True), ("distilbert", True), ("roberta", False)])
def test_torch_export_fuses_absolute_position_embeddings_so_int8_reads_one_op(tmp_path, arch, fused):
    """Embeddings that sum word, token-type and absolute-position lookups before a LayerNorm (BERT; DistilBERT has
    no token types) become one `EmbedLayerNormalization` in torch.export's fused graph, as ONNX Runtime's optimizer
    makes of the TorchScript graph, so int8 reads them in one `QEmbedLayerNormalization`; RoBERTa's positions, offset
    from the padding, are not that pattern and keep their lookups. Either way the fused graph matches PyTorch."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    model_dir = save_pruned(tiny_model(arch, layers=2, heads=4), tmp_path / "model", tokenizer)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized", "int8"], CHECK, exporter="torch.export")
    optimized = result["optimized"]
    assert optimized["max_abs_diff"] <= 1e-4
    assert ("EmbedLayerNormalization" in optimized["fused_ops"]) == fused
    assert ("QEmbedLayerNormalization" in exporters.fused_ops(Path(result["int8"]["file"]))) == fused
    batch = tiny_batch(batch=5, seq=13, seed=3)
    got = ex.OnnxClassifier(tmp_path / "onnx" / "optimized")(batch)
    assert np.abs(got - ex.torch_logits(load_pruned(model_dir), batch)).max() <= 1e-4


def _rotary_graph():
    """A graph of one ONNX Runtime `RotaryEmbedding` on x (batch, heads, seq, 4), its position ids a (1, seq) row
    (graph input "row") as onnxscript's fusion passes transformers' broadcast row on."""
    from onnxscript import ir

    seq = ir.SymbolicDim("seq")
    x = ir.Value(name="x", shape=ir.Shape(["batch", 2, seq, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    row = ir.Value(name="row", shape=ir.Shape([1, seq]), type=ir.TensorType(ir.DataType.INT64))
    angles = np.arange(16, dtype=np.float32)[:, None] * np.array([[0.5, 0.25]], dtype=np.float32)
    cos = ir.node("Constant", [], {"value": ir.tensor(np.cos(angles))})
    sin = ir.node("Constant", [], {"value": ir.tensor(np.sin(angles))})
    rotary = ir.node("RotaryEmbedding", [x, row, cos.outputs[0], sin.outputs[0]], domain=exporters.CONTRIB_DOMAIN)
    rotary.outputs[0].name = "y"
    graph = ir.Graph([x, row], rotary.outputs, nodes=[cos, sin, rotary], opset_imports={"": 18, "com.microsoft": 1})
    return ir.Model(graph, ir_version=9)


def _run(model, feeds: dict) -> np.ndarray:
    import onnxruntime as ort
    from onnxscript import ir

    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_rotary_positions_of_one_row_are_expanded_to_the_batch():
    """ONNX Runtime's RotaryEmbedding refuses a (1, seq) position row for a batch of 3; after the rewrite the batch
    runs, and each sequence is rotated as it is alone (batch 1, where the row is accepted as is)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 5, 4)).astype(np.float32)
    row = np.arange(5, dtype=np.int64)[None]
    model = _rotary_graph()
    with pytest.raises(Exception, match="position_ids"):
        _run(model, {"x": x, "row": row})
    alone = np.concatenate([_run(model, {"x": x[i : i + 1], "row": row}) for i in range(3)])
    assert exporters.rotary_positions_per_row(model) == 1
    np.testing.assert_allclose(_run(model, {"x": x, "row": row}), alone, atol=1e-6)
    assert exporters.rotary_positions_per_row(model) == 0  # already one row per sequence: left as it is
