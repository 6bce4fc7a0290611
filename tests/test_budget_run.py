"""`compressor run` with FFN neurons under a budget on a tiny BERT: masked == pruned == ONNX, reload, resume with
neuron masks, the budget and baseline sections of the report."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import tiny_recipe
from transformers import AutoTokenizer

from compressor.core import outdir
from compressor.pipeline.runner import run_recipe
from compressor.pruning import budget as budget_mod
from compressor.pruning.latency import Dims, LatencyTable
from compressor.pruning.units import alive_units
from compressor.recipe import dump_recipe, parse_recipe
from compressor.recovery import choice as api
from compressor.surgery.checkpoint import load_pruned

UNITS = {"units": ["heads", "neurons"], "criterion": {"name": "taylor"}, "steps": 2, "score_examples": 64}
FINETUNE = {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 96}
BENCH = {"batch_sizes": [1], "seq_len": 32, "rounds": 2, "warmup": 1, "min_time_s": 0.01, "quantize_only": []}


def _recipe(tmp_path, model_dir, data, name, budget, **overrides):
    prune = {**UNITS, "budget": budget, "finetune": FINETUNE}
    return parse_recipe(tiny_recipe(model_dir, data, tmp_path / name, prune=prune, **overrides))


@pytest.fixture
def linear_table(monkeypatch):
    """A known latency table (layer ms = 1 + heads/10 + neurons/20) instead of timing one in a unit test; the
    run's per-step measurement of the real pruned model is faked as exactly what the table predicts."""
    tables = []

    def fake(config, runtime, batch_size, seq_len, **kwargs):
        dims = config if isinstance(config, Dims) else Dims.from_config(config)
        heads, neurons = [0, dims.heads], [0, dims.intermediate]
        grid = [[1 + h / 10 + n / 20 for n in neurons] for h in heads]
        tables.append(LatencyTable(runtime, batch_size, seq_len, 1, dims, heads, neurons, grid, outside_ms=0.5))
        return tables[-1]

    def measured(original, pruned, runtime, batch_size, seq_len):
        table = tables[-1]
        return table.speedup(*(budget_mod.widths_of(alive_units(m), table.dims) for m in (original, pruned)))

    monkeypatch.setattr(budget_mod, "load_or_build", fake)
    monkeypatch.setattr(api, "measured_speedup", measured)


def test_speedup_budget_run_end_to_end(tmp_path, tiny_model_dir, tiny_csv, cache_dir, linear_table):
    """Neurons and heads pruned to a predicted 1.6×; the saved model equals the masked one, its ONNX export equals
    it, it reloads; the report has the budget (asked, predicted, measured at the budget's shape) and the baseline."""
    budget = {"kind": "speedup", "value": 1.6, "batch_size": 4, "seq_len": 16}
    recipe = _recipe(tmp_path, tiny_model_dir, tiny_csv, "speed", budget, export={"variants": ["fp32"]}, bench=BENCH)
    report = run_recipe(recipe)
    pruned = report["pruned"]
    assert pruned["masked_vs_pruned_max_abs_diff"] <= 1e-4 and report["export"]["fp32"]["max_abs_diff"] <= 1e-4
    assert pruned["units_removed"]["neurons"] == report["original"]["ffn_neurons"] - pruned["ffn_neurons"] > 0
    assert report["steps"][-1]["predicted_speedup"] >= 1.6
    assert [s["calibration"] for s in report["steps"]] == pytest.approx([1.0] * len(report["steps"]))
    assert report["budget"]["measured_in_run"] == report["steps"][-1]["measured_speedup"]
    b = report["budget"]
    assert (b["kind"], b["value"], b["runtime"], b["predicted_speedup"]) == ("speedup", 1.6, "pytorch", pytest.approx(
        report["steps"][-1]["predicted_speedup"]))  # fmt: skip
    assert b["measured_speedup"] > 0 and isinstance(b["within_10pct"], bool)
    setup = report["bench"]["setup"]
    assert setup["seq_lens"][0] == 16 and 4 in setup["batch_sizes"]  # the bench measured the budget's shape
    base = report["baseline"]
    assert base["layers_dropped"] >= 1 and 0 <= base["mcnemar_p"] <= 1
    assert base["pruned_accuracy"] == pytest.approx(pruned["test"]["accuracy"])
    assert "pytorch-layer-drop" in report["bench"]["summary"]
    md = (tmp_path / "speed" / "report.md").read_text()
    for text in ("## Budget", "| asked | 1.60× |", "## Baseline: dropping top layers", "accuracy_vs_speedup.png"):
        assert text in md
    _check_pick(tmp_path / "speed", report, tmp_path / "picked")
    model_dir = tmp_path / "speed" / "model"
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = tok(["the film was great fun", "a dull and boring plot"], padding=True, return_tensors="pt")
    reloaded = load_pruned(model_dir).eval()
    assert [len(n) for n in _present(reloaded)] == pruned["ffn_neurons_per_layer"]
    with torch.inference_mode():
        assert reloaded(**batch).logits.shape == (2, 2)


def _check_pick(run_dir, report: dict, out) -> None:
    """A one-target run's report.json carries the frontier too (paths relative to the run directory), and
    `compressor pick` copies the PyTorch model it picks to a directory that loads."""
    from typer.testing import CliRunner

    from compressor.cli import app

    assert {r["name"] for r in report["frontier"]} >= {"pytorch-original", "pytorch-pruned", "onnx-fp32"}
    assert all(r["path"] is None or not r["path"].startswith("/") for r in report["frontier"])
    result = CliRunner().invoke(app, ["pick", str(run_dir), "--max-drop", "none", "--runtime", "pytorch",
                                      "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith("pytorch-pruned: ")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (run_dir / "model").iterdir())


def _present(model):
    from compressor.surgery.arch import present_neurons

    return present_neurons(model)


def test_flop_budget_run_resumes_with_neuron_masks(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """A run resumed from its step-1 checkpoint (neuron masks included) ends exactly where the uninterrupted run
    ends; with `baseline: null` the report has no baseline section."""
    budget = {"kind": "flops", "value": 0.5, "seq_len": 16}
    reference = run_recipe(_recipe(tmp_path, tiny_model_dir, tiny_csv, "ref", budget))
    assert "baseline" in reference and reference["pruned"]["units_removed"]["neurons"] > 0
    resumed_recipe = _recipe(tmp_path, tiny_model_dir, tiny_csv, "resumed", budget)
    out = tmp_path / "resumed"
    outdir.claim(outdir.check_run_dir(str(out), False, lambda _: True), dump_recipe(resumed_recipe))
    outdir.finish(out)  # an interrupted run: identity and recipe written, lock released, step 1 checkpointed
    shutil.copytree(tmp_path / "ref" / "state" / "step_000", out / "state" / "step_000")
    resumed = run_recipe(resumed_recipe)
    assert "resuming after step 1" in (out / "run.log").read_text()
    assert resumed["pruned"]["ffn_neurons_per_layer"] == reference["pruned"]["ffn_neurons_per_layer"]
    assert resumed["pruned"]["plan"] == reference["pruned"]["plan"]
    for a, b in zip(resumed["steps"], reference["steps"], strict=True):
        assert a["neurons_per_layer"] == b["neurons_per_layer"] and a["removed_neurons"] == b["removed_neurons"]
    assert resumed["pruned"]["test"] == pytest.approx(reference["pruned"]["test"], abs=1e-6)
    assert resumed["baseline"]["baseline_accuracy"] == pytest.approx(reference["baseline"]["baseline_accuracy"])
    no_base = _recipe(tmp_path, tiny_model_dir, tiny_csv, "nobase", budget)
    no_base = no_base.model_copy(update={"prune": no_base.prune.model_copy(update={"baseline": None})})
    assert "baseline" not in json.loads(json.dumps(run_recipe(no_base)))


def test_onnx_speedup_budget_is_measured_against_the_original_on_that_runtime(
    tmp_path, tiny_model_dir, tiny_csv, cache_dir, linear_table, monkeypatch
):
    """The verdict is the budget check after the bench: the member's export timed alone against the original's
    export to the same runtime, with `check_rounds` rounds at the budget's shape (logged, timed in the report)."""
    import compressor.bench.timing as timing

    checked, real = [], timing.measure_throughput

    def measure(cands, *args, **kwargs):
        checked.append([c.name for c in cands])
        return real(cands, *args, **kwargs)

    monkeypatch.setattr(timing, "measure_throughput", measure)
    budget = {"kind": "speedup", "value": 1.5, "runtime": "onnx-fp32", "batch_size": 4, "seq_len": 16}
    budget["check_rounds"] = 3
    overrides = {"export": {"variants": ["fp32"]}, "bench": BENCH, "prune.baseline": None}
    report = run_recipe(_recipe(tmp_path, tiny_model_dir, tiny_csv, "onnx", budget, **overrides))
    assert {"onnx-fp32", "onnx-fp32-original"} <= set(report["bench"]["summary"])
    b = report["budget"]
    assert b["measured_vs"] == "onnx-fp32-original" and "baseline" not in report
    assert checked == [["onnx-fp32-original", "onnx-fp32"]]  # the two alone, after the bench
    assert b["measured_rounds"] == 3 and b["measured_iqr"][0] <= b["measured_speedup"] <= b["measured_iqr"][1]
    assert b["within_10pct"] == (abs(b["measured_speedup"] - 1.5) <= 0.15)
    assert {"original: export", "bench", "budget check"} <= set(report["timings"])  # the original's export: its own
    assert "budget check: onnx-fp32 against onnx-fp32-original, 3 rounds" in (tmp_path / "onnx" / "run.log").read_text()
    assert (tmp_path / "onnx" / "onnx-original" / "fp32").is_dir()


def test_uniform_ffn_run_saves_a_model_plain_transformers_loads(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """`uniform_ffn` under a FLOP budget: equal FFN widths in every layer, and plain transformers loads the saved
    model (through its shipped code) with the same logits as compressor's loader."""
    from transformers import AutoModelForSequenceClassification

    budget = {"kind": "flops", "value": 0.4, "seq_len": 16}
    recipe = _recipe(tmp_path, tiny_model_dir, tiny_csv, "uniform", budget, **{"prune.uniform_ffn": True})
    recipe = recipe.model_copy(update={"prune": recipe.prune.model_copy(update={"baseline": None})})
    report = run_recipe(recipe)
    widths = report["pruned"]["ffn_neurons_per_layer"]
    assert (
        len(set(widths)) == 1
        and widths[0] < report["original"]["ffn_neurons_per_layer"][0]
        and min(report["pruned"]["heads_per_layer"]) >= 1
    )
    model_dir = tmp_path / "uniform" / "model"
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = tok(["the film was great fun", "a dull and boring plot"], padding=True, return_tensors="pt")
    plain = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True).eval()
    with torch.inference_mode():
        assert torch.allclose(plain(**batch).logits, load_pruned(model_dir).eval()(**batch).logits, atol=1e-5)


def test_one_target_run_with_a_final_finetune_reports_it(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """`prune.member_finetune` on a one-target run: the model is trained once more before its surgery (the saved
    model still equals the masked one), and report.json / report.md say what it did."""
    member_ft = {"epochs": 2, "lr": 5e-4, "batch_size": 16, "max_examples": 64}
    recipe = _recipe(tmp_path, tiny_model_dir, tiny_csv, "final", {"kind": "flops", "value": 0.3, "seq_len": 16},
                     **{"prune.member_finetune": member_ft, "prune.baseline": None})  # fmt: skip
    report = run_recipe(recipe)
    ft = report["member_finetune"]
    assert ft["steps"] == 8 and ft["val_before"] == report["steps"][-1]["val_after_finetune"]
    assert report["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4
    md = (tmp_path / "final" / "report.md").read_text()
    assert "Final fine-tune (`prune.member_finetune`), validation accuracy: " in md
    assert "layer-drop baseline had the same" not in md  # `prune.baseline: null`: there is none


@pytest.mark.parametrize("graphs", [["fp32", "optimized", "int8"], ["fp32", "int8"]], ids=["optimized", "fp32"])
def test_original_int8_is_quantised_like_the_pruned_one(tmp_path, tiny_model_dir, tiny_csv, graphs):
    """The original an onnx-int8 budget is measured against: from the optimised graph exactly when the pruned
    model's int8 is, with the recipe's int8 options (here per-channel off, 7-bit weights, one excluded node), and
    behind the same validation gate (a quantised original is a choice `compressor pick` may return)."""
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification

    from compressor.deploy.export import MANIFEST
    from compressor.pipeline.measure import original_variants
    from compressor.pipeline.stages import RunState, export_original
    from compressor.sources import load_task_data
    from compressor.sources.batches import tokenize

    budget = {"kind": "speedup", "value": 1.5, "runtime": "onnx-int8", "batch_size": 4, "seq_len": 16}
    int8 = {"per_channel": False, "reduce_range": True, "exclude_nodes": ["/classifier/MatMul"]}
    export = {"variants": graphs, "int8": int8}
    recipe = _recipe(tmp_path, tiny_model_dir, tiny_csv, "run", budget, export=export, bench=BENCH)  # no quantize-only
    data, tokenizer = load_task_data(recipe.data), AutoTokenizer.from_pretrained(tiny_model_dir)
    splits = {name: tokenize(getattr(data, name), tokenizer, data.text_fields, 16) for name in ("train", "validation")}
    original = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, attn_implementation="eager")
    state = RunState(recipe, tmp_path, Accelerator(cpu=True), data, tokenizer, splits, original=original)
    assert original_variants(state) == ["int8"]  # a one-target run exports the original to the budget's runtime only
    assert set(export_original(state, ["int8"])) == {"int8"}
    built = json.loads((tmp_path / "onnx-original" / MANIFEST).read_text())
    assert built["int8"]["quantized_from"] == ("optimized" if "optimized" in graphs else "fp32")
    assert (built["int8"]["per_channel"], built["int8"]["reduce_range"]) == (False, True)
    assert built["int8"]["excluded_nodes"] == ["/classifier/MatMul"]
    assert built["int8"]["gate"]["split"] == "validation" and built["int8"]["status"] in ("accepted", "rejected")
