"""`pytorch-int8` (`compressor.deploy.engines.pytorch_int8`): the saved model with dynamically quantised Linear layers,
built and gated at export like every int8 variant, loaded by the bench, timed for a speed-up budget, and opt-in."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch
from conftest import tiny_recipe
from test_export import CHECK, int8_tol, saved_model
from typer.testing import CliRunner

from compressor import bench
from compressor.cli import app
from compressor.core import runtimes
from compressor.deploy.engines import pytorch_int8
from compressor.deploy.export import export_onnx
from compressor.deploy.quantize import Int8Options
from compressor.pipeline.runner import run_recipe
from compressor.pruning.latency import Dims, LatencyTable
from compressor.recipe import parse_recipe
from compressor.report.schema import RunReport
from compressor.surgery.checkpoint import load_pruned
from compressor.testing import ARCHS

RUNTIME = runtimes.runtime("pytorch-int8")


def _linears(model: torch.nn.Module) -> tuple[int, int]:
    """(plain nn.Linear layers, dynamically quantised ones) in `model`."""
    modules = list(model.modules())
    plain = sum(type(m) is torch.nn.Linear for m in modules)
    return plain, sum(m._get_name() == "DynamicQuantizedLinear" for m in modules)


@pytest.mark.parametrize("arch", ARCHS)
def test_built_for_every_architecture_within_the_simulated_int8_deviation(arch, tmp_path):
    """The variant of every architecture reproduces PyTorch's logits as closely as int8 arithmetic allows, with every
    Linear quantised, and without torch's deprecation notes reaching the user."""
    model_dir = saved_model(tmp_path, arch, {0: [1], 2: [0, 3]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entry = export_onnx(model_dir, tmp_path / "onnx", ["pytorch-int8"], CHECK)["pytorch-int8"]
    assert not [w for w in caught if "quantiz" in str(w.message).lower()]
    assert entry["max_abs_diff"] <= int8_tol(model_dir, CHECK)
    assert entry["quantized_from"] == "pytorch" and entry["status"] == "ungated"
    classifier = runtimes.engine_of("pytorch-int8").load(RUNTIME, tmp_path / "onnx" / "pytorch-int8")
    plain, quantized = _linears(classifier.model)
    assert plain == 0 and quantized == _linears(load_pruned(model_dir))[0] > 0
    assert classifier.size_bytes < sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


def test_gated_against_the_fp32_model_like_every_int8_variant(tmp_path, caplog):
    """A gate it passes accepts it; one it cannot pass rejects it (kept on disk, one warning line), and the bench
    still loads it so the frontier can show it as rejected."""
    model_dir = saved_model(tmp_path, "bert", {0: [1], 2: [0, 3]})
    passable = Int8Options(validation=CHECK, max_drop=1.0, min_agreement=0.0)
    entry = export_onnx(model_dir, tmp_path / "a", ["pytorch-int8"], CHECK, int8=passable)["pytorch-int8"]
    assert entry["status"] == "accepted" and entry["gate"]["examples"] == sum(len(b["labels"]) for b in CHECK)
    impossible = Int8Options(validation=CHECK, max_drop=-1.0)
    with caplog.at_level(logging.WARNING, logger="compressor.deploy.export"):
        entry = export_onnx(model_dir, tmp_path / "b", ["pytorch-int8"], CHECK, int8=impossible)["pytorch-int8"]
    assert entry["status"] == "rejected" and not entry["gate"]["passed"]
    assert any("pytorch-int8 rejected" in r.getMessage() for r in caplog.records)
    manifest = json.loads((tmp_path / "b" / "export.json").read_text())
    assert manifest["pytorch-int8"]["status"] == "rejected"
    candidate = bench.runtime_candidate("pytorch-int8", "pytorch-int8", entry["dir"], [11])
    assert candidate.kind == "pytorch" and candidate.predict(CHECK[0]).shape == (4, 2)


def test_per_tensor_weights_are_recorded_and_loaded_as_built(tmp_path):
    model_dir = saved_model(tmp_path, "bert", {0: [1]})
    options = Int8Options(per_channel=False)
    entry = export_onnx(model_dir, tmp_path / "onnx", ["pytorch-int8"], CHECK, int8=options)["pytorch-int8"]
    assert entry["per_channel"] is False and "per tensor" in entry["weights"]
    model = runtimes.engine_of("pytorch-int8").load(RUNTIME, entry["dir"]).model
    schemes = {m.weight().qscheme() for m in model.modules() if m._get_name() == "DynamicQuantizedLinear"}
    assert schemes == {torch.per_tensor_affine}


def test_timeable_for_a_speed_up_budget_without_touching_the_module(tmp_path):
    """A latency table can be measured on it, and timing quantises a copy: the caller's module stays fp32."""
    dims = Dims(hidden=16, heads=2, head_size=8, intermediate=32, layers=2, vocab=50, positions=32, num_labels=2)
    table = LatencyTable.build(dims, "pytorch-int8", batch_size=2, seq_len=8, threads=1, rounds=1, min_time_s=0.001)
    assert table.runtime == "pytorch-int8" and table.outside_ms > 0
    assert table.key["torch_quantized_engine"] == torch.backends.quantized.engine
    module = torch.nn.Sequential(torch.nn.Linear(16, 4)).eval()
    call = runtimes.engine_of("pytorch-int8").timer(RUNTIME, module, torch.randn(3, 16), 1, tmp_path)
    assert call().shape == (3, 4) and type(module[0]) is torch.nn.Linear


def test_opt_in_only():
    """Left out of the default export and bench (they are costly enough); a recipe lists it to get it, as an export
    variant, a quantize-only point or a budget runtime."""
    recipe = parse_recipe({})
    assert "pytorch-int8" not in recipe.export.variants and "pytorch-int8" not in recipe.bench.quantize_only
    budget = {"kind": "speedup", "value": 2.0, "runtime": "pytorch-int8"}
    chosen = parse_recipe(
        {
            "prune": {"units": ["heads"], "budget": budget},
            "export": {"variants": ["fp32", "pytorch-int8"]},
            "bench": {"quantize_only": ["pytorch-int8"]},
        }
    )
    assert chosen.export.variants == ["fp32", "pytorch-int8"] and chosen.bench.quantize_only == ["pytorch-int8"]
    assert pytorch_int8.RUNTIME is RUNTIME  # the module registered the declaration readers see


@pytest.mark.e2e
def test_a_run_that_lists_it_has_it_on_the_frontier_and_pick_can_choose_it(tmp_path, tiny_model_dir, tiny_csv):
    """Listed in a run's export and quantize-only runtimes: the pruned model and the original are built on it, gated,
    benchmarked, on the frontier, and `compressor pick --runtime pytorch-int8` returns one of them."""
    finetune = {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 96}
    budget = {"kind": "heads", "values": [0.5]}
    prune = {"criterion": {"name": "taylor"}, "budget": budget, "steps": 2, "score_examples": 64, "finetune": finetune}
    bench_spec = {"batch_sizes": [1], "seq_len": 32, "rounds": 2, "warmup": 1, "min_time_s": 0.01, "max_drop": None}
    overrides = {
        "prune": prune,
        "export": {"variants": ["fp32", "pytorch-int8"], "int8": {"max_drop": 0.5}},
        "bench": {**bench_spec, "quantize_only": ["pytorch-int8"]},
    }
    run_recipe(parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "run", **overrides)))
    report = RunReport.read(tmp_path / "run" / "report.json")
    assert json.loads((tmp_path / "run" / "onnx" / "export.json").read_text())["pytorch-int8"]["status"] == "accepted"
    rows = {r.name: r for r in report.frontier_rows()}
    assert {"pytorch-int8-original", "pytorch-int8"} <= set(rows)  # the original quantized, and the pruned model
    assert rows["pytorch-int8"].runtime == rows["pytorch-int8-original"].runtime == "pytorch-int8"
    pick = ["pick", str(tmp_path / "run"), "--max-drop", "none", "--runtime", "pytorch-int8", "--json"]
    cli = CliRunner().invoke(app, pick)
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output)["name"] in {"pytorch-int8", "pytorch-int8-original"}


def test_compressor_export_builds_it_and_prints_its_line(tmp_path):
    """`compressor export --variants fp32,pytorch-int8`: one line per variant, the int8 one without the ONNX graphs'
    fused-attention count it has no graph for."""
    model_dir = saved_model(tmp_path, "bert", {0: [1]})
    args = ["export", str(model_dir), str(tmp_path / "out"), "--variants", "fp32,pytorch-int8"]
    cli = CliRunner().invoke(app, args)
    assert cli.exit_code == 0, cli.output
    line = next(line for line in cli.output.splitlines() if line.startswith("pytorch-int8:"))
    assert "ungated" in line and "fused attention" not in line
    assert (tmp_path / "out" / "pytorch-int8" / pytorch_int8.SETTINGS).is_file()
