"""A speed-up budget relative to a reference (`prune.budget.relative_to`): its multiples become speed-ups over the
model from the reference's shape timed against the model's when the run starts (cached, so repeats and a resumed
run get the same targets), checked like any speed-up from there on, and said in the report."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_recipe
from test_budget_run import BENCH, FINETUNE, UNITS, linear_table  # noqa: F401 (a fixture)

from compressor.core.errors import UserError
from compressor.pipeline import preflight as preflight_mod
from compressor.pipeline import runlog
from compressor.pipeline.runner import run_recipe
from compressor.pruning.budget import plan_budget
from compressor.pruning.latency import check
from compressor.recipe import BudgetSpec, parse_recipe
from compressor.testing import tiny_config, tiny_model


def _recipe(tmp_path, model_dir, data, reference, budget: dict, **overrides):
    prune = {**UNITS, "budget": {"kind": "speedup", "batch_size": 4, "seq_len": 16, **budget}, "finetune": FINETUNE}
    bench = {**BENCH, "max_drop": None, "references": [str(reference)]}
    return parse_recipe(tiny_recipe(model_dir, data, tmp_path / "run", prune=prune, bench=bench, **overrides))


@pytest.mark.parametrize(
    ("budget", "references", "message"),
    [
        ({"kind": "speedup", "value": 1.0, "relative_to": "builtin:minilm-l6"}, [],
         r"prune.budget.relative_to: 'builtin:minilm-l6' is not one of bench.references \[\]; expected one of them"),
        ({"kind": "heads", "value": 0.5, "relative_to": "builtin:minilm-l6"}, ["builtin:minilm-l6"],
         "relative_to: only applies to kind 'speedup'"),
        ({"kind": "speedup", "values": [0.0, 1.0], "relative_to": "builtin:minilm-l6"}, ["builtin:minilm-l6"],
         "values: with relative_to expected a multiple of the reference's speed-up above 0"),
        ({"kind": "speedup", "value": 1.0}, [], "value: for kind 'speedup' expected a speed-up factor above 1"),
    ],
)  # fmt: skip
def test_a_relative_budget_is_checked_with_the_recipe(budget, references, message):
    with pytest.raises(UserError, match=message) as err:
        parse_recipe({"prune": {"budget": budget}, "bench": {"references": references}})
    assert "\n" not in str(err.value)


def test_multiples_become_speedups_and_out_of_range_ones_are_named():
    budget = BudgetSpec(kind="speedup", values=[1.0, 1.25], relative_to="builtin:minilm-l6")
    measured = budget.measured_against(4.03)
    assert (measured.targets, measured.value, measured.relative_to) == ([4.03, 5.04], 5.04, None)
    assert budget.describe().startswith("1.0x, 1.25x builtin:minilm-l6's speed-up on pytorch")
    with pytest.raises(ValueError, match=r"values: 1.0 x builtin:minilm-l6's measured 0.90x is 0.9x; expected"):
        budget.measured_against(0.9)
    with pytest.raises(ValueError, match="round to equal targets"):
        BudgetSpec(kind="speedup", values=[1.0, 1.001], relative_to="x").measured_against(2.0)


def test_pruning_refuses_a_budget_still_in_multiples():
    """Only `compressor run` times the reference: the loop given multiples would read 1.0 as a speed-up."""
    spec = parse_recipe({"prune": {"budget": {"kind": "speedup", "value": 1.0, "relative_to": "builtin:minilm-l6"}},
                         "bench": {"references": ["builtin:minilm-l6"]}}).prune  # fmt: skip
    with pytest.raises(UserError, match="^prune.budget.relative_to: 'builtin:minilm-l6' is measured by `compressor"):
        plan_budget(tiny_model("bert"), spec)


def test_the_reference_shape_is_timed_once_per_machine_and_shape(tmp_path, monkeypatch):
    """Both classifiers are built from their configs at the task's label count, timed by `measured_speedup`, and
    the figure is cached: a second call (another seed, a resumed run) reads it; another batch size times again."""
    calls = []

    def timed(original, reference, runtime, batch_size, seq_len):
        calls.append((original.config.num_hidden_layers, reference.config.num_hidden_layers, reference.num_labels))
        return 2.5

    monkeypatch.setattr(check, "measured_speedup", timed)
    model, reference = tiny_config("bert", layers=3), tiny_config("mpnet", layers=1)
    for batch in (4, 4, 8):
        assert check.reference_speedup(model, reference, "pytorch", batch, 16, 3, cache_dir=tmp_path) == 2.5
    assert calls == [(3, 1, 3), (3, 1, 3)]


def test_models_with_different_vocabularies_are_timed_on_ids_both_hold():
    """The timing batch's token ids come from the smaller vocabulary (a reference's tokenizer is its own)."""
    small = tiny_model("bert")
    large_config = tiny_config("bert", layers=1)
    large_config.vocab_size = 4 * small.config.vocab_size
    large = tiny_model("bert", layers=1)
    large.resize_token_embeddings(large_config.vocab_size)
    for a, b in ((large, small), (small, large)):
        speedup = check.measured_speedup(a, b, "pytorch", 2, 8, threads=1, rounds=1, min_time_s=0.001)
        assert speedup > 0 and torch.isfinite(torch.tensor(speedup))


def test_the_preflight_measures_the_targets_and_checks_their_reach(tmp_path, tiny_model_dir, tiny_csv, cache_dir,
                                                                   mpnet_reference, monkeypatch):  # fmt: skip
    """The run's recipe carries speed-ups (the reference's measured 1.5x times each multiple), which the reach
    check reads; the recipe as written keeps its multiples (a resumed run compares that one)."""
    seen = {}

    def timed(config, ref, runtime, b, s, labels):
        check.log.info("budget: the reference's shape timed (a stand-in)")
        return 1.5

    monkeypatch.setattr(preflight_mod, "reference_speedup", timed)
    monkeypatch.setattr(preflight_mod, "check_reach", lambda config, spec, labels: seen.update(spec=spec))
    recipe = _recipe(tmp_path, tiny_model_dir, tiny_csv, mpnet_reference,
                     {"values": [1.0, 1.2], "relative_to": str(mpnet_reference)})  # fmt: skip
    checked = preflight_mod.preflight(recipe, force=False)
    assert checked.recipe.prune.budget.targets == [1.5, 1.8] == seen["spec"].budget.targets
    assert checked.reference_speedup == 1.5 and recipe.prune.budget.targets == [1.0, 1.2]
    assert not (tmp_path / "run").exists()  # nothing written before the run takes its directory
    runlog.open_run_log(tmp_path / "run", main=True)  # as the run does once it has its directory
    assert "budget: the reference's shape timed (a stand-in)" in (tmp_path / "run" / runlog.RUN_LOG).read_text()


def test_a_reference_slower_than_the_model_is_refused_before_anything_runs(
    tmp_path, tiny_model_dir, tiny_csv, cache_dir, mpnet_reference, monkeypatch
):
    monkeypatch.setattr(preflight_mod, "reference_speedup", lambda *args: 0.8)
    recipe = _recipe(tmp_path, tiny_model_dir, tiny_csv, mpnet_reference,
                     {"value": 1.0, "relative_to": str(mpnet_reference)})  # fmt: skip
    with pytest.raises(UserError, match=r"^prune.budget.value: 1.0 x .* measured 0.80x is 0.8x; expected a speed-up"):
        run_recipe(recipe)
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
@pytest.mark.usefixtures("linear_table")
def test_a_family_relative_to_its_reference_runs_and_says_so(tmp_path, tiny_model_dir, tiny_csv, cache_dir,
                                                             mpnet_reference, monkeypatch):  # fmt: skip
    """A whole family at 1.0x and 1.2x of a reference's speed (its timing stood in by 1.3x, the tables by a known
    one): its targets are the speed-ups the multiples became, and the report says what was measured."""

    def timed(*args):
        check.log.info("budget: the reference's shape timed (a stand-in)")
        return 1.3

    monkeypatch.setattr(preflight_mod, "reference_speedup", timed)
    recipe = _recipe(tmp_path, tiny_model_dir, tiny_csv, mpnet_reference,
                     {"values": [1.0, 1.2], "relative_to": str(mpnet_reference)},
                     export={"variants": ["fp32"]})  # fmt: skip
    report = run_recipe(recipe)
    relative = report["relative_budget"]
    speedup = relative["reference_speedup"]
    assert relative["targets"] == [1.3, 1.56] == report["family"]["targets"] and speedup == 1.3
    assert relative["multiples"] == [1.0, 1.2] and relative["reference"] == str(mpnet_reference)
    text = (tmp_path / "run" / "report.md").read_text()
    assert f"whose shape measured {speedup:.2f}x the model's" in text
    logged = (tmp_path / "run" / "run.log").read_text()  # the preflight's timing first, then what it made
    assert logged.index("shape timed (a stand-in)") < logged.index(
        "measured 1.30x the model on pytorch: targets 1.3x, 1.56x"
    )
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["relative_budget"] == relative
