"""ONNX export: parity gate, dynamic axes, loaders, optimised/int8 variants, failure paths and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml
from conftest import every_arch, make_tokenizer_dir, tiny_recipe
from typer.testing import CliRunner

from compressor.cli import app
from compressor.core.errors import UserError
from compressor.deploy import export as ex
from compressor.deploy.quantize import quantized_nodes, resolve_reduce_range
from compressor.surgery.arch import arch_spec, present_heads, present_neurons, removed_layers
from compressor.surgery.checkpoint import load_pruned, save_pruned
from compressor.surgery.slicing import prune_heads
from compressor.testing import ARCHS, int8_tolerance, logits_of, tiny_batch, tiny_model

LAYERS, HEADS = 3, 4


def int8_tol(model: Path | torch.nn.Module, batches: list[dict], calibration: list[dict] | None = None) -> float:
    """The |Δlogit| an int8 graph of `model` (a saved model's directory, or the model) may show on `batches`: a
    multiple of the int8 deviation simulated in fp32 (`compressor.testing.int8_tolerance`), the same on every CPU.
    `calibration`: the batches a static int8 (OpenVINO's, int8_static) took its activation ranges from. The check
    batches always join `batches`: a maximum over one or two examples is too noisy a scale on its own."""
    model = load_pruned(model) if isinstance(model, Path) else model
    calibrate = None if calibration is None else (lambda: [logits_of(model, b)() for b in calibration])
    return max(int8_tolerance(model, logits_of(model, b), calibrate) for b in [*batches, *CHECK])


# Uneven heads per layer and layer 1 with no heads left.
UNEVEN_EMPTY = {0: [1, 3], 1: [0, 1, 2, 3], 2: [0]}
CHECK = [tiny_batch(batch=4, seq=11, seed=s) for s in range(3)]


def saved_model(root: Path, arch: str, plan: dict) -> Path:
    """A tiny pruned classifier saved with a tokenizer, as the pipeline writes it."""
    from transformers import AutoTokenizer

    model = prune_heads(tiny_model(arch, layers=LAYERS, heads=HEADS), plan)
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(root / "tok"))
    return save_pruned(model, root / f"{arch}-model", tokenizer)


@pytest.fixture(scope="module", params=list(ARCHS))
def exported(request, tmp_path_factory):
    """(model dir, out dir, result) of a full export of a tiny model with uneven heads and an empty layer."""
    root = tmp_path_factory.mktemp(f"export-{request.param}")
    model_dir = saved_model(root, request.param, UNEVEN_EMPTY)
    result = ex.export_onnx(model_dir, root / "onnx", ["int8", "fp32", "optimized"], CHECK)
    return model_dir, root / "onnx", result


# Attention with a relative-position bias added to its scores: neither ORT's optimizer nor onnxscript's fusions
# fuse it, so their optimised graphs fuse LayerNorm and GELU only.
BIASED_ATTENTION = ("deberta-v2", "mpnet")


def fuses(arch: str) -> bool:
    """Whether ORT fuses `arch`'s attention (none for DeBERTa's disentangled attention, MPNet's position bias or
    ModernBERT's rotary attention)."""
    return arch_spec(arch).ort_fusion().fuses_attention


def weight_bytes(variant_dir: Path) -> int:
    """Bytes of a graph's initializers (its weights)."""
    import onnx
    from onnx import numpy_helper

    return sum(numpy_helper.to_array(i).nbytes for i in onnx.load(str(variant_dir / "model.onnx")).graph.initializer)


def reference_logits(model_dir: Path, batch: dict) -> np.ndarray:
    return ex.torch_logits(load_pruned(model_dir), batch)


def test_export_reflects_the_pruning(exported):
    """Negative control: the exported graph is the pruned model, visibly different from the unpruned one."""
    model_dir, out, _ = exported
    unpruned = tiny_model(model_dir.name.removesuffix("-model"), layers=LAYERS, heads=HEADS)
    batch = CHECK[0]
    onnx_logits = ex.OnnxClassifier(out / "fp32")(batch)
    assert np.abs(onnx_logits - reference_logits(model_dir, batch)).max() <= 1e-4
    assert np.abs(onnx_logits - ex.torch_logits(unpruned, batch)).max() > 1e-2


def test_fp32_passes_gate_and_layout(exported):
    model_dir, out, result = exported
    assert list(result) == ["fp32", "optimized", "int8"]
    fp32 = result["fp32"]
    assert fp32["max_abs_diff"] <= 1e-4 and fp32["agreement"] == 1.0
    assert fp32["check_examples"] == sum(len(b["input_ids"]) for b in CHECK)
    for name in result:
        files = {p.name for p in (out / name).iterdir()}
        assert {"model.onnx", "config.json", "tokenizer.json", "compressor_plan.json"} <= files
        assert result[name]["size_bytes"] == (out / name / "model.onnx").stat().st_size
    assert json.loads((out / ex.MANIFEST).read_text()) == json.loads(json.dumps(result))
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".onnx.")], "temp dir left behind"


@pytest.mark.parametrize("shape", [(1, 5), (7, 23)])
def test_dynamic_axes_every_variant(exported, shape):
    """Batch and sequence sizes unlike both the export sample and the check batches."""
    model_dir, out, _ = exported
    batch = tiny_batch(*shape, seed=9)
    expected = reference_logits(model_dir, batch)
    for name, tol in (("fp32", 1e-4), ("optimized", 1e-4), ("int8", int8_tol(model_dir, [batch]))):
        got = ex.OnnxClassifier(out / name, threads=1)(batch)
        assert got.shape == expected.shape == (shape[0], 2)
        assert np.abs(got - expected).max() <= tol, name


def test_optimized_fuses_attention_with_per_layer_heads(exported):
    model_dir, _, result = exported
    opt = result["optimized"]
    model = load_pruned(model_dir)
    heads_left = [len(h) for h in present_heads(model) if h]
    assert opt["max_abs_diff"] <= 1e-4 and opt["agreement"] == 1.0
    assert opt["attention_layers"] == len(heads_left) == 2
    assert result["fp32"]["fused_attention_nodes"] == 0
    if not fuses(model_dir.name.removesuffix("-model")):
        assert opt["attention_fusion"].startswith("n/a") and opt["fused_attention_nodes"] == 0
        return
    assert opt["attention_fusion"] == "full" and opt["fused_attention_nodes"] == 2
    assert sorted(opt["attention_heads_per_node"]) == sorted(heads_left)


def test_int8_quantizes_optimized_graph_and_agrees(exported):
    model_dir, out, result = exported
    int8 = result["int8"]
    assert int8["quantized_from"] == "optimized"
    assert int8["size_bytes"] < result["fp32"]["size_bytes"]
    # The weights shrink ~4×; the file less where a tiny graph's nodes outweigh its weights (DeBERTa: 800 nodes; MPNet).
    assert weight_bytes(out / "int8") < 0.6 * weight_bytes(out / "fp32")
    # Within 0.1 on CPUs without VNNI too: "auto" picks 7-bit weights there (full-range u8s8 GEMMs saturate: 0.36).
    assert int8["agreement"] >= 0.75 and 0 < int8["max_abs_diff"] < int8_tol(model_dir, CHECK)
    assert (int8["reduce_range"], int8["reduce_range_reason"]) == resolve_reduce_range("auto")
    assert ("7-bit range" in int8["weights"]) is int8["reduce_range"]
    ops = {node.op_type for node in __import__("onnx").load(str(out / "int8" / "model.onnx")).graph.node}
    assert {"MatMulInteger"} <= ops
    assert ("QAttention" in ops) is fuses(model_dir.name.removesuffix("-model"))


def test_int8_keeps_excluded_nodes_in_fp32(exported, tmp_path):
    import onnx

    _, out, _ = exported
    source = out / "optimized" / "model.onnx"
    graph = onnx.load(str(source)).graph
    weights = {init.name for init in graph.initializer}  # a weight MatMul (an activation x activation one, e.g.
    matmuls = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]  # QK^T, stays fp32)
    keep = matmuls[:1]
    ex.quantize_graph(source, tmp_path / "all.onnx")
    ex.quantize_graph(source, tmp_path / "kept.onnx", nodes_to_exclude=keep)
    integer = {
        name: sum(n.op_type == "MatMulInteger" for n in onnx.load(str(tmp_path / name)).graph.node)
        for name in ("all.onnx", "kept.onnx")
    }
    kept_nodes = {n.name: n.op_type for n in onnx.load(str(tmp_path / "kept.onnx")).graph.node}
    assert kept_nodes[keep[0]] == "MatMul"
    assert integer["kept.onnx"] == integer["all.onnx"] - 1


def test_bare_inference_session_loads_each_variant(exported):
    _, out, result = exported
    batch = {k: v.numpy() for k, v in CHECK[0].items() if k != "labels"}
    for name in result:
        session = ort.InferenceSession(result[name]["file"], providers=["CPUExecutionProvider"])
        feed = {i.name: batch.get(i.name, np.zeros_like(batch["input_ids"])) for i in session.get_inputs()}
        assert session.run(None, feed)[0].shape == (4, 2)


@pytest.mark.parametrize("arch", every_arch())
def test_every_unit_kind_exports_and_runs_in_a_bare_session(tmp_path, arch):
    """Uneven heads, uneven FFN widths, a layer without heads and a layer removed whole, in one model of each
    architecture, exported by torch.export (no fallback): every variant, opened in a bare InferenceSession by its file
    alone, gives the in-memory pruned model's logits (int8 within its quantisation error), and onnxscript's fusions
    fuse attention in every layer that kept heads, rotary attention included, where no position bias enters it."""
    from transformers import AutoTokenizer

    from compressor.surgery.slicing import pruned_copy

    heads = {0: [1, 3], 1: [0, 1, 2, 3], 2: [0], 3: [0, 1, 2, 3]}
    neurons = {0: list(range(0, 67, 3)), 2: list(range(20)), 3: list(range(67))}  # FFN width 67; layer 3: none
    model = pruned_copy(tiny_model(arch, layers=4, heads=HEADS), heads, neurons).eval()
    assert removed_layers(model) == [3] and [len(h) for h in present_heads(model)] == [2, 0, 3, 0]
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    model_dir = save_pruned(model, tmp_path / "model", tokenizer)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized", "int8"], CHECK, exporter="torch.export")
    assert result["fp32"]["exporter"] == "torch.export" and "exporter_fallback" not in result["fp32"]
    fused = arch not in BIASED_ATTENTION
    assert result["optimized"]["fused_attention_nodes"] == (2 if fused else 0)
    fusion = result["optimized"]["attention_fusion"]
    assert (fusion == "full") if fused else fusion.startswith("n/a")
    batch = tiny_batch(batch=5, seq=13, seed=11)
    expected = ex.torch_logits(model, batch)
    for name, tol in (("fp32", 1e-4), ("optimized", 1e-4), ("int8", int8_tol(model, [batch]))):
        session = ort.InferenceSession(result[name]["file"], providers=["CPUExecutionProvider"])
        feed = {i.name: batch.get(i.name, torch.zeros_like(batch["input_ids"])).numpy() for i in session.get_inputs()}
        assert np.abs(session.run(["logits"], feed)[0] - expected).max() <= tol, name


def test_every_variant_dir_is_self_contained(exported):
    """Each variant directory carries its tokenizer and config; its graph alone reproduces the saved model."""
    from transformers import AutoConfig, AutoTokenizer

    model_dir, out, _ = exported
    batch = {k: v for k, v in CHECK[1].items() if k != "labels"}
    expected = reference_logits(model_dir, batch)
    for name, tol in (("fp32", 1e-4), ("optimized", 1e-4), ("int8", int8_tol(model_dir, [batch]))):
        AutoTokenizer.from_pretrained(out / name)
        assert AutoConfig.from_pretrained(out / name).num_labels == expected.shape[1]
        session = ort.InferenceSession(str(out / name / "model.onnx"), providers=["CPUExecutionProvider"])
        feed = {i.name: batch.get(i.name, torch.zeros_like(batch["input_ids"])).numpy() for i in session.get_inputs()}
        assert np.abs(session.run(["logits"], feed)[0] - expected).max() <= tol, name


@pytest.mark.parametrize("arch", ARCHS)
def test_every_layer_pruned_exports(tmp_path, arch):
    model_dir = saved_model(tmp_path, arch, {layer: list(range(HEADS)) for layer in range(LAYERS)})
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK[:1])
    assert result["fp32"]["max_abs_diff"] <= 1e-4 and result["optimized"]["max_abs_diff"] <= 1e-4
    assert result["optimized"]["fused_attention_nodes"] == 0


def test_fp32_only(tmp_path):
    model_dir = saved_model(tmp_path, "bert", {0: [2]})
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32"], CHECK[:1])
    assert list(result) == ["fp32"]
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == ["export.json", "fp32"]


def test_int8_without_optimized_quantizes_fp32(tmp_path):
    model_dir = saved_model(tmp_path, "bert", {0: [2]})
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["int8"], CHECK[:1])
    assert list(result) == ["fp32", "int8"] and result["int8"]["quantized_from"] == "fp32"


def test_parity_failure_raises_and_writes_nothing(tmp_path, monkeypatch):
    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    real = ex.torch_logits
    monkeypatch.setattr(ex, "torch_logits", lambda model, batch: real(model, batch) + 1e-3)
    with pytest.raises(ex.ExportParityError, match=r"fp32 ONNX logits differ from PyTorch by 0.001 > atol 0.0001"):
        ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized", "int8"], CHECK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert-model", "tok"]
    assert isinstance(ex.ExportParityError("x"), RuntimeError)


def test_parity_failure_keeps_previous_export(tmp_path, monkeypatch):
    model_dir = saved_model(tmp_path, "bert", {0: [1]})
    ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32"], CHECK[:1])
    before = (tmp_path / "onnx" / "fp32" / "model.onnx").read_bytes()
    monkeypatch.setattr(ex, "torch_logits", lambda model, batch: np.full((len(batch["input_ids"]), 2), np.nan))
    with pytest.raises(ex.ExportParityError, match="differ from PyTorch by nan"):
        ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "int8"], CHECK[:1])
    assert (tmp_path / "onnx" / "fp32" / "model.onnx").read_bytes() == before
    assert not (tmp_path / "onnx" / "int8").exists()


def test_fused_attention_mismatch_falls_back_to_unfused(tmp_path, monkeypatch):
    """If fusion broke parity, the optimised variant is still built, without attention fusion, and says so."""
    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    real_check = ex._check

    def check(file, batches, reference):
        stats = real_check(file, batches, reference)
        if ex.attention_nodes(file).get("Attention"):
            stats["max_abs_diff"] = 1.0  # pretend the fused graph is wrong
        return stats

    monkeypatch.setattr(ex, "_check", check)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK[:1])
    opt = result["optimized"]
    assert opt["attention_fusion"].startswith("unfused") and opt["fused_attention_nodes"] == 0
    assert opt["max_abs_diff"] <= 1e-4
    assert ex.attention_nodes(Path(opt["file"])) == {}


def test_fused_graph_that_fails_to_run_falls_back_to_unfused(tmp_path, monkeypatch):
    """A fused op ONNX Runtime refuses at run time (as onnxscript's RotaryEmbedding fusion of ModernBERT under
    transformers 5.5, whose position ids have batch size 1): the optimised variant is built without attention fusion
    and says why, instead of failing the export."""
    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    real_check = ex._check

    def check(file, batches, reference):
        if ex.attention_nodes(file).get("Attention"):
            raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code in Attention")
        return real_check(file, batches, reference)

    monkeypatch.setattr(ex, "_check", check)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK[:1])
    opt = result["optimized"]
    why = "RuntimeError: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code in Attention"
    assert opt["attention_fusion"] == f"unfused (fused attention failed to run: {why})"
    assert opt["fused_attention_nodes"] == 0 and opt["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("variants", [["fp32", "fp16"], [], "onnx"])
def test_unknown_variant_is_one_line_error(tmp_path, variants):
    with pytest.raises(UserError, match=r"export.variants: unknown variant .*; expected some of fp32, optimized, int8"):
        ex.export_onnx(tmp_path / "missing", tmp_path / "onnx", variants, CHECK)
    assert not (tmp_path / "onnx").exists()


def test_refuses_to_replace_foreign_directory(tmp_path):
    model_dir = saved_model(tmp_path, "bert", {})
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"^export output: '.*out' holds other files \(notes.txt\)"):
        ex.export_onnx(model_dir, tmp_path / "out", ["fp32"], CHECK[:1])
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_classifier_feeds_declared_inputs_only(exported):
    model_dir, out, _ = exported
    clf = ex.OnnxClassifier(out / "fp32")
    batch = CHECK[2]
    no_types = {"input_ids": batch["input_ids"].tolist(), "attention_mask": batch["attention_mask"], "extra": 1}
    assert np.abs(clf(no_types) - reference_logits(model_dir, batch)).max() <= 1e-4
    assert clf.size_bytes == (out / "fp32" / "model.onnx").stat().st_size
    with pytest.raises(UserError, match="needs input 'input_ids', which the batch lacks"):
        clf({"attention_mask": batch["attention_mask"]})


def test_evaluate_variant_accuracy():
    batches = [{"labels": torch.tensor([1, 0])}, {"labels": torch.tensor([1])}]
    logits = iter([np.array([[0.0, 1.0], [0.0, 1.0]]), np.array([[0.0, 2.0]])])
    result = ex.evaluate_variant(lambda b: next(logits), batches)
    assert result["accuracy"] == pytest.approx(2 / 3) and result["predictions"].tolist() == [1, 1, 1]


def test_cli_export(tmp_path, tiny_csv):
    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    recipe = tmp_path / "recipe.yaml"
    int8 = {"max_drop": 0.5, "calibration_examples": 16, "smooth_alpha": 0.5, "smooth_scope": "cheap"}
    recipe.write_text(yaml.safe_dump(tiny_recipe(model_dir, tiny_csv, tmp_path / "run", export={"int8": int8})))
    args = ["export", str(model_dir), str(tmp_path / "onnx"), "--variants", "fp32,int8,int8_static"]
    result = CliRunner().invoke(app, [*args, "--recipe", str(recipe), "--check-examples", "20"])
    assert result.exit_code == 0, result.output
    assert "fp32: " in result.output and "on 20 examples" in result.output
    manifest = json.loads((tmp_path / "onnx" / "export.json").read_text())
    assert sorted(manifest) == ["fp32", "int8", "int8_static"]
    for name in ("int8", "int8_static"):  # the recipe's gate, on its whole validation split
        assert manifest[name]["gate"]["max_drop"] == 0.5 and manifest[name]["gate"]["examples"] == 30
        assert f"{name} (inputs smoothed, α 0.5, " in result.output and manifest[name]["status"] in result.output
    assert "calibrated on 16 training examples" in manifest["int8_static"]["weights"]
    assert manifest["int8"]["smoothing"] == manifest["int8_static"]["smoothing"]  # one rescaled graph for both
    assert manifest["int8"]["smoothing"]["alpha"] == 0.5 and manifest["int8"]["smoothing"]["examples"] == 16
    assert manifest["int8"]["smoothing"]["scope"] == "cheap" and manifest["int8"]["smoothing"]["skipped"] > 0
    plain = CliRunner().invoke(app, ["export", str(model_dir), str(tmp_path / "onnx2"), "--variants", "fp32,int8"])
    assert plain.exit_code == 0, plain.output
    assert "gate" not in json.loads((tmp_path / "onnx2" / "export.json").read_text())["int8"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--variants", "fp32,fp16"], "--variants: expected comma-separated names from fp32, optimized, int8"),
        (["--atol", "0"], "--atol: expected a positive tolerance"),
    ],
)
def test_cli_bad_options_exit_2(tmp_path, extra, message):
    result = CliRunner().invoke(app, ["export", str(tmp_path), str(tmp_path / "onnx"), *extra])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_missing_model_dir(tmp_path):
    result = CliRunner().invoke(app, ["export", str(tmp_path / "nope"), str(tmp_path / "onnx")])
    assert result.exit_code == 2 and "MODEL_DIR: directory" in result.output


# ------------------------------------------------------------------------ FFN neurons and removed layers


def saved_unit_model(root: Path, arch: str, uniform: bool) -> tuple[Path, torch.nn.Module, torch.Tensor]:
    """A tiny model with heads and FFN neurons pruned (uneven widths, a removed layer, an FFN without neurons;
    or equal widths), saved with a tokenizer; also returns the unpruned model and its masked logits on CHECK[0]."""
    from transformers import AutoTokenizer

    from compressor.pruning.masking import full_gates, full_neuron_gates, gated
    from compressor.surgery.arch import original_ffn_size
    from compressor.surgery.slicing import pruned_copy

    model = tiny_model(arch, layers=LAYERS, heads=HEADS)
    ids = list(range(original_ffn_size(model)))
    if uniform:
        heads, neurons = {0: [2]}, {layer: ids[layer::3] for layer in range(LAYERS)}
    else:
        heads, neurons = UNEVEN_EMPTY | {2: [2]}, {0: ids[::2], 1: ids, 2: ids}
    gates, cells = full_gates(model), full_neuron_gates(model)
    for layer, hs in heads.items():
        gates[layer, hs] = 0.0
    for layer, ns in neurons.items():
        cells[layer, ns] = 0.0
    inputs = {k: v for k, v in CHECK[0].items() if k != "labels"}
    with torch.no_grad(), gated(model, gates, cells):
        masked = model(**inputs).logits
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(root / "tok"))
    return save_pruned(pruned_copy(model, heads, neurons), root / f"{arch}-units", tokenizer), model, masked


@pytest.mark.parametrize("uniform", [False, True], ids=["uneven-removed-layer", "uniform"])
@pytest.mark.parametrize("arch", ARCHS)
def test_neuron_and_layer_pruned_model_exports_with_parity(tmp_path, arch, uniform):
    """masked == pruned == ONNX (fp32 and optimised) with FFN neurons and whole layers removed."""
    model_dir, unpruned, masked = saved_unit_model(tmp_path, arch, uniform)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK[:2])
    assert result["fp32"]["max_abs_diff"] <= 1e-4 and result["optimized"]["max_abs_diff"] <= 1e-4
    onnx_logits = ex.OnnxClassifier(tmp_path / "onnx" / "fp32")(CHECK[0])
    assert np.abs(onnx_logits - masked.numpy()).max() <= 1e-4
    assert np.abs(onnx_logits - ex.torch_logits(unpruned, CHECK[0])).max() > 1e-2  # the pruning is visible


def test_int8_of_a_model_with_an_ffn_without_neurons(tmp_path):
    """A layer that keeps heads but lost every FFN neuron is traced with one zero-weight neuron (no zero-size weight
    left in the graph, which OpenVINO refuses and ORT's per-channel quantiser failed on): both int8 kinds quantise
    the graph, those nodes included, within the usual tolerance."""
    import onnx

    from compressor.deploy.quantize import empty_weight_nodes

    model_dir, _, _ = saved_unit_model(tmp_path, "bert", uniform=False)
    options = ex.Int8Options(calibration=CALIBRATION, validation=labelled_by(model_dir, VALIDATION_BATCHES))
    variants = ["fp32", "optimized", "int8", "int8_static"]
    result = ex.export_onnx(model_dir, tmp_path / "onnx", variants, CHECK, int8=options)
    assert present_neurons(load_pruned(model_dir))[2] == []  # layer 2 keeps two heads and no neuron
    assert not empty_weight_nodes(Path(result["optimized"]["file"]))
    for name in ("int8", "int8_static"):
        graph = onnx.load(result[name]["file"]).graph
        assert any(n.op_type in {"DynamicQuantizeMatMul", "MatMulInteger", "QuantizeLinear"} for n in graph.node)
        tol = int8_tol(model_dir, CHECK, CALIBRATION if name == "int8_static" else None)
        assert result[name]["agreement"] >= 0.75 and result[name]["max_abs_diff"] < tol


def labelled_by(model_dir: Path, batches: list[dict]) -> list[dict]:
    """Batches labelled with the PyTorch model's own predictions, so the fp32 graph scores 100% on them."""
    model = load_pruned(model_dir)
    return [{**b, "labels": torch.from_numpy(ex.torch_logits(model, b).argmax(-1))} for b in batches]


VALIDATION_BATCHES = [tiny_batch(batch=8, seq=11, seed=s) for s in range(20, 24)]
CALIBRATION = [tiny_batch(batch=8, seq=13, seed=s) for s in range(40, 43)]


def test_int8_static_is_calibrated_qdq_per_channel_and_gated(tmp_path):
    import onnx

    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    options = ex.Int8Options(
        max_drop=0.5, calibration=CALIBRATION, validation=labelled_by(model_dir, VALIDATION_BATCHES)
    )
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized", "int8_static"], CHECK, int8=options)
    static = result["int8_static"]
    graph = onnx.load(static["file"]).graph
    ops = {node.op_type for node in graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops and static["quantized_from"] == "optimized"
    weight_scales = [i for i in graph.initializer if i.name.endswith("_scale") and len(i.dims) == 1 and i.dims[0] > 1]
    assert weight_scales, "per-channel weights carry one scale per output channel"
    assert "calibrated on 24 training examples" in static["weights"]
    gate = static["gate"]
    assert gate["fp32_accuracy"] == 1.0 and gate["examples"] == 32 and gate["max_drop"] == 0.5
    assert gate["drop"] == pytest.approx(1.0 - gate["accuracy"]) and static["status"] == "accepted"
    assert static["agreement"] >= 0.75 and 0 < static["max_abs_diff"] < int8_tol(model_dir, CHECK, CALIBRATION)
    activations = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    assert len(activations) >= 6, "activations of the FFN MatMuls are quantised, not only weights"
    assert "gate" not in result["fp32"] and "status" not in result["optimized"]


def test_int8_static_needs_calibration(tmp_path):
    model_dir = saved_model(tmp_path, "bert", {0: [2]})
    with pytest.raises(UserError, match="export.int8: int8_static needs calibration batches"):
        ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "int8_static"], CHECK)
    assert not (tmp_path / "onnx").exists()


def negate_output(file: Path) -> None:
    """Rewrite a graph so it outputs -logits: for two labels every prediction flips (a quantiser gone wrong)."""
    import onnx

    model = onnx.load(str(file))
    out = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{out}_raw" if o == out else o for o in node.output]
    model.graph.node.append(onnx.helper.make_node("Neg", [f"{out}_raw"], [out]))
    onnx.save(model, str(file))


def test_int8_failing_its_gate_is_rejected_and_kept_on_disk(tmp_path, monkeypatch):
    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    real = ex.build_int8

    def broken(name, source, dest, options, feed):
        how = real(name, source, dest, options, feed)
        negate_output(dest)
        return how

    monkeypatch.setattr(ex, "build_int8", broken)
    options = ex.Int8Options(max_drop=0.01, validation=labelled_by(model_dir, VALIDATION_BATCHES))
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "int8"], CHECK, int8=options)
    int8 = result["int8"]
    assert int8["status"] == "rejected" and not int8["gate"]["passed"]
    assert int8["gate"]["drop"] > 0.5 and int8["gate"]["agreement_with_fp32"] < 0.5
    assert (tmp_path / "onnx" / "int8" / "model.onnx").exists(), "a rejected variant stays on disk"
    assert json.loads((tmp_path / "onnx" / ex.MANIFEST).read_text())["int8"]["status"] == "rejected"
    ungated = ex.export_onnx(model_dir, tmp_path / "onnx2", ["fp32", "int8"], CHECK)  # no validation batches
    assert ungated["int8"]["status"] == "ungated" and "gate" not in ungated["int8"]


@pytest.mark.e2e
def test_rejected_int8_is_reported_and_never_recommended(tmp_path, tiny_model_dir, tiny_csv, cache_dir, monkeypatch):
    """A whole run: the broken int8 is marked rejected in report.json, report.md and the model card, and the
    recommendation names the fastest variant that passed every gate instead."""
    from compressor.pipeline.runner import run_recipe
    from compressor.recipe import parse_recipe

    real = ex.build_int8

    def broken(name, source, dest, options, feed):
        how = real(name, source, dest, options, feed)
        if name == "int8":
            negate_output(dest)
        return how

    import compressor.deploy.quantize as quantize

    monkeypatch.setattr(ex, "build_int8", broken)
    monkeypatch.setattr(quantize, "build_int8", broken)  # the fp32 fallback's builds are broken too
    int8 = {"max_drop": 0.05, "min_agreement": 0.5, "fallback_nodes": 1, "calibration_examples": 32}
    recipe = tiny_recipe(
        tiny_model_dir,
        tiny_csv,
        tmp_path / "out",
        export={"variants": ["fp32", "int8", "int8_static"], "int8": int8},
        bench={
            "batch_sizes": [4],
            "seq_len": 16,
            "rounds": 1,
            "warmup": 0,
            "min_time_s": 0.01,
            "max_drop": None,
            "quantize_only": [],
        },  # fmt: skip
    )  # no accuracy gate vs the original: this test is about the int8 gate (tests/test_report.py has that one)
    report = run_recipe(parse_recipe(recipe))
    assert report["export"]["int8"]["status"] == "rejected"
    assert report["export"]["int8"]["gate"]["min_agreement"] == 0.5  # the recipe's gate reaches the export
    assert len(report["export"]["int8"]["fp32_fallback"]["tries"]) == 1
    assert "fp32_fallback" not in report["export"]["int8_static"], "a variant that passes needs no fallback"
    assert report["export"]["int8_static"]["gate"]["examples"] == 30  # the whole validation split
    rec = report["recommendation"]
    assert rec["variant"] != "onnx-int8" and rec["rejected"] == ["onnx-int8"]
    shipped = {"pytorch-pruned"} | {f"onnx-{n}" for n in report["export"]}  # the baseline is never recommended
    speeds = {k: v["headline_speedup"] for k, v in report["bench"]["summary"].items() if k not in rec["rejected"]}
    assert rec["speedup"] == max(v for k, v in speeds.items() if k in shipped)
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["recommendation"] == rec and saved["distillation"] is None
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| int8 |" in md and "**rejected** (kept on disk, never recommended)" in md
    assert "an fp32 fallback of up to 1 node(s) did not pass" in md
    assert f"**Recommendation: `{rec['variant']}`**" in md and "distillation off" in md
    card = (tmp_path / "out" / "model" / "README.md").read_text()
    assert "| int8 |" in card and "REJECTED (failed the int8 gate)" in card and "distillation off" in card


OUTLIER_NODE = "/bert/encoder/layer.0/output/dense/MatMul"


def outlier_model(root: Path) -> Path:
    """A tiny BERT whose first feed-forward block has one activation outlier (an intermediate neuron always at 300,
    which the output projection ignores): fp32 is unaffected, but dynamic int8 quantises that projection's input
    with one scale per batch matrix, so the outlier crushes every other channel (the known BERT failure)."""
    from transformers import AutoTokenizer

    model_dir = saved_model(root, "bert", {0: [1]})
    model = load_pruned(model_dir)
    block = model.bert.encoder.layer[0]
    with torch.no_grad():
        block.intermediate.dense.weight[0].zero_()
        block.intermediate.dense.bias[0] = 300.0
        block.output.dense.weight[:, 0].zero_()
    return save_pruned(model, model_dir, AutoTokenizer.from_pretrained(model_dir))


def beyond_kernel_error(model_dir: Path, optimized: Path, batches: list[dict], dest: Path) -> tuple[list[dict], float]:
    """(validation batches, margin) for a gate whose verdict no int8 kernel can change.

    This CPU's int8 error without the planted outlier is measured: the largest |Δlogit| of `optimized` quantised with
    the outlier's node kept in fp32 (7- or 8-bit weights as `auto` picks them here, VNNI or not). Only examples whose
    fp32 logit margin exceeds three times that error are kept, labelled with the fp32 prediction: a graph whose only
    int8 error is the kernel's cannot flip any of them, while the outlier (an error of whole logits) still does.
    """
    from compressor.deploy.quantize import quantize_graph

    model = load_pruned(model_dir)
    quantize_graph(optimized, dest / "model.onnx", nodes_to_exclude=[OUTLIER_NODE])
    rescued = ex.OnnxClassifier(dest)
    kept, errors = [], []
    for batch in batches:
        ref = ex.torch_logits(model, batch)
        errors.append(np.abs(rescued(batch) - ref).max())
        kept.append((ref, batch))
    margin = 3 * float(max(errors))
    out = []
    for ref, batch in kept:
        top = np.sort(ref, axis=-1)
        rows = torch.from_numpy(np.flatnonzero(top[:, -1] - top[:, -2] > margin))
        if len(rows):
            out.append({**{k: v[rows] for k, v in batch.items()}, "labels": torch.from_numpy(ref.argmax(-1))[rows]})
    return out, margin


def test_fp32_fallback_finds_the_outlier_node_and_passes_the_gate(tmp_path):
    import onnx

    from compressor.report.card import render_deployment_section
    from compressor.report.summary import _export_table

    model_dir = outlier_model(tmp_path)
    variants = ["fp32", "optimized", "int8"]
    ex.export_onnx(model_dir, tmp_path / "graphs", ["fp32", "optimized"], CHECK)
    batches = [tiny_batch(batch=16, seq=11, seed=s) for s in range(20, 52)]
    optimized = tmp_path / "graphs" / "optimized" / "model.onnx"
    val, margin = beyond_kernel_error(model_dir, optimized, batches, tmp_path / "kernel")
    assert margin < 0.5 and sum(len(b["labels"]) for b in val) >= 256, "the kernel's own error leaves a usable split"
    # Every kept prediction must survive: only the kernel's own error would be left, and it cannot flip them.
    plain = ex.Int8Options(max_drop=None, min_agreement=1.0, validation=val)
    rejected = ex.export_onnx(model_dir, tmp_path / "plain", variants, CHECK, int8=plain)["int8"]
    assert rejected["status"] == "rejected" and "fp32_fallback" not in rejected, "no fallback unless asked"

    options = ex.Int8Options(max_drop=None, min_agreement=1.0, validation=val, fallback_nodes=2)
    int8 = ex.export_onnx(model_dir, tmp_path / "onnx", variants, CHECK, int8=options)["int8"]
    fallback = int8["fp32_fallback"]
    assert fallback["first_gate"] == rejected["gate"] and not fallback["first_gate"]["passed"]
    assert fallback["scan"][0]["node"] == OUTLIER_NODE, "the scan ranks the outlier's node first"
    assert len(fallback["scan"]) == len(quantized_nodes(tmp_path / "onnx" / "optimized" / "model.onnx"))
    assert fallback["passed"] and fallback["kept_fp32"] == [OUTLIER_NODE] and len(fallback["tries"]) == 1
    assert int8["status"] == "accepted" and int8["gate"]["agreement_with_fp32"] == 1.0
    assert int8["excluded_nodes"] == [OUTLIER_NODE]
    graph = {n.name: n.op_type for n in onnx.load(int8["file"]).graph.node}
    assert graph[OUTLIER_NODE] == "MatMul", "the kept node stays a float MatMul"
    assert any(op in {"MatMulInteger", "DynamicQuantizeMatMul"} for op in graph.values()), "the rest is int8"
    assert int8["max_abs_diff"] < rejected["max_abs_diff"] / 2, "the shipped graph is the rescued one"
    table = "\n".join(_export_table({"int8": int8}))
    assert f"accepted after keeping 1 node(s) in fp32: `{OUTLIER_NODE}`" in table and "(min 100.00)" in table
    assert f"accepted, 1 node(s) kept in fp32: {OUTLIER_NODE}" in render_deployment_section({"int8": int8}, None)


def test_fp32_fallback_that_never_passes_leaves_the_variant_rejected_and_unchanged(tmp_path, monkeypatch):
    import onnx

    import compressor.deploy.quantize as quantize

    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    real = quantize.build_int8

    def broken(name, source, dest, options, feed):  # every build flips every prediction: nothing can pass
        how = real(name, source, dest, options, feed)
        negate_output(dest)
        return how

    monkeypatch.setattr(ex, "build_int8", broken)
    monkeypatch.setattr(quantize, "build_int8", broken)
    options = ex.Int8Options(max_drop=0.01, validation=labelled_by(model_dir, VALIDATION_BATCHES), fallback_nodes=3)
    int8 = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "int8"], CHECK, int8=options)["int8"]
    fallback = int8["fp32_fallback"]
    assert int8["status"] == "rejected" and not fallback["passed"] and fallback["kept_fp32"] == []
    assert [len(t["kept_fp32"]) for t in fallback["tries"]] == [1, 2, 3]
    assert int8["gate"] == fallback["first_gate"] and int8["excluded_nodes"] == []
    graph = onnx.load(int8["file"]).graph
    assert not [n for n in graph.node if n.name in fallback["tries"][-1]["kept_fp32"] and n.op_type == "MatMul"]
    assert not [p for p in (tmp_path / "onnx").rglob("*") if p.name.startswith("tmp")], "trial graphs cleaned up"


# ------------------------------------------------------------------------ activation smoothing (SmoothQuant)


@pytest.mark.parametrize("arch", ["bert", "distilbert", "roberta"])
def test_smoothing_rescales_every_matmul_and_keeps_the_logits(tmp_path, arch):
    import onnx

    from compressor.deploy.smoothing import smooth_graph, smoothable_matmuls

    model_dir = saved_model(tmp_path, arch, UNEVEN_EMPTY)
    ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK)
    source = tmp_path / "onnx" / "optimized" / "model.onnx"
    before = onnx.load(str(source)).graph
    feed = ex.OnnxClassifier(source).feed
    info = smooth_graph(source, tmp_path / "smooth" / "model.onnx", CALIBRATION, feed, alpha=0.8)
    after = onnx.load(str(tmp_path / "smooth" / "model.onnx")).graph
    assert info["matmuls"] == len(smoothable_matmuls(before)) > 0 and info["examples"] == 24
    producers = {o: n.op_type for n in after.node for o in n.output}
    inputs = [producers[n.input[0]] for n in smoothable_matmuls(after)]
    attention_layers = sum(1 for n in before.node if n.op_type == "Attention")
    assert attention_layers > 0, "the optimised graph fuses attention: the fold is exercised"
    assert inputs.count("Attention") == info["folded_into_attention"] == attention_layers, "folded into V"
    assert inputs.count("Mul") == info["matmuls"] - attention_layers and set(inputs) <= {"Mul", "Attention"}
    assert len(after.node) == len(before.node) + info["matmuls"] - attention_layers
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in before.initializer}
    rescaled = {t.name: onnx.numpy_helper.to_array(t) for t in after.initializer}
    assert any(not np.allclose(weights[n.input[1]], rescaled[n.input[1]]) for n in smoothable_matmuls(before))
    for batch in CHECK:  # x/s @ (s W) == x @ W up to float rounding
        smoothed = ex.OnnxClassifier(tmp_path / "smooth" / "model.onnx")(batch)
        assert np.abs(smoothed - ex.OnnxClassifier(source)(batch)).max() < 1e-4


def _smoothed_with_scope(tmp_path, arch: str, scope: str):
    """A tiny `arch` model's optimized graph smoothed with `scope`: (source, dest, info, source graph, dest graph)."""
    import onnx

    from compressor.deploy.smoothing import smooth_graph

    model_dir = saved_model(tmp_path, arch, UNEVEN_EMPTY)
    ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", "optimized"], CHECK)
    source = tmp_path / "onnx" / "optimized" / "model.onnx"
    dest = tmp_path / scope / "model.onnx"
    info = smooth_graph(source, dest, CALIBRATION, ex.OnnxClassifier(source).feed, alpha=0.8, scope=scope)
    return source, dest, info, onnx.load(str(source)).graph, onnx.load(str(dest)).graph


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_cheap_smoothing_skips_the_down_projections(tmp_path, arch):
    """scope "cheap" leaves every MatMul whose input is wider than its output (the FFN output projection) as it
    was, adds no Mul before one, and still smooths the rest; the function stays the same."""
    import onnx

    from compressor.deploy.smoothing import smooth_graph, smoothable_matmuls

    source, dest, info, before, after = _smoothed_with_scope(tmp_path, arch, "cheap")
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in before.initializer}
    rescaled = {t.name: onnx.numpy_helper.to_array(t) for t in after.initializer}
    down = [n for n in smoothable_matmuls(before) if weights[n.input[1]].shape[0] > weights[n.input[1]].shape[1]]
    assert down and info["skipped"] == len(down) and info["scope"] == "cheap"
    assert info["matmuls"] + info["skipped"] == len(smoothable_matmuls(before))
    for node in down:
        assert np.array_equal(weights[node.input[1]], rescaled[node.input[1]]), "a down-projection is untouched"
    producers = {o: n.op_type for n in after.node for o in n.output}
    readers = [producers[n.input[0]] for n in after.node if n.op_type == "MatMul" and n.name in {d.name for d in down}]
    assert "Mul" not in readers, "no extra pass over the wide activation"
    assert len(after.node) == len(before.node) + info["matmuls"] - info["folded_into_attention"]
    for batch in CHECK:
        assert np.abs(ex.OnnxClassifier(dest)(batch) - ex.OnnxClassifier(source)(batch)).max() < 1e-4
    with pytest.raises(ValueError, match="scope: expected one of all, cheap, free, got 'some'"):
        smooth_graph(source, dest, CALIBRATION, ex.OnnxClassifier(source).feed, alpha=0.8, scope="some")


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_free_smoothing_adds_no_node(tmp_path, arch):
    """scope "free" smooths only the MatMuls whose division folds into the fused attention's value weights: the
    graph keeps its node count, every other MatMul weight is untouched, and the function stays the same."""
    import onnx

    from compressor.deploy.smoothing import smoothable_matmuls

    source, dest, info, before, after = _smoothed_with_scope(tmp_path, arch, "free")
    assert info["matmuls"] == info["folded_into_attention"] > 0 and info["skipped"] > 0
    assert info["matmuls"] + info["skipped"] == len(smoothable_matmuls(before))
    assert len(after.node) == len(before.node), "no Mul (or any other node) added"
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in before.initializer}
    rescaled = {t.name: onnx.numpy_helper.to_array(t) for t in after.initializer}
    changed = [n for n in smoothable_matmuls(before) if not np.array_equal(weights[n.input[1]], rescaled[n.input[1]])]
    assert len(changed) == info["matmuls"]
    for batch in CHECK:
        assert np.abs(ex.OnnxClassifier(dest)(batch) - ex.OnnxClassifier(source)(batch)).max() < 1e-4


def test_outlier_ratio():
    from compressor.deploy.smoothing import outlier_ratio_of

    assert outlier_ratio_of(np.array([1.0, 2.0, 2.0, 30.0], np.float32)) == pytest.approx(15.0)
    assert outlier_ratio_of(np.array([2.0, 2.0, 2.0], np.float32)) == pytest.approx(1.0)
    assert outlier_ratio_of(np.array([0.0, 0.0, 1.0], np.float32)) == float("inf"), "dead channels: no division by 0"


def test_smoothing_scales():
    from compressor.deploy.smoothing import SCALE_RANGE, smoothing_scales

    act = np.array([4.0, 1.0, 0.0, 9.0], np.float32)
    weight = np.array([[1.0, -1.0], [0.25, 0.0], [2.0, 1.0], [0.0, 0.0]], np.float32)
    scales = smoothing_scales(act, weight, alpha=0.5)
    assert scales[:2] == pytest.approx([2.0, 2.0])  # sqrt(4)/sqrt(1), sqrt(1)/sqrt(0.25)
    assert scales[2] == 1.0, "a channel never active is left alone"
    assert scales[3] == SCALE_RANGE[1], "a zero weight row gets the largest scale, not inf"
    assert smoothing_scales(act, weight, alpha=1.0)[0] == pytest.approx(4.0)


def test_smoothing_tames_the_outlier_that_breaks_int8(tmp_path):
    """The planted activation outlier wrecks plain dynamic int8; smoothed, the same int8 stays close to fp32."""
    from compressor.report.card import render_deployment_section
    from compressor.report.summary import _export_table

    model_dir = outlier_model(tmp_path)
    calibration = [tiny_batch(batch=16, seq=11, seed=s) for s in range(40, 44)]
    variants = ["fp32", "optimized", "int8"]
    plain = ex.export_onnx(model_dir, tmp_path / "plain", variants, CHECK)["int8"]
    options = ex.Int8Options(smooth_alpha=0.8, calibration=calibration)
    smooth = ex.export_onnx(model_dir, tmp_path / "onnx", variants, CHECK, int8=options)["int8"]
    assert smooth["smoothing"]["matmuls"] > 0 and smooth["smoothing"]["max_abs_diff"] < 1e-4
    assert smooth["max_abs_diff"] < plain["max_abs_diff"] / 3
    assert smooth["agreement"] >= plain["agreement"]
    assert not (tmp_path / "onnx" / ".smoothed").exists(), "the rescaled fp32 graph is not shipped"
    cheap = ex.Int8Options(smooth_alpha=0.8, smooth_scope="cheap", calibration=calibration)
    cheap = ex.export_onnx(model_dir, tmp_path / "cheap", variants, CHECK, int8=cheap)["int8"]
    assert cheap["smoothing"]["skipped"] > 0 and cheap["smoothing"]["scope"] == "cheap"
    # cheap skips the down-projection the outlier feeds; an outlier ratio brings back just that one
    lone = ex.Int8Options(smooth_alpha=0.8, smooth_scope="cheap", smooth_outlier_ratio=20, calibration=calibration)
    lone = ex.export_onnx(model_dir, tmp_path / "lone", variants, CHECK, int8=lone)["int8"]
    assert lone["smoothing"]["matmuls"] == cheap["smoothing"]["matmuls"] + 1
    assert lone["max_abs_diff"] < plain["max_abs_diff"] / 3 and lone["smoothing"]["outlier_ratio"] == 20
    assert cheap["max_abs_diff"] > 3 * lone["max_abs_diff"], "the cheap scope alone leaves the outlier in place"
    # the free scope adds a Mul only where the outlier is
    free = ex.Int8Options(smooth_alpha=0.8, smooth_scope="free", smooth_outlier_ratio=20, calibration=calibration)
    free = ex.export_onnx(model_dir, tmp_path / "free", variants, CHECK, int8=free)["int8"]
    assert free["smoothing"]["matmuls"] == free["smoothing"]["folded_into_attention"] + 1
    assert free["max_abs_diff"] < plain["max_abs_diff"] / 3
    table = "\n".join(_export_table({"int8": smooth, "int8 cheap": cheap}))
    total = smooth["smoothing"]["matmuls"]
    assert "| int8 (inputs smoothed, α 0.8) |" in table
    assert f"| int8 cheap (inputs smoothed, α 0.8, {cheap['smoothing']['matmuls']} of {total} MatMuls) |" in table
    card = render_deployment_section({"int8": cheap}, None)
    assert f"| int8 (inputs smoothed, α 0.8, {cheap['smoothing']['matmuls']} of {total} MatMuls) |" in card
    with pytest.raises(UserError, match=r"export\.int8\.smooth_alpha: smoothing needs calibration batches"):
        ex.export_onnx(model_dir, tmp_path / "x", variants, CHECK, int8=ex.Int8Options(smooth_alpha=0.8))


def test_the_int8_gate_makes_the_same_call_when_the_export_is_repeated(tmp_path):
    """Same model, same options, same machine: the same int8 graph, bit for bit, the same logits and the same gate
    verdict (what a resumed or repeated run relies on; smoothing's calibration is seeded)."""
    model_dir = saved_model(tmp_path, "bert", UNEVEN_EMPTY)
    val = labelled_by(model_dir, VALIDATION_BATCHES)
    options = ex.Int8Options(max_drop=0.01, validation=val, calibration=CALIBRATION, smooth_alpha=0.8)
    runs = [
        ex.export_onnx(model_dir, tmp_path / name, ["fp32", "optimized", "int8"], CHECK, int8=options)["int8"]
        for name in ("first", "second")
    ]
    assert runs[0]["gate"] == runs[1]["gate"] and runs[0]["status"] == runs[1]["status"]
    graphs = [(tmp_path / name / "int8" / "model.onnx").read_bytes() for name in ("first", "second")]
    assert graphs[0] == graphs[1]
    logits = [np.concatenate([ex.OnnxClassifier(tmp_path / n / "int8")(b) for b in val]) for n in ("first", "second")]
    assert np.array_equal(logits[0], logits[1])
