"""Post-training recovery: least-squares per-unit scales folded into the weights, the Fisher criterion, the
post-training recipe rules and a tiny end-to-end run."""

from __future__ import annotations

import copy
import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from conftest import make_tokenizer_dir, tiny_recipe

from compressor.core.errors import UserError
from compressor.deploy import export as ex
from compressor.pipeline.runner import run_recipe
from compressor.pruning.criteria import ScoreContext
from compressor.pruning.criteria.fisher import fisher
from compressor.pruning.masking import gated
from compressor.pruning.units import score_all
from compressor.recipe import PruneSpec, RecipeError, parse_recipe
from compressor.recovery import replay
from compressor.recovery import rescale as rescale_module
from compressor.recovery.loop import Masks
from compressor.recovery.rescale import post_training_sample, rescale
from compressor.surgery.arch import arch_spec, get_path, layers
from compressor.surgery.checkpoint import load_pruned, save_pruned
from compressor.testing import DISTINCT_ARCHS, tiny_batch, tiny_model

FIT = [tiny_batch(batch=8, seq=12, seed=s) for s in range(12)]


def _masks(model) -> Masks:
    """Uneven kept heads and neurons: layer 0 loses a head, layer 1 two, every third neuron goes."""
    masks = Masks.full(model, ("heads", "neurons"))
    masks.heads[0, 1] = False
    masks.heads[1, :2] = False
    masks.neurons[:, ::3] = False
    return masks


def _logits(model, batch, masks: Masks | None = None) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad(), gated(model, *((masks.head_gates(), masks.neuron_gates()) if masks else (None, None))):
        return model(**inputs).logits


@pytest.mark.parametrize("arch", DISTINCT_ARCHS)
def test_least_squares_recovers_known_scales(arch):
    """A reference whose W_O columns (per head) and down-projection columns (per neuron) are the model's times
    known scales: the fit finds those scales, so the folded weights equal the reference's."""
    model = tiny_model(arch)
    reference = copy.deepcopy(model)
    spec, g = arch_spec(model), torch.Generator().manual_seed(3)
    for layer in layers(reference):
        out, ffn = get_path(layer, spec.out_proj), get_path(layer, spec.ffn_out)
        heads = 0.5 + torch.rand(out.in_features // 8, generator=g)
        with torch.no_grad():
            out.weight *= heads.repeat_interleave(8)
            ffn.weight *= 0.5 + torch.rand(ffn.in_features, generator=g)
    full = Masks.full(model, ("heads", "neurons"))
    info = rescale(model, reference, full.alive(), FIT)
    for fitted, wanted in zip(layers(model), layers(reference), strict=True):
        for path in (spec.out_proj, spec.ffn_out):
            fit, want = get_path(fitted, path).weight, get_path(wanted, path).weight
            torch.testing.assert_close(fit, want, atol=2e-3, rtol=2e-3)
    assert all(e["status"] == "fit" and e["residual_after"] < 1e-5 < e["residual_before"] for e in info["layers"])
    torch.testing.assert_close(_logits(model, FIT[0]), _logits(reference, FIT[0]), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("arch", DISTINCT_ARCHS)
def test_folded_scales_masked_equals_pruned_equals_reloaded_equals_onnx(arch, tmp_path):
    """After the fit, the masked+scaled model, its physically pruned copy, that copy saved and reloaded, and its
    ONNX export give the same logits; the fit lowered every sublayer's residual and moved the logits towards the
    unpruned model's."""
    from transformers import AutoTokenizer

    model = tiny_model(arch)
    reference = copy.deepcopy(model)
    masks = _masks(model)
    check = tiny_batch(batch=5, seq=13, seed=11)
    before = _logits(model, check, masks)
    info = rescale(model, reference, masks.alive(), FIT)
    assert {e["kind"] for e in info["layers"]} == {"heads", "neurons"} and len(info["layers"]) == 6
    assert all(e["residual_after"] <= e["residual_before"] for e in info["layers"])
    assert any(e["residual_after"] < e["residual_before"] for e in info["layers"])
    masked = _logits(model, check, masks)
    assert not torch.allclose(masked, before)  # the scales are in the weights
    pruned = masks.pruned_copy(model)
    torch.testing.assert_close(_logits(pruned, check), masked, atol=1e-5, rtol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    model_dir = save_pruned(pruned, tmp_path / "model", tokenizer)
    torch.testing.assert_close(_logits(load_pruned(model_dir), check), masked, atol=1e-5, rtol=1e-5)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32"], [tiny_batch(4, 11, seed=s) for s in range(2)])
    session = ort.InferenceSession(result["fp32"]["file"], providers=["CPUExecutionProvider"])
    feed = {i.name: check.get(i.name, torch.zeros_like(check["input_ids"])).numpy() for i in session.get_inputs()}
    assert np.abs(session.run(["logits"], feed)[0] - masked.numpy()).max() <= 1e-4


@pytest.mark.parametrize("arch", DISTINCT_ARCHS)
def test_recording_with_stubbed_layers_gives_the_calls_of_a_real_forward(arch):
    """The rescale records later batches with the layers stubbed out: every layer's call arguments (masks, position
    bias, rotary tables) equal those a real forward passes on that batch."""
    model = tiny_model(arch).eval()
    batches = [tiny_batch(batch=4, seq=9 + s, seed=s) for s in range(3)]
    with torch.no_grad():
        recorded = replay.record(model, batches)
        for batch, calls in zip(batches[1:], recorded[1:], strict=True):
            real, _ = replay._record(model, batch)
            assert calls.check is None  # recorded without running the layers
            assert replay._equal(replay._args_of(calls), replay._args_of(real))
    assert all(layer.__dict__.get("forward") is None for layer in layers(model))  # the layers' forwards are back


@pytest.mark.parametrize("arch", DISTINCT_ARCHS)
def test_the_layer_after_its_neuron_fit_is_derived_not_rerun(arch, monkeypatch):
    """Per layer the pruned model runs once for the head fit and once for the neuron fit; its output after the fold
    comes from the neuron fit's pass (the architecture's `ffn_norm`), not a third run. (That it is what running the
    layer gives is `test_least_squares_recovers_known_scales`: later layers' scales are only found from right
    inputs.)"""
    model = tiny_model(arch)
    reference = copy.deepcopy(model)
    runs = []
    real = rescale_module.run_layer
    monkeypatch.setattr(rescale_module, "run_layer", lambda m, *a: runs.append(m is model) or real(m, *a))
    rescale(model, reference, _masks(model).alive(), FIT[:3])  # neurons gated off: the derived output sees that too
    assert sum(runs) == 2 * len(layers(model)) * 3 and len(runs) - sum(runs) == len(layers(model)) * 3


def test_ill_conditioned_fit_is_skipped_and_scales_stay_one():
    """With fewer rows than units (one example, first token only at the last layer), the Gram matrix is singular:
    the fit is skipped, logged as such, and the weights stay as they were."""
    model = tiny_model("bert", layers=2)
    reference = copy.deepcopy(model)
    weights = copy.deepcopy(model.state_dict())
    info = rescale(model, reference, _masks(model).alive(), [tiny_batch(batch=1, seq=6)])
    neurons = info["layers"][-1]
    assert neurons["kind"] == "neurons" and neurons["layer"] == 1 and neurons["first_token_only"]
    assert neurons["status"] == "skipped: ill-conditioned"
    ffn = arch_spec(model).ffn_out
    torch.testing.assert_close(get_path(layers(model)[1], ffn).weight, weights[f"bert.encoder.layer.1.{ffn}.weight"])


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_fisher_is_the_mean_squared_per_example_gate_gradient(arch):
    """One backward per batch gives what one backward per example gives; `labels: model` needs no labels."""
    model = tiny_model(arch)
    masks = Masks.full(model, ("heads", "neurons"))
    batches = [tiny_batch(4, 9, seed=s) for s in range(2)]
    scores = score_all("fisher", model, masks.alive(), batches)
    gates, total = torch.ones(3, 4, requires_grad=True), torch.zeros(3, 4)
    for batch in batches:
        for n in range(4):
            example = {k: v[n : n + 1] for k, v in batch.items()}
            label = example.pop("labels")
            with gated(model, gates):
                (grad,) = torch.autograd.grad(F.cross_entropy(model(**example).logits, label), gates)
            total += grad**2
    torch.testing.assert_close(scores["heads"], total / 8, rtol=1e-3, atol=1e-8)
    ctx = ScoreContext(model=model, alive=masks.heads, batches=batches, masks={"neurons": masks.neurons})
    assert not fisher(ctx).requires_grad  # no batch's graph is kept alive by the running sum
    unlabelled = [{k: v for k, v in b.items() if k != "labels"} for b in batches]
    free = score_all("fisher", model, masks.alive(), unlabelled)
    assert torch.isfinite(free["neurons"]).all() and (free["heads"] > 0).all()
    model_labels = score_all("fisher", model, masks.alive(), batches, {"labels": "model"})
    torch.testing.assert_close(free["heads"], model_labels["heads"])


def test_post_training_mode_on_a_model_not_task_tuned_is_refused():
    with pytest.raises(RecipeError, match=r"prune\.recovery: 'rescale' .* model\.task_tuned is false"):
        parse_recipe({"prune": {"recovery": "rescale"}})
    with pytest.raises(RecipeError, match=r"prune\.recovery: 'finetune' fine-tunes; .* finetune: null"):
        parse_recipe({"prune": {"recovery": "finetune", "finetune": None}})
    assert parse_recipe({"model": {"task_tuned": True}, "prune": {"recovery": "none"}}).prune.recovery_finetune is None


def test_sample_larger_than_the_training_split_names_both_numbers(task):
    _, _, train, _ = task
    with pytest.raises(UserError, match=r"^prune\.sample_size: 500 examples asked, but the training split has 96;"):
        post_training_sample(train, PruneSpec(recovery="rescale", sample_size=500), seed=0)
    assert len(post_training_sample(train, PruneSpec(recovery="rescale", sample_size=40), seed=0)) == 40
    assert len(post_training_sample(train, PruneSpec(sample_size=40), seed=0)) == 96  # fine-tuning: no sample


def test_rescale_run_end_to_end_trains_nothing_and_reports_the_fits(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """A tiny run with `recovery: rescale`: no step fine-tunes, each step logs its fits, the report carries the mode,
    the sample and per-sublayer residuals, and the saved model equals the masked one (the surgery check)."""
    out = tmp_path / "run"
    prune = {"criterion": {"name": "fisher"}, "target": 0.5, "steps": 1, "recovery": "rescale", "sample_size": 120}
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, out, prune=prune))
    report = run_recipe(recipe)
    step = report["steps"][0]
    assert "finetune" not in step and step["rescale"]["layers"] and "val_after_rescale" in step
    assert report["recovery"]["mode"] == "rescale" and report["recovery"]["sample_size"] == 120
    assert report["recovery"]["fits"][0]["layers"] == step["rescale"]["layers"]
    assert report["baseline"]["finetune"] is None  # the layer-drop baseline gets the same (no) training
    assert report["pruned"]["masked_vs_pruned_max_abs_diff"] < 1e-4
    assert "Recovery: `rescale` on a sample of 120 training examples" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["recovery"]["mode"] == "rescale"
    step_line = next(line for line in (out / "run.log").read_text().splitlines() if "step 1/1:" in line)
    assert "val acc after prune" in step_line and "fine-tune" not in step_line  # the step trained nothing


def test_unlabelled_training_text_runs_a_post_training_mode(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """`data.train_labels: false`: the training split is read without labels, the sample is labelled by the
    unpruned model's own predictions, and a rescale run finishes; a mode that trains is refused up front."""
    from compressor.sources import load_task_data

    out = tmp_path / "run"
    prune = {"criterion": {"name": "fisher", "params": {"labels": "model"}}, "target": 0.5, "steps": 1,
             "recovery": "rescale", "sample_size": 100, "baseline": None}  # fmt: skip
    raw = tiny_recipe(tiny_model_dir, tiny_csv, out, prune=prune, **{"model.task_tuned": True})
    raw["data"] = {**raw["data"], "train_labels": False}
    recipe = parse_recipe(raw)
    assert "label" not in load_task_data(recipe.data).train.column_names
    report = run_recipe(recipe)
    assert report["steps"][0]["rescale"]["layers"] and report["recovery"]["mode"] == "rescale"
    raw["prune"] = {**prune, "recovery": "finetune"}
    with pytest.raises(RecipeError, match=r"data\.train_labels: false .* needs model\.task_tuned: true"):
        parse_recipe(raw)


def test_the_frontier_marks_members_made_without_training():
    """A member's frontier row carries the run's recovery mode (the original's and baselines' rows do not), and a
    family report's frontier table names it."""
    from compressor.bench.frontier import Point, frontier
    from compressor.report.family import _frontier_table

    def cand(accuracy: float, speed: float) -> dict:
        return {"accuracy": accuracy, "speedup": {"64": {"32": speed}}, "headline_seq_len": 64,
                "headline_batch": 32, "headline_speedup": speed}  # fmt: skip

    summary = {"pytorch-original": cand(0.83, 1.0), "1.5x/pytorch": cand(0.82, 1.5), "1.5x/layer-drop": cand(0.8, 1.5)}
    points = [Point("pytorch-original", "original", "original", "pytorch", None),
              Point("1.5x/pytorch", "1.5x", "member", "pytorch", "members/1.5x/model"),
              Point("1.5x/layer-drop", "1.5x", "baseline", "pytorch", None)]  # fmt: skip
    rows = {r["name"]: r for r in frontier(summary, points, 32, "rescale")}
    assert rows["1.5x/pytorch"]["recovery"] == "rescale"
    assert rows["pytorch-original"]["recovery"] is None and rows["1.5x/layer-drop"]["recovery"] is None
    table = "\n".join(_frontier_table(list(rows.values())))
    assert "| 1.5x (rescale, no training) | pytorch |" in table and "| original | pytorch |" in table
