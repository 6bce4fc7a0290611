"""Residual width (`prune.units: [..., hidden]`): one kept channel set for the whole stream. Masked (every stream
LayerNorm over the kept channels) == pruned == reloaded (compressor and plain transformers) == ONNX for every
architecture that accepts it; the others, and bad recipes, are refused in one line; a tiny run narrows step by step,
saves a model that reloads, and resumes."""

from __future__ import annotations

import copy
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tokenizer_dir, tiny_recipe
from test_export import int8_tol, labelled_by
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from compressor.core import outdir
from compressor.deploy import export as ex
from compressor.pipeline.runner import run_recipe
from compressor.pruning.masking import gated
from compressor.pruning.units import Masks
from compressor.pruning.width import check_width, narrow, width_at
from compressor.recipe import RecipeError, dump_recipe, parse_recipe
from compressor.surgery.arch import present_hidden
from compressor.surgery.checkpoint import load_pruned, save_pruned
from compressor.surgery.slicing import prune_heads
from compressor.surgery.width import WidthError, prune_hidden, width_refusal
from compressor.testing import ARCHS, randomize, tiny_batch, tiny_model

CUTTABLE = [arch for arch in ARCHS if width_refusal(tiny_model(arch).config) is None]
REFUSED = [arch for arch in ARCHS if arch not in CUTTABLE]


def _inputs(model, batch: dict) -> dict:
    return {name: batch[name] for name in ex.graph_inputs(model) if name in batch}


def _logits(model, batch: dict, hidden: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad(), gated(model, None, None, hidden):
        return model(**_inputs(model, batch)).logits


def _keep(width: int, drop: int, seed: int = 0) -> torch.Tensor:
    keep = torch.ones(width, dtype=torch.bool)
    keep[torch.randperm(width, generator=torch.Generator().manual_seed(seed))[:drop]] = False
    return keep


def test_the_architectures_that_cut_width_are_the_post_norm_ones():
    """BERT-like, MPNet and DistilBERT cut; pre-norm ModernBERT and DeBERTa (a second stream) are refused."""
    assert {"bert", "roberta", "mpnet", "distilbert"} <= set(CUTTABLE)
    assert set(REFUSED) == {"deberta-v2", "modernbert"}


@pytest.mark.parametrize("arch", CUTTABLE)
def test_masked_equals_pruned_equals_reloaded_equals_onnx(arch, tmp_path):
    """Half the channels cut (with uneven heads first): the masked model, the cut one, `load_pruned`, plain
    transformers with the shipped modeling file and the ONNX export give the same logits; the full model differs."""
    model = randomize(prune_heads(tiny_model(arch), {0: [1], 2: [0, 3]}))
    keep = _keep(model.config.hidden_size, model.config.hidden_size // 2)
    batch = tiny_batch(batch=3, seq=9)
    masked, full = _logits(model, batch, keep), _logits(model, batch)
    cut = prune_hidden(copy.deepcopy(model), (~keep).nonzero().flatten().tolist())
    assert present_hidden(cut) == keep.nonzero().flatten().tolist()
    assert cut.get_input_embeddings().embedding_dim == int(keep.sum())
    pruned = _logits(cut, batch)
    assert (masked - pruned).abs().max() <= 1e-5 and (full - masked).abs().max() > 1e-2
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    model_dir = save_pruned(cut, tmp_path / "model", tokenizer)
    assert (_logits(load_pruned(model_dir, attn_implementation="eager"), batch) - pruned).abs().max() <= 1e-5
    plain = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True).eval()
    assert (_logits(plain, batch) - pruned).abs().max() <= 1e-5
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32"], [batch])
    assert result["fp32"]["max_abs_diff"] <= 1e-4
    onnx_logits = ex.OnnxClassifier(tmp_path / "onnx" / "fp32")(batch)
    assert np.abs(onnx_logits - pruned.numpy()).max() <= 1e-4


@pytest.mark.parametrize("arch", ["bert", "mpnet", "distilbert"])
def test_a_model_with_a_removed_layer_and_an_empty_attention_cuts_exactly(arch, tmp_path):
    """Layers removed whole (a parameterless identity with a marker) and a layer without heads keep the cut exact
    and reload."""
    from compressor.surgery.slicing import remove_layers

    model = remove_layers(prune_heads(randomize(tiny_model(arch)), {0: [0, 1, 2, 3]}), [1])
    keep = _keep(32, 12, seed=3)
    batch = tiny_batch()
    cut = prune_hidden(copy.deepcopy(model), (~keep).nonzero().flatten().tolist())
    assert (_logits(model, batch, keep) - _logits(cut, batch)).abs().max() <= 1e-5
    model_dir = save_pruned(cut, tmp_path / "model")
    assert (_logits(load_pruned(model_dir, attn_implementation="eager"), batch) - _logits(cut, batch)).abs().max() == 0


def test_cuts_compose_and_replay_idempotently():
    """Two cuts by original ids equal one cut by their union; replaying a cut changes nothing."""
    model = randomize(tiny_model("bert"))
    batch = tiny_batch()
    twice = prune_hidden(prune_hidden(copy.deepcopy(model), [0, 5, 9]), [5, 9, 20, 31])
    once = prune_hidden(copy.deepcopy(model), [0, 5, 9, 20, 31])
    assert (_logits(twice, batch) - _logits(once, batch)).abs().max() == 0
    assert present_hidden(prune_hidden(twice, [0, 20])) == present_hidden(once)


@pytest.mark.parametrize("arch", REFUSED)
def test_an_architecture_that_cannot_cut_width_is_refused_in_one_line(arch):
    model = tiny_model(arch)
    with pytest.raises(WidthError, match=r"^prune\.units: 'hidden' cannot be cut here: .+") as err:
        prune_hidden(model, [0])
    assert "\n" not in str(err.value)
    spec = parse_recipe(tiny_recipe("m", "d.csv", "out", prune=_prune(hidden_size=16))).prune
    with pytest.raises(RecipeError, match=r"^prune\.units: 'hidden' cannot be cut on this model"):
        check_width(model.config, spec)


def test_bad_cuts_are_refused_before_any_change():
    model = tiny_model("bert")
    before = copy.deepcopy(model.state_dict())
    for remove, text in (([32], "out of range"), (list(range(32)), "at least one")):
        with pytest.raises(WidthError, match=text):
            prune_hidden(model, remove)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _prune(**extra) -> dict:
    finetune = {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 96}
    base = {"criterion": {"name": "taylor"}, "target": 0.5, "steps": 2, "score_examples": 64,
            "units": ["heads", "hidden"], "hidden_multiple": 8, "finetune": finetune}  # fmt: skip
    return {**base, **extra}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"hidden_size": 20}, r"^recipe: prune\.hidden_multiple: 8 does not divide hidden_size 20"),
        ({"hidden_size": None}, r"^recipe: prune\.hidden_size: units include 'hidden'; expected the residual width"),
        (
            {"hidden_size": None, "target": None, "allocation": "ratio", "budget": {"kind": "flops", "value": 0.3}},
            r"^recipe: prune\.hidden_size: .*or null with allocation 'measured' under a flops or speedup budget",
        ),
        ({"hidden_size": 16, "units": ["heads"]}, r"^recipe: prune\.hidden_size: only applies when"),
        ({"hidden_size": 16, "recovery": "rescale", "finetune": None}, r"^recipe: prune\.recovery: units 'hidden' are"),
    ],
)
def test_bad_width_recipes_name_the_field(extra, message):
    with pytest.raises(RecipeError, match=message) as err:
        parse_recipe(tiny_recipe("m", "d.csv", "out", prune=_prune(**extra)))
    assert "\n" not in str(err.value)


def test_a_width_above_the_models_is_refused_before_anything_is_written(tmp_path, tiny_model_dir, tiny_csv):
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "run", prune=_prune(hidden_size=32)))
    with pytest.raises(RecipeError, match=r"^prune\.hidden_size: 32 is not below the model's width 32"):
        run_recipe(recipe)
    assert not (tmp_path / "run").exists()


def test_width_schedule_lands_on_the_grid_and_the_target():
    assert [width_at(768, 384, 64, goal, 4) for goal in range(4)] == [640, 576, 512, 384]
    assert [width_at(32, 16, 8, goal, 2) for goal in range(2)] == [24, 16]
    assert width_at(768, 384, 64, 5, 4) == 384


def test_narrow_keeps_the_best_scored_channels_and_never_brings_one_back():
    masks = Masks.full(tiny_model("bert"), ["heads", "hidden"])
    scores = torch.arange(32, dtype=torch.float)
    first, removed = narrow(masks, scores, 24)
    assert first.width() == 24 and removed == list(range(8)) and masks.width() == 32
    second, _ = narrow(first, torch.flip(scores, [0]), 16)  # the low ids score best now, but are gone
    assert second.width() == 16 and not bool(second.hidden[:8].any())


def test_a_tiny_run_narrows_step_by_step_saves_exactly_and_resumes(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """Units heads + hidden to 16 of 32 channels in two steps: the log shows 24 then 16; the saved model is 16 wide,
    equals the masked one, exports, reloads; a run resumed after step 1 ends where the uninterrupted one ends."""
    prune = _prune(hidden_size=16)
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "ref", prune=prune,
                                      export={"variants": ["fp32"]}))  # fmt: skip
    report = run_recipe(recipe)
    assert [s["hidden_size"] for s in report["steps"]] == [24, 16]
    assert (report["original"]["hidden_size"], report["pruned"]["hidden_size"]) == (32, 16)
    assert "| residual width | 32 | 16 |" in (tmp_path / "ref" / "report.md").read_text()
    assert report["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4
    assert report["export"]["fp32"]["max_abs_diff"] <= 1e-4
    reloaded = load_pruned(tmp_path / "ref" / "model")
    assert len(present_hidden(reloaded)) == 16 and reloaded.get_input_embeddings().embedding_dim == 16
    resumed_recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "resumed", prune=prune,
                                              export={"variants": ["fp32"]}))  # fmt: skip
    out = tmp_path / "resumed"
    outdir.claim(outdir.check_run_dir(str(out), False, lambda _: True), dump_recipe(resumed_recipe))
    outdir.finish(out)
    shutil.copytree(tmp_path / "ref" / "state" / "step_000", out / "state" / "step_000")
    resumed = run_recipe(resumed_recipe)
    assert "resuming after step 1" in (out / "run.log").read_text()
    assert present_hidden(load_pruned(out / "model")) == present_hidden(reloaded)
    assert resumed["pruned"]["test"] == pytest.approx(report["pruned"]["test"], abs=1e-6)


# OpenVINO is an optional extra (`compressor[openvino]`): the floor stack (`make test-compat`) runs without it, where
# test_openvino.py checks the one-line skip instead.
_OPENVINO = pytest.param(
    "openvino-int8",
    marks=pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed"),
)


@pytest.mark.parametrize("int8_variant", ["int8", _OPENVINO])
@pytest.mark.parametrize("arch", ["bert", "mpnet"])
def test_a_width_cut_model_passes_the_int8_gate(arch, int8_variant, tmp_path):
    """The narrowed model quantised by ONNX Runtime (`int8`) and by NNCF (`openvino-int8`): gated, and within the
    deviation the int8 grids themselves imply (`int8_tol`, the same on any CPU)."""
    model = randomize(prune_heads(tiny_model(arch), {1: [2]}))
    cut = prune_hidden(model, list(range(0, 32, 2)))
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    model_dir = save_pruned(cut, tmp_path / "model", tokenizer)
    calibration = [tiny_batch(batch=16, seq=11, seed=s) for s in range(40, 44)]
    check = [tiny_batch(batch=4, seq=11, seed=s) for s in range(3)]
    validation = labelled_by(model_dir, [tiny_batch(batch=16, seq=11, seed=s) for s in range(20, 24)])
    int8 = ex.Int8Options(calibration=calibration, validation=validation, max_drop=0.5)
    result = ex.export_onnx(model_dir, tmp_path / "onnx", ["fp32", int8_variant], check, int8=int8)
    assert "passed" in result[int8_variant]["gate"]
    assert 0 < result[int8_variant]["max_abs_diff"] <= int8_tol(model_dir, check, calibration)


def _width_table(dims_or_config, runtime, batch_size, seq_len, **kwargs):
    """A known latency table whose every millisecond scales with the residual width (layer = (1 + heads/10 +
    neurons/20) × width/32, outside 0.5 × width/32), instead of timing one in a unit test."""
    from compressor.pruning.latency import Dims, LatencyTable

    dims = dims_or_config if isinstance(dims_or_config, Dims) else Dims.from_config(dims_or_config)
    scale = dims.hidden / 32
    heads, neurons = [0, dims.heads], [0, dims.intermediate]
    grid = [[scale * (1 + h / 10 + n / 20) for n in neurons] for h in heads]
    return LatencyTable(runtime, batch_size, seq_len, 1, dims, heads, neurons, grid, outside_ms=0.5 * scale)


def test_a_speedup_budget_prices_each_scheduled_width_with_its_own_table(monkeypatch):
    """Units 'hidden' under a speed-up budget: one table per scheduled width, and a model narrowed to 16 of 32
    channels is predicted exactly as much faster as that width's table says against the full-width original."""
    from compressor.pruning import budget as budget_mod

    monkeypatch.setattr(budget_mod, "load_or_build", _width_table)
    model = tiny_model("bert")
    prune = _prune(hidden_size=16, units=["heads", "neurons", "hidden"], target=None,
                   budget={"kind": "speedup", "value": 1.5, "batch_size": 4, "seq_len": 16})  # fmt: skip
    spec = parse_recipe(tiny_recipe("m", "d.csv", "out", prune=prune)).prune
    budget = budget_mod.plan_budget(model, spec)
    assert sorted(budget.narrow) == [16, 24] and budget.narrow[16].dims.head_size == 8
    full = Masks.full(model, spec.units)
    half = full.narrowed(torch.arange(32) < 16)
    assert budget.predicted_speedup(full) == pytest.approx(1.0)
    assert budget.predicted_speedup(half) == pytest.approx(2.0)  # every millisecond scales with the width here
    assert budget.cost(half) == pytest.approx(budget.cost(full) / 2)


def narrowed_slice(out: Path, source: str, hidden_size: int, lr: float) -> dict:
    """A run on a slice of Rotten Tomatoes that removes a quarter of `source`'s heads and cuts its residual stream to
    `hidden_size` in one step, with ONNX fp32 and gated int8 exports; its report."""
    prune = {"criterion": {"name": "taylor"}, "target": 0.25, "steps": 1, "score_examples": 32,
             "units": ["heads", "hidden"], "hidden_size": hidden_size, "baseline": None,
             "finetune": {"epochs": 1, "lr": lr, "max_examples": 64}}  # fmt: skip
    recipe = {
        "name": "width_slice",
        "output_dir": str(out),
        "model": {"source": source, "task_tuned": False},
        "data": {"max_length": 32, "max_train_examples": 192, "max_eval_examples": 64},
        "base_finetune": {"epochs": 1, "lr": lr, "batch_size": 32},
        "prune": prune,
        "export": {"variants": ["fp32", "int8"], "int8": {"calibration_examples": 32}},
        "bench": {"enabled": False},
        "analysis": {"enabled": False},
    }
    return run_recipe(parse_recipe(recipe))


def check_narrowed_slice(report: dict, model_dir: Path, widths: tuple[int, int]) -> None:
    """The saved model equals the masked one and its ONNX fp32 export, int8 is gated, and plain transformers (the
    shipped code) and compressor load it at the kept width with the same logits."""
    assert (report["original"]["hidden_size"], report["pruned"]["hidden_size"]) == widths
    assert report["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4
    assert report["export"]["fp32"]["max_abs_diff"] <= 1e-4 and "gate" in report["export"]["int8"]
    plain = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True).eval()
    ours = load_pruned(model_dir)
    assert len(present_hidden(ours)) == widths[1]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = dict(tokenizer(["a gorgeous, witty film", "tedious and overlong"], padding=True, return_tensors="pt"))
    with torch.no_grad():
        assert torch.allclose(plain(**batch).logits, ours(**batch).logits, atol=1e-5)


def test_the_demo_model_narrows_to_256_channels_end_to_end(tmp_path, cache_dir):
    """MiniLM-L6 (the demo's built-in) with its 384 channels cut to 256 in one step (`check_narrowed_slice`)."""
    report = narrowed_slice(tmp_path / "out", "builtin:minilm-l6", 256, 1e-4)
    check_narrowed_slice(report, tmp_path / "out" / "model", (384, 256))


def test_a_narrowed_model_is_timed_as_deployed_with_its_own_width():
    """The copy the bench and the budget check time (SDPA attention, rebuilt from the config) keeps the cut."""
    from compressor.pruning.deployed import as_deployed

    model = randomize(prune_heads(tiny_model("bert"), {0: [1]}))
    cut = prune_hidden(model, list(range(8)))
    fast = as_deployed(cut)
    assert present_hidden(fast) == present_hidden(cut) and fast.get_input_embeddings().embedding_dim == 24
    batch = tiny_batch()
    assert (_logits(fast, batch) - _logits(cut, batch)).abs().max() <= 1e-5


@pytest.mark.slow
def test_a_speedup_budget_run_with_width_measures_and_narrows(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """A speed-up budget with heads, neurons and width, its tables and its calibration measured for real on
    PyTorch: the run narrows 32 → 24 → 16, every step is priced and timed, and the saved model equals the masked."""
    budget = {"kind": "speedup", "value": 1.3, "batch_size": 4, "seq_len": 16}
    prune = _prune(hidden_size=16, units=["heads", "neurons", "hidden"], target=None, budget=budget, baseline=None)
    report = run_recipe(parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "run", prune=prune)))
    assert [s["hidden_size"] for s in report["steps"]][:2] == [24, 16]
    assert all(s["predicted_speedup"] > 0 and s["measured_speedup"] > 0 for s in report["steps"])
    assert report["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4 and report["pruned"]["hidden_size"] == 16


@pytest.mark.e2e
def test_a_family_with_width_saves_each_member_at_its_own_width(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """Two FLOP targets with heads, neurons and width (32 → 24 → 16): each member is saved at the width its step
    kept, with a member's last fine-tune on its narrowed copy; the members table shows the widths; every member's
    saved model exports at ONNX parity."""
    finetune = {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 96}
    prune = _prune(hidden_size=16, units=["heads", "neurons", "hidden"], target=None,
                   budget={"kind": "flops", "values": [0.2, 0.4], "seq_len": 16},
                   member_finetune={**finetune, "max_examples": 64})  # fmt: skip
    bench = {"batch_sizes": [1], "seq_len": 16, "rounds": 2, "warmup": 1, "min_time_s": 0.01, "quantize_only": [],
             "max_drop": None}  # fmt: skip
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "fam", prune=prune,
                                      export={"variants": ["fp32"]}, bench=bench))  # fmt: skip
    report = run_recipe(recipe)
    members = report["family"]["members"]
    assert [m["pruned"]["hidden_size"] for m in members] == [24, 16]
    for member in members:
        assert member["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4
        assert member["export"]["fp32"]["max_abs_diff"] <= 1e-4
        saved = load_pruned(tmp_path / "fam" / "members" / member["label"] / "model")
        assert len(present_hidden(saved)) == member["pruned"]["hidden_size"]
    md = (tmp_path / "fam" / "report.md").read_text()
    assert "| heads | width | FFN neurons |" in md


def test_hidden_state_distillation_matches_a_narrowed_student_on_the_teachers_same_channels():
    """With `distill.hidden_weight`, a width-cut student's hidden states are compared with the teacher's at the
    channels it kept (without that, the shapes disagree and the loss raises)."""
    from compressor.recipe import DistillSpec
    from compressor.recovery.distill import INDEX_COLUMN, TeacherTargets, mixed_loss

    teacher = randomize(tiny_model("bert")).eval()
    student = prune_hidden(copy.deepcopy(teacher), list(range(16, 32)))
    batch = {**tiny_batch(), INDEX_COLUMN: torch.arange(3)}
    inputs = _inputs(student, batch)
    spec = DistillSpec(alpha=0.0, temperature=1.0, hidden_weight=1.0)
    targets = TeacherTargets(torch.zeros(3, 2), spec, teacher)
    loss = mixed_loss(student, inputs, batch, targets)  # shapes agree: the teacher's kept channels
    assert torch.isfinite(loss) and loss > 0  # the LayerNorms see fewer channels: the states differ, finitely


def _narrowed_speedup_budget(monkeypatch, hidden_size: int | None = 16, value: float = 3.0):
    """A speed-up budget over the tiny BERT with heads, neurons and width on `_width_table`s (every millisecond
    scales with the width), its spec, and the model's masks narrowed to 16 of 32 channels (predicted 2.0x)."""
    from compressor.pruning import budget as budget_mod

    monkeypatch.setattr(budget_mod, "load_or_build", _width_table)
    model = tiny_model("bert")
    prune = _prune(hidden_size=hidden_size, units=["heads", "neurons", "hidden"], target=None,
                   budget={"kind": "speedup", "value": value, "batch_size": 4, "seq_len": 16})  # fmt: skip
    spec = parse_recipe(tiny_recipe("m", "d.csv", "out", prune=prune)).prune
    budget = budget_mod.plan_budget(model, spec)
    return model, spec, budget, Masks.full(model, spec.units).narrowed(torch.arange(32) < 16)


def _units_removed(alive) -> float:
    """A stand-in loss: every unit removed costs the same."""
    return float(sum(int((~mask).sum()) for mask in alive.values()))


def test_the_measured_allocation_prices_a_narrowed_stream_with_its_own_widths_table(monkeypatch):
    """A step on a stream already narrowed to 16 channels (2.0x on its table) aiming at 3x removes what 3x needs at
    that width. Priced with the full-width table instead, the model looked unnarrowed (1.0x), the step removed what
    3x needs from there and landed far past its target."""
    from compressor.pruning.allocation import select_measured

    _, _, budget, half = _narrowed_speedup_budget(monkeypatch)
    assert budget.predicted_speedup(half) == pytest.approx(2.0)
    torch.manual_seed(0)
    scores = {kind: torch.rand(mask.shape) for kind, mask in half.items()}
    selection = select_measured(budget, 1, scores, half, _units_removed, parts=2)
    after = half.without(selection.plan)
    assert selection.hidden is None and after.width() == 16  # a named width: the allocation never narrows
    assert budget.aim(1) <= budget.predicted_speedup(after) < 1.15 * budget.aim(1)


def test_a_budget_with_narrow_tables_refuses_to_price_what_has_lost_its_width(monkeypatch):
    """Where the budget measured narrower widths, a plain `{kind: mask}` copy of narrowed masks (the bug class that
    once priced a narrowed stream at full width) and a width it never measured are refused, not priced at the full
    width's table; `Masks` at a measured width and at full width are priced."""
    _, _, budget, half = _narrowed_speedup_budget(monkeypatch)
    with pytest.raises(TypeError, match="pass Masks"):
        budget.predicted_speedup(dict(half.items()))
    odd = half.narrowed(torch.arange(32) < 12)
    with pytest.raises(ValueError, match="no latency table at residual width 12"):
        budget.predicted_speedup(odd)
    assert budget.predicted_speedup(half) == pytest.approx(2.0)
    assert budget.predicted_speedup(half.narrowed(torch.ones(32, dtype=torch.bool))) == pytest.approx(1.0)


def test_an_allocated_width_is_priced_at_every_width_of_its_grid(monkeypatch):
    """`hidden_size: null`: a table at every width the grid offers (24, 16, 8 of 32), and each slice may offer the
    stream one grid step narrower, down to one multiple."""
    from compressor.pruning.width import offered_width, width_grid

    _, spec, budget, _ = _narrowed_speedup_budget(monkeypatch, hidden_size=None)
    assert sorted(budget.narrow) == [8, 16, 24] == sorted(width_grid(32, None, 8))
    assert [offered_width(w, 32, None, 8) for w in (32, 24, 16, 8)] == [24, 16, 8, None]
    assert width_grid(768, 384, 64) == [704, 640, 576, 512, 448, 384]


@pytest.mark.parametrize(("narrowing_costs", "narrows"), [(0.0, True), (100.0, False)])
def test_an_allocated_width_narrows_only_where_it_costs_least_loss_per_millisecond(monkeypatch, narrowing_costs,
                                                                                   narrows):  # fmt: skip
    """With the width offered as a kind: a narrower stream that costs no measured loss is taken (a grid step per
    slice, the lowest-scored channels, logged with its width) and the step lands on its goal; one that costs far
    more than removing units is left alone, and heads and neurons pay for the step."""
    from compressor.pruning.allocation import select_measured
    from compressor.pruning.width import width_narrower

    _, _, budget, _ = _narrowed_speedup_budget(monkeypatch, hidden_size=None, value=2.0)
    full = Masks.full(tiny_model("bert"), ["heads", "neurons", "hidden"])
    torch.manual_seed(0)
    scores = {kind: torch.rand(mask.shape) for kind, mask in full.items()}
    channels = torch.arange(32, dtype=torch.float)  # the low ids score least

    def loss(alive) -> float:
        return _units_removed(alive) + narrowing_costs * (32 - alive.width())

    selection = select_measured(budget, 1, scores, full, loss, parts=2, narrower=width_narrower(channels, 8))
    after = selection.apply(full)
    assert budget.predicted_speedup(after) >= budget.aim(1)
    kinds = [entry["kind"] for entry in selection.log]
    if narrows:
        assert "hidden" in kinds and selection.hidden is not None and after.width() < 32
        assert not bool(after.hidden[: 32 - after.width()].any())  # the lowest-scored channels went
        assert [e["width"] for e in selection.log if e["kind"] == "hidden"][0] == 24
    else:
        assert "hidden" not in kinds and selection.hidden is None and after.width() == 32
        assert selection.plan["heads"] or selection.plan["neurons"]


def test_an_allocated_width_beyond_the_grid_is_refused_in_one_line():
    spec = parse_recipe(tiny_recipe("m", "d.csv", "out", prune=_prune(
        hidden_size=None, hidden_multiple=32, target=None, budget={"kind": "flops", "value": 0.3}))).prune  # fmt: skip
    with pytest.raises(RecipeError, match=r"^prune\.hidden_multiple: 32 leaves no width below the model's 32"):
        check_width(tiny_model("bert").config, spec)


def test_a_tiny_run_with_an_allocated_width_saves_the_width_its_steps_chose(tmp_path, tiny_model_dir, tiny_csv,
                                                                           cache_dir, monkeypatch):  # fmt: skip
    """A FLOP budget with heads, neurons and an allocated width, where the measured loss makes a narrower stream
    the cheapest kind (a stand-in for the loss passes: every removed unit costs one, a channel nothing): the steps
    narrow a grid step per slice, log the width each kept, and the saved model has the last one and equals the
    masked model and its ONNX export."""
    from compressor.recovery import choice

    monkeypatch.setattr(choice, "_loss", lambda loop, kept: _units_removed)
    prune = _prune(hidden_size=None, units=["heads", "neurons", "hidden"], target=None, allocation_parts=1,
                   budget={"kind": "flops", "values": [0.3, 0.5], "seq_len": 16})  # fmt: skip
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "run", prune=prune,
                                      export={"variants": ["fp32"]}))  # fmt: skip
    report = run_recipe(recipe)
    widths = [s["hidden_size"] for s in report["steps"]]
    assert widths == [24, 16]  # one slice a step, each a grid step down
    assert all(s["allocation"][0] == {**s["allocation"][0], "kind": "hidden"} for s in report["steps"])
    assert [m["pruned"]["hidden_size"] for m in report["family"]["members"]] == [24, 16]
    for member in report["family"]["members"]:
        assert member["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4
        assert member["export"]["fp32"]["max_abs_diff"] <= 1e-4
        saved = load_pruned(tmp_path / "run" / "members" / member["label"] / "model")
        assert len(present_hidden(saved)) == member["pruned"]["hidden_size"]
