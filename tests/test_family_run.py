"""One run, a family of models (`prune.budget.values`): the schedule through every target, the members saved on the
way (masked == saved == reloaded == ONNX), the frontier and `compressor pick`, and resume in the middle of a family."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from conftest import tiny_recipe
from safetensors.torch import load_file
from test_budget_run import BENCH, FINETUNE, UNITS, linear_table  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from compressor.cli import app
from compressor.deploy.inference import OnnxClassifier
from compressor.pipeline.runner import run_recipe
from compressor.pruning import budget as budget_mod
from compressor.pruning.masking import gated
from compressor.pruning.selection import family_amounts
from compressor.recipe import RecipeError, parse_recipe
from compressor.recovery.train import model_inputs
from compressor.sources.batches import sample_batches, tokenize
from compressor.surgery.checkpoint import load_pruned


def test_family_amounts_reach_every_target_exactly():
    """Steps are shared by each segment's length on its scale, every target is one step's goal exactly, and goals
    rise monotonically; more targets than steps get one step each."""
    goals, ends = family_amounts([1.5, 2.0, 3.0, 4.0], 8, "speedup")
    assert len(goals) == 8 and [goals[i] for i in ends] == [1.5, 2.0, 3.0, 4.0]
    assert all(b > a for a, b in zip([1.0, *goals], goals, strict=False))
    ratios = [b / a for a, b in zip([1.0, *goals], goals, strict=False)]
    assert max(ratios) / min(ratios) < 1.25  # no segment rushed: similar relative gain per step
    goals, ends = family_amounts([0.25, 0.5, 0.75], 2, "linear")
    assert goals == [0.25, 0.5, 0.75] and ends == [0, 1, 2]
    goals, ends = family_amounts([0.2, 0.6], 4, "geometric")
    assert ends[-1] == 3 and goals[ends[0]] == 0.2 and goals[-1] == 0.6


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"kind": "speedup", "values": [2.0, 1.5]}, "values: expected distinct targets in ascending order"),
        ({"kind": "speedup", "values": [0.5, 2.0]}, "values: for kind 'speedup' expected a speed-up factor above 1"),
        ({"kind": "heads", "values": [0.25, 1.5]}, "values: for kind 'heads' expected a fraction removed"),
        ({"kind": "speedup", "values": [1.5, 2.0], "value": 3.0}, "value: 3.0 is not the last of values"),
        ({"kind": "speedup", "values": []}, "values"),
    ],
)
def test_bad_family_budgets_are_refused_in_one_line(budget, message):
    with pytest.raises(RecipeError, match=message) as err:
        parse_recipe({"prune": {"units": ["heads", "neurons"], "budget": budget}})
    assert "\n" not in str(err.value)


def test_one_value_keeps_the_single_target_schedule():
    """`values: [v]` is exactly `value: v`: same goals, one member at the last step."""
    for budget in ({"kind": "speedup", "value": 3.0}, {"kind": "speedup", "values": [3.0]}):
        spec = parse_recipe({"prune": {"units": ["heads", "neurons"], "budget": budget, "steps": 6}}).prune
        goals, members = budget_mod._goals(spec, 100)
        assert goals == pytest.approx([3.0 ** ((k + 1) / 6) for k in range(6)]) and members == {5: 3.0}
    spec = parse_recipe({"prune": {"target": 0.5, "steps": 3}}).prune
    assert budget_mod._goals(spec, 72) == ([12.0, 24.0, 36.0], {2: 0.5})


def _speed_budget(goals, members, speed: float, top_ups: int = 2):
    """A Budget whose masks are expected at `speed` whatever they are (what `closing`/`next_index` read)."""
    spec = parse_recipe(
        {"prune": {"units": ["heads", "neurons"], "budget": {"kind": "speedup", "values": sorted(members.values())}}}
    ).prune
    budget = budget_mod.Budget(None, spec, goals, None, 0, members=members)
    budget.expected_speedup = lambda alive: speed  # type: ignore[method-assign]
    return budget


def test_a_short_target_takes_top_ups_then_closes_and_met_goals_are_skipped():
    goals, members = [1.2, 1.5, 1.7, 2.0], {1: 1.5, 3: 2.0}
    short = _speed_budget(goals, members, speed=1.45)
    assert short.closing(1, 1, [], {}) == [] and short.next_index(1, [], {}) == 1  # a top-up at 1.5x
    assert short.closing(1, 3, [], {}) == [1.5]  # top-ups spent: the member is taken as it is
    assert short.next_index(1, [1.5], {}) == 2
    close = _speed_budget(goals, members, speed=1.48)  # within SPEEDUP_SLACK (2%) below 1.5x: met, no top-up
    assert close.closing(1, 1, [], {}) == [1.5] and close.next_index(1, [1.5], {}) == 2
    ahead = _speed_budget(goals, members, speed=1.8)
    assert ahead.closing(1, 1, [], {}) == [1.5]  # met (and beyond): closed, and 1.7x is skipped
    assert ahead.next_index(1, [1.5], {}) == 3
    done = _speed_budget(goals, members, speed=2.05)
    assert done.closing(1, 1, [], {}) == [1.5, 2.0] and done.next_index(1, [1.5, 2.0], {}) is None


def _family_recipe(tmp_path, model_dir, data, name, budget, **overrides):
    prune = {**UNITS, "steps": 4, "budget": budget, "finetune": FINETUNE}
    return parse_recipe(tiny_recipe(model_dir, data, tmp_path / name, prune=prune, **overrides))


def test_family_run_saves_each_member_and_its_frontier(tmp_path, tiny_model_dir, tiny_csv, cache_dir, linear_table):  # noqa: F811
    """Two speed-up targets: each member's saved model equals its step's masked model (weights from that step's
    checkpoint) and its ONNX export; the frontier holds every member × runtime, the original and its int8, the
    baselines; the report's pick and `compressor pick` agree, and the picked directory loads."""
    budget = {"kind": "speedup", "values": [1.3, 1.6], "batch_size": 4, "seq_len": 16}
    export = {"variants": ["fp32", "int8"], "int8": {"max_drop": None, "min_agreement": None}}
    recipe = _family_recipe(tmp_path, tiny_model_dir, tiny_csv, "fam", budget, export=export,
                            bench={**BENCH, "max_drop": None})  # fmt: skip
    report = run_recipe(recipe)
    out = tmp_path / "fam"
    family = report["family"]
    assert [m["label"] for m in family["members"]] == ["1.3x", "1.6x"]
    steps = {m["label"]: m["step"] for m in family["members"]}
    assert steps["1.3x"] < steps["1.6x"] == len(report["steps"])
    assert [e["goal_index"] for e in report["steps"]] == sorted(e["goal_index"] for e in report["steps"])
    assert [t for e in report["steps"] for t in e.get("members", [])] == [1.3, 1.6]
    _check_member_parity(out, recipe, family["members"][0])
    names = {r["name"] for r in family["frontier"]}
    assert {"pytorch-original", "onnx-fp32-original", "onnx-int8-original"} <= names
    for label in ("1.3x", "1.6x"):
        assert {f"{label}/pytorch", f"{label}/onnx-fp32", f"{label}/onnx-int8", f"{label}/layer-drop"} <= names
        assert (out / "members" / label / "member.json").exists()
    assert any(r["pareto"] for r in family["frontier"])
    first, second = (m["baseline"] for m in family["members"])
    assert first["continued_from_layers_dropped"] is None  # the first starts from the original ...
    assert second["continued_from_layers_dropped"] == first["layers_dropped"] <= second["layers_dropped"]  # ... then on
    assert all(r["path"] is None or not r["path"].startswith("/") for r in family["frontier"])
    assert report["recommendation"]["name"] == family["pick"]["name"]
    md = (out / "report.md").read_text()
    assert "## Frontier" in md and "## Members" in md and (out / "frontier.png").exists()
    assert family["pick"]["chosen_on"] == "validation" and "| validation Δ (points) |" in md
    assert all(r["val_accuracy"] is not None for r in family["frontier"]), "the bench scored validation for every row"
    assert "budget check" in report["timings"]
    for member in family["members"]:  # the budget check's speed-up with its spread over rounds, and the step's own
        bench, at_step = member["budget"], report["steps"][member["step"] - 1]["measured_speedup"]
        assert bench["measured_rounds"] == 7 and bench["measured_vs"] == "pytorch-original"
        low, high = bench["measured_iqr"]
        assert low <= bench["measured_speedup"] <= high
        cell = f"{bench['measured_speedup']:.2f}× ({low:.2f}–{high:.2f})"
        assert f"| {member['label']} | {member['target']:g} | {cell} |" in md
        assert f"| {at_step:.2f}× | {member['step']} |" in md
    _check_pick_cli(out, family, tmp_path)


@pytest.mark.e2e
def test_member_finetune_trains_each_member_and_its_baseline_once_more(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """`prune.member_finetune`: each member gets a last fine-tune on its own copy (distilled, on examples the steps
    never drew: the teacher pass covered them), so its saved model differs from its step's masked model yet still
    equals its ONNX export; its validation before (the step's) and after are reported, and its baseline got the
    same fine-tune; `member_epochs` gives the deeper member (and its baseline) a longer one."""
    budget = {"kind": "flops", "values": [0.2, 0.4], "seq_len": 16}
    finetune = {**FINETUNE, "distill": {"alpha": 0.5, "temperature": 2.0}}
    member_ft = {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 128}
    prune = {**UNITS, "steps": 2, "budget": budget, "finetune": finetune, "member_finetune": member_ft,
             "member_epochs": [1, 2]}  # fmt: skip
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "ft", prune=prune,
                                      export={"variants": ["fp32"]}, bench={**BENCH, "max_drop": None}))  # fmt: skip
    report = run_recipe(recipe)
    out, members = tmp_path / "ft", report["family"]["members"]
    for member, epochs in zip(members, (1, 2), strict=True):
        ft, step = member["member_finetune"], report["steps"][member["step"] - 1]
        assert ft["steps"] == 8 * epochs and ft["distill"]["alpha"] == 0.5  # 128 examples / 16 per epoch, distilled
        assert ft["val_before"] == step["val_after_finetune"] and 0 <= ft["val_after"]["accuracy"] <= 1
        assert member["baseline"]["member_finetune"]["steps"] == 8 * epochs
        assert member["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4
    with pytest.raises(AssertionError):  # trained on after its step: no longer the step's masked model
        _check_member_parity(out, recipe, members[0])
    _check_onnx_parity(out, members[0], recipe)
    assert "Final fine-tune of each member" in (out / "report.md").read_text()


@pytest.mark.parametrize("recovery", ["rescale", "none"])
def test_member_finetune_is_refused_in_post_training_modes(recovery):
    with pytest.raises(RecipeError, match=f"member_finetune: recovery '{recovery}' trains nothing") as err:
        parse_recipe({"model": {"task_tuned": True}, "prune": {**UNITS, "budget": {"kind": "flops", "value": 0.3},
                      "recovery": recovery, "member_finetune": {"epochs": 1}}})  # fmt: skip
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("epochs", "finetune", "message"),
    [([1, 2, 3], {"epochs": 1}, "member_epochs: expected 2 epoch counts in (0, 1000], one per target [0.2, 0.4], got"),
     ([1, 0], {"epochs": 1}, "member_epochs: expected 2 epoch counts in (0, 1000]"),
     ([1, 1e4], {"epochs": 1}, "member_epochs: expected 2 epoch counts in (0, 1000]"),
     ([1, 2], None, "member_epochs: needs member_finetune settings")],
)  # fmt: skip
def test_member_epochs_is_one_positive_count_per_target(epochs, finetune, message):
    with pytest.raises(RecipeError, match=re.escape(message)) as err:
        parse_recipe({"prune": {**UNITS, "budget": {"kind": "flops", "values": [0.2, 0.4]},
                      "member_finetune": finetune, "member_epochs": epochs}})  # fmt: skip
    assert "\n" not in str(err.value)


def _check_member_parity(out, recipe, member: dict) -> None:
    """The member saved after step k equals the masked model rebuilt from step k's checkpoint, and its ONNX fp32
    graph equals the saved model (max |Δlogit| ≤ 1e-4)."""
    from transformers import AutoTokenizer

    from compressor.recovery.loop import Masks
    from compressor.sources import load_task_data

    step_dir = out / "state" / f"step_{member['step'] - 1:03d}"
    records = load_file(str(step_dir / "records.safetensors"))
    masks = Masks(records["heads"][member["step"] - 1], records["neurons"][member["step"] - 1])
    model_dir = out / "members" / member["label"] / "model"
    saved = load_pruned(model_dir).eval()
    base = _base_model(recipe)
    base.load_state_dict(load_file(str(step_dir / "model.safetensors")))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = load_task_data(recipe.data)
    split = tokenize(data.validation, tokenizer, data.text_fields, recipe.data.max_length)
    batch = next(iter(sample_batches(split, tokenizer, 32, 32, seed=0)))
    with torch.inference_mode(), gated(base.eval(), masks.head_gates(), masks.neuron_gates()):
        reference = base(**model_inputs(batch)).logits
    with torch.inference_mode():
        assert (saved(**model_inputs(batch)).logits - reference).abs().max() <= 1e-4
    onnx = OnnxClassifier(out / "members" / member["label"] / "onnx" / "fp32")
    logits = onnx(model_inputs(batch))
    assert abs(torch.as_tensor(logits) - reference).max() <= 1e-4


def _check_onnx_parity(out, member: dict, recipe) -> None:
    """A member's saved model and its ONNX fp32 export give the same logits (max |Δlogit| ≤ 1e-4)."""
    from transformers import AutoTokenizer

    from compressor.sources import load_task_data

    model_dir = out / "members" / member["label"] / "model"
    saved, tokenizer = load_pruned(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    data = load_task_data(recipe.data)
    split = tokenize(data.validation, tokenizer, data.text_fields, recipe.data.max_length)
    batch = model_inputs(next(iter(sample_batches(split, tokenizer, 32, 32, seed=0))))
    with torch.inference_mode():
        reference = saved(**batch).logits
    logits = OnnxClassifier(out / "members" / member["label"] / "onnx" / "fp32")(batch)
    assert abs(torch.as_tensor(logits) - reference).max() <= 1e-4


def _base_model(recipe):
    """The unpruned architecture of the run (weights come from a step checkpoint)."""
    from compressor.core.machine import cache_root
    from compressor.surgery.checkpoint import load_pruned as load

    (cached,) = list((cache_root() / "finetuned").iterdir())
    return load(cached, attn_implementation="eager")


def _check_pick_cli(out, family: dict, tmp_path) -> None:
    runner = CliRunner()
    choices = [r for r in family["frontier"] if r["role"] != "baseline" and r["path"] and not r["rejected"]]
    fastest = max(choices, key=lambda r: r["speedup"])  # a member, or the original's export when it is faster
    result = runner.invoke(app, ["pick", str(out), "--max-drop", "none", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["name"] == fastest["name"]
    result = runner.invoke(app, ["pick", str(out), "--max-drop", "none", "--runtime", "pytorch",
                                 "--out", str(tmp_path / "picked")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert load_pruned(tmp_path / "picked") is not None
    result = runner.invoke(app, ["pick", str(out), "--runtime", "tflite"])
    assert result.exit_code == 2 and "--runtime: the run has no member on 'tflite'" in result.output
    result = runner.invoke(app, ["pick", str(out), "--batch-size", "7"])
    assert result.exit_code == 2 and "--batch-size: the run measured batch sizes" in result.output
    result = runner.invoke(app, ["pick", str(out), "--max-drop", "none", "--out", str(tmp_path / "picked")])
    assert result.exit_code == 2 and "--out:" in result.output and "not an empty directory" in result.output
    result = runner.invoke(app, ["pick", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "RUN_DIR:" in result.output


def _cli_env(cache) -> dict:
    import os

    return {**os.environ, "COMPRESSOR_CACHE": str(cache), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _kill_when(cmd, env, marker, out) -> None:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert marker.exists(), f"the run never wrote {marker}"
    assert not (out / "report.json").exists(), "killed too late: the run had already finished"


@pytest.mark.e2e
def test_family_resumes_mid_loop_and_mid_members(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    """A head-fraction family (no timing: deterministic) killed after its first step, then again after its first
    member was saved, ends as the uninterrupted run does; the member saved before the second kill is kept."""
    prune = {"criterion": {"name": "taylor"}, "budget": {"kind": "heads", "values": [0.25, 0.5]}, "steps": 4,
             "score_examples": 64, "finetune": FINETUNE}  # fmt: skip
    overrides = {"prune": prune, "export": {"variants": ["fp32"]}, "bench": {**BENCH, "max_drop": None}}
    reference = run_recipe(parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "ref", **overrides)))
    out = tmp_path / "killed"
    recipe_path = tmp_path / "killed.yaml"
    recipe_path.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, out, **overrides)))
    cmd, env = [sys.executable, "-m", "compressor", "run", str(recipe_path)], _cli_env(cache_dir)
    _kill_when(cmd, env, out / "state" / "step_000" / "step.json", out)
    first = out / "members" / "25pct" / "member.json"
    _kill_when(cmd, env, first, out)
    stamp = first.stat().st_mtime_ns
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    log = (out / "run.log").read_text()
    assert "resuming after step" in log and "member 25pct: kept from an earlier try" in log
    assert first.stat().st_mtime_ns == stamp
    resumed = json.loads((out / "report.json").read_text())
    for a, b in zip(resumed["family"]["members"], reference["family"]["members"], strict=True):
        keys = ("label", "step")
        assert [a[k] for k in keys] == [b[k] for k in keys]
        assert a["pruned"]["heads_per_layer"] == b["pruned"]["heads_per_layer"]
        assert a["pruned"]["test"]["accuracy"] == pytest.approx(b["pruned"]["test"]["accuracy"], abs=1e-6)
        # the second baseline continues the first, reloaded from disk after the kill: same as uninterrupted
        assert a["baseline"]["baseline_accuracy"] == pytest.approx(b["baseline"]["baseline_accuracy"], abs=1e-6)
        for key in ("steps", "train_loss"):
            assert a["baseline"]["finetune"][key] == pytest.approx(b["baseline"]["finetune"][key], abs=1e-6)
    assert {r["name"] for r in resumed["family"]["frontier"]} == {r["name"] for r in reference["family"]["frontier"]}
