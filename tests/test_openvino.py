"""OpenVINO variants: fp32 IR parity with PyTorch for every architecture, the NNCF int8 gate and its fp32 fallback, the
layout optimum-intel reads, and the one-line skip when openvino is not installed."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import every_arch
from test_export import CHECK, UNEVEN_EMPTY, int8_tol, labelled_by, saved_model

from compressor.deploy import export as ex
from compressor.deploy import openvino as ovd
from compressor.surgery.checkpoint import load_pruned
from compressor.testing import ARCHS, tiny_batch, tiny_model

pytest.importorskip("openvino")
pytest.importorskip("nncf")

CALIBRATION = [tiny_batch(batch=16, seq=11, seed=s) for s in range(40, 44)]
VALIDATION = [tiny_batch(batch=16, seq=11, seed=s) for s in range(20, 24)]


def ir_ops(file: Path) -> dict[str, str]:
    """{friendly name: op type} of an IR on disk."""
    import openvino as ov

    return {op.get_friendly_name(): op.get_type_name() for op in ov.Core().read_model(str(file)).get_ops()}


def int8_weights(file: Path) -> int:
    """How many int8 constants (quantised weights) an IR holds."""
    import openvino as ov

    model = ov.Core().read_model(str(file))
    return sum(
        op.get_type_name() == "Constant" and op.get_element_type().get_type_name() == "i8" for op in model.get_ops()
    )


def assert_matches_pytorch(model_dir: Path, variant: Path, int8: bool = False) -> None:
    """The variant reloaded alone reproduces PyTorch at shapes other than the export's (dynamic axes): within 1e-4,
    or for int8 within the tolerance its calibration implies (`int8_tol`)."""
    model, classifier = load_pruned(model_dir), ovd.OpenVinoClassifier(variant, threads=1)
    for batch in (tiny_batch(batch=1, seq=5, seed=7), tiny_batch(batch=6, seq=23, seed=8)):
        tol = int8_tol(model, [batch], CALIBRATION) if int8 else 1e-4
        assert np.abs(classifier(batch) - ex.torch_logits(model, batch)).max() <= tol


@pytest.mark.parametrize("arch", every_arch())
def test_openvino_fp32_matches_pytorch_in_the_optimum_intel_layout(tmp_path, arch):
    """Every architecture, pruned unevenly with an empty layer, converts through our ONNX graph and keeps PyTorch's
    logits."""
    model_dir = saved_model(tmp_path, arch, UNEVEN_EMPTY)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["openvino-fp32"], CHECK)
    entry = result["openvino-fp32"]
    assert entry["max_abs_diff"] <= 1e-4 and entry["agreement"] == 1.0 and entry["check_examples"] == 12
    variant = tmp_path / "onnx" / "openvino-fp32"
    names = {p.name for p in variant.iterdir()}
    assert {"openvino_model.xml", "openvino_model.bin", "config.json", "tokenizer.json"} <= names
    assert not [n for n in names if n.endswith(".onnx")], "the IR directory holds no ONNX graph"
    assert entry["file"] == str(variant / "openvino_model.xml") and entry["size_bytes"] > 0
    assert_matches_pytorch(model_dir, variant)
    assert "fp32" in result, "the fp32 ONNX graph the IR was converted from is always exported"


@pytest.mark.parametrize("arch", every_arch())
def test_a_layer_without_ffn_neurons_converts_to_openvino(tmp_path, arch):
    """A layer whose FFN lost every neuron (the upper layers of a deep member) leaves no zero-sized weight in the
    graph, which OpenVINO's ONNX reader would refuse: it is traced with one zero-weight neuron, same logits; the
    saved model keeps none."""
    import onnx
    from conftest import make_tokenizer_dir
    from transformers import AutoTokenizer

    from compressor.surgery.arch import present_neurons
    from compressor.surgery.checkpoint import save_pruned
    from compressor.surgery.slicing import padded_empty_ffns, prune_heads, prune_neurons

    model = prune_heads(tiny_model(arch, layers=3, heads=4), {0: [1, 3]})
    width = len(present_neurons(model)[1])
    model = prune_neurons(model, {1: list(range(width)), 2: [0, 5]})
    assert present_neurons(model)[1] == [] and padded_empty_ffns(model) is not model
    whole = tiny_model(arch, layers=3, heads=4)
    assert padded_empty_ffns(whole) is whole  # nothing to pad: the model itself
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    model_dir = save_pruned(model, tmp_path / "model", tokenizer)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["openvino-fp32"], CHECK)
    assert result["fp32"]["max_abs_diff"] <= 1e-4 and result["openvino-fp32"]["max_abs_diff"] <= 1e-4
    graph = onnx.load(str(tmp_path / "onnx" / "fp32" / "model.onnx")).graph
    assert all(0 not in init.dims for init in graph.initializer)
    assert_matches_pytorch(model_dir, tmp_path / "onnx" / "openvino-fp32")
    assert present_neurons(load_pruned(model_dir))[1] == []


def test_openvino_fp32_parity_failure_writes_nothing(tmp_path, monkeypatch):
    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    real = ovd.OpenVinoClassifier.__call__
    monkeypatch.setattr(ovd.OpenVinoClassifier, "__call__", lambda self, batch: real(self, batch) + 1e-3)
    with pytest.raises(ex.ExportParityError, match=r"openvino-fp32 OpenVINO logits differ from PyTorch by 0.001"):
        ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "openvino-fp32"], CHECK)
    assert not (tmp_path / "onnx").exists()


def int8_export(tmp_path: Path, arch: str, **options) -> tuple[Path, dict]:
    model_dir = saved_model(tmp_path, arch, UNEVEN_EMPTY)
    int8 = ex.Int8Options(calibration=CALIBRATION, validation=labelled_by(model_dir, VALIDATION), **options)
    variants = ["openvino-fp32", "openvino-int8"]
    return model_dir, ex.export_onnx(model_dir, tmp_path / "onnx", variants, CHECK, int8=int8)


def check_int8(model_dir: Path, result: dict, arch: str) -> None:
    """NNCF quantised the IR, its logits stay near PyTorch's, and its gate compares it with the fp32 IR."""
    int8, variant = result["openvino-int8"], Path(result["openvino-int8"]["dir"])
    assert int8_weights(variant / "openvino_model.xml") > 0 and int8_weights(Path(result["openvino-fp32"]["file"])) == 0
    assert "FakeQuantize" in ir_ops(variant / "openvino_model.xml").values(), "activations are quantised too"
    assert 0 < int8["max_abs_diff"] <= int8_tol(model_dir, CHECK, CALIBRATION)
    assert "NNCF" in int8["weights"] and "calibrated on 64 training examples" in int8["weights"]
    gate = int8["gate"]
    fp32_val = ex.evaluate_variant(
        ovd.OpenVinoClassifier(result["openvino-fp32"]["dir"]), labelled_by(model_dir, VALIDATION)
    )
    assert gate["fp32_accuracy"] == fp32_val["accuracy"] == 1.0, "gated against the fp32 IR (labels are its own)"
    assert gate["examples"] == 64 and gate["max_drop"] == 0.5 and gate["passed"] == (gate["drop"] <= 0.5)
    assert int8["status"] == ("accepted" if gate["passed"] else "rejected")
    assert {"openvino_model.xml", "openvino_model.bin", "config.json", "tokenizer.json"} <= {
        p.name for p in variant.iterdir()
    }
    assert_matches_pytorch(model_dir, variant, int8=True)


def test_openvino_int8_is_nncf_quantised_and_gated_like_ort_int8(tmp_path):
    import openvino as ov

    model_dir, result = int8_export(tmp_path, "bert", max_drop=0.5)
    check_int8(model_dir, result, "bert")
    # The fallback's scan: one MatMul's activation quantiser bypassed in a copy, the rest left quantised.
    quantized = ov.Core().read_model(result["openvino-int8"]["file"])
    nodes = ovd.quantized_matmuls(quantized)
    assert len(nodes) >= 10 and set(nodes) <= {n for n, op in ir_ops(Path(result["openvino-int8"]["file"])).items()}
    assert ovd.quantized_matmuls(ovd.activation_fp32(quantized, nodes[0])) == nodes[1:]
    assert ovd.quantized_matmuls(quantized) == nodes, "the quantised model itself is left as it was"


@pytest.mark.e2e
@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_openvino_from_a_torch_export_graph(tmp_path, arch):
    """The IRs converted from torch.export's graph (the default exporter; the rest of this file runs TorchScript's,
    as the fast suite does): fp32 within 1e-4 of PyTorch at new shapes, int8 NNCF-quantised and gated."""
    model_dir = saved_model(tmp_path, arch, UNEVEN_EMPTY)
    int8 = ex.Int8Options(calibration=CALIBRATION, validation=labelled_by(model_dir, VALIDATION), max_drop=0.5)
    variants = ["openvino-fp32", "openvino-int8"]
    result = ex.export_onnx(model_dir, tmp_path / "onnx", variants, CHECK, int8=int8, exporter="torch.export")
    assert result["fp32"]["exporter"] == "torch.export"
    assert_matches_pytorch(model_dir, tmp_path / "onnx" / "openvino-fp32")
    check_int8(model_dir, result, arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "bert"])
def test_openvino_int8_every_architecture(tmp_path, arch):
    model_dir, result = int8_export(tmp_path, arch, max_drop=0.5)
    check_int8(model_dir, result, arch)


@pytest.mark.slow
def test_openvino_int8_failing_its_gate_keeps_nodes_in_fp32_through_the_ignored_scope(tmp_path, monkeypatch):
    """A gate that only an int8 IR agreeing with fp32 everywhere passes: the fallback scans every quantised MatMul
    and re-quantises with the worst in NNCF's ignored scope; a passing try replaces the IR, else it stays as built."""
    model_dir, first = int8_export(tmp_path / "first", "bert", max_drop=0.0, min_agreement=1.0)
    model_dir, result = int8_export(tmp_path / "rescued", "bert", max_drop=0.0, min_agreement=1.0, fallback_nodes=2)
    int8 = result["openvino-int8"]
    if first["openvino-int8"]["gate"]["passed"]:
        assert "fp32_fallback" not in int8, "no fallback for a variant that passes"
        return
    fallback = int8["fp32_fallback"]
    assert fallback["first_gate"] == first["openvino-int8"]["gate"]
    quantized = [n for n, op in ir_ops(Path(first["openvino-int8"]["file"])).items() if op == "MatMul"]
    assert {r["node"] for r in fallback["scan"]} <= set(quantized) and len(fallback["scan"]) >= 10
    errors = [r["mean_abs_logit_diff"] for r in fallback["scan"]]
    assert errors == sorted(errors), "the scan ranks the nodes, least error first"
    assert 1 <= len(fallback["tries"]) <= 2
    if fallback["passed"]:
        assert int8["status"] == "accepted" and int8["excluded_nodes"] == fallback["kept_fp32"]
        assert int8["gate"] == fallback["tries"][-1]["gate"]
    else:
        assert int8["status"] == "rejected" and int8["gate"] == fallback["first_gate"]
    assert not [p for p in (tmp_path / "rescued" / "onnx").rglob("try*")], "trial IRs cleaned up"


def test_missing_openvino_skips_its_variants_with_one_log_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    with caplog.at_level(logging.WARNING):
        result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "openvino-fp32", "openvino-int8"], CHECK)
    assert sorted(result) == ["fp32"] and not (tmp_path / "onnx" / "openvino-fp32").exists()
    lines = [r.getMessage() for r in caplog.records if "openvino" in r.getMessage()]
    assert len(lines) == 1 and "openvino-fp32, openvino-int8 skipped: openvino is not installed" in lines[0]
    assert "pip install 'compressor[openvino]'" in lines[0]
    assert ovd.missing() is not None and ovd.skip("bench", ["onnx-int8"]) is False, "nothing of OpenVINO asked"
