"""One budget for heads and FFN neurons: the API under FLOP and speed-up budgets, the layer-drop baseline."""

from __future__ import annotations

import json

import pytest
import torch

import compressor
from compressor.core.errors import UserError
from compressor.pruning import budget as budget_mod
from compressor.pruning.latency import DEFAULT_FRACTIONS, Dims, LatencyTable
from compressor.pruning.latency.probe import NEURON_BLOCK, grid_counts
from compressor.pruning.latency.table import grid_axes
from compressor.pruning.masking import gated
from compressor.pruning.units import apply_plan_to_masks
from compressor.recipe import PruneSpec, RecipeError, TrainSpec, parse_recipe
from compressor.recovery.layer_drop import drop_top_layers, layers_to_drop, recovery_spec
from compressor.recovery.loop import Masks, PruneState, StepRecord
from compressor.recovery.train import model_inputs
from compressor.sources.batches import sample_batches
from compressor.surgery.arch import removed_layers
from compressor.surgery.cost import UnitCosts, masked_flops, unit_costs

FINETUNE = TrainSpec(epochs=1, lr=5e-4, batch_size=16, max_examples=32)


def _spec(**budget) -> PruneSpec:
    if budget.get("kind") == "speedup":
        budget.setdefault("calibrate", False)  # the table alone decides, unless a test measures
    return PruneSpec(
        units=["heads", "neurons"],
        budget=budget,
        steps=2,
        score_examples=32,
        score_batch_size=16,
        finetune=FINETUNE,
        criterion={"name": "taylor"},
    )


def _masked_equals_pruned(result, val, tok) -> float:
    batch = next(iter(sample_batches(val, tok, 16, 16, seed=0)))
    model = result.model.eval()
    with torch.inference_mode(), gated(model, result.masks.head_gates(), result.masks.neuron_gates()):
        masked = model(**model_inputs(batch)).logits
    with torch.inference_mode():
        pruned = result.pruned()(**model_inputs(batch)).logits
    return float((masked - pruned).abs().max())


def test_flop_budget_with_neurons_lands_within_one_unit(task, tmp_path, monkeypatch):
    """Heads and neurons compete on importance per FLOP (`allocation: ratio`); the final FLOPs are at or below
    the budget by less than one unit, and the
    physically pruned model (neurons sliced) equals the masked one."""
    model, tok, train, val = task
    monkeypatch.chdir(tmp_path)
    costs = unit_costs(model, 64)
    total = masked_flops(model, {}, 64)
    spec = _spec(kind="flops", value=0.4).model_copy(update={"allocation": "ratio"})  # scores per FLOP decide
    result = compressor.prune(model, tok, train, spec, validation=val)
    assert list(tmp_path.iterdir()) == []  # a FLOP budget writes no file
    left = masked_flops(model, result.masks.alive(), 64)
    removed = total - left
    assert 0.4 * total <= removed < 0.4 * total + max(costs.head, costs.neuron)
    assert result.masks.neurons is not None and int((~result.masks.neurons).sum()) > 0
    assert [s["neurons_left"] for s in result.steps] == sorted((s["neurons_left"] for s in result.steps), reverse=True)
    assert result.steps[-1]["flops_left_fraction"] == pytest.approx(left / total, abs=1e-6)
    assert _masked_equals_pruned(result, val, tok) < 1e-4


def _linear_table(dims: Dims, ms_per_head: float = 1.0, ms_per_neuron: float = 0.01) -> LatencyTable:
    """A table whose layers cost exactly `1 + heads·ms_per_head + neurons·ms_per_neuron` (bilinear, so exact)."""
    heads, neurons = [0, dims.heads], [0, dims.intermediate]
    grid = [[1 + h * ms_per_head + n * ms_per_neuron for n in neurons] for h in heads]
    return LatencyTable("pytorch", 32, 64, 1, dims, heads, neurons, grid, outside_ms=0.5)


@pytest.fixture
def tiny_table(task, monkeypatch):
    """The speed-up budget's latency table, replaced by a known linear one (no timing in unit tests)."""
    table = _linear_table(Dims.from_config(task[0].config))
    calls = []

    def fake(config, runtime, batch_size, seq_len, **kwargs):
        calls.append((runtime, batch_size, seq_len))
        return table

    monkeypatch.setattr(budget_mod, "load_or_build", fake)
    return table, calls


def test_speedup_budget_meets_the_predicted_goal_and_stops_there(task, tiny_table):
    model, tok, train, val = task
    table, calls = tiny_table
    result = compressor.prune(model, tok, train, _spec(kind="speedup", value=2.0), validation=val)
    assert calls == [("pytorch", 32, 64)]  # one table for the whole run
    predicted = [s["predicted_speedup"] for s in result.steps]
    aim = 1 + budget_mod.SPEEDUP_AIM  # each step selects a little past its goal (the landing jitters)
    assert predicted[0] >= 2.0**0.5 * aim and predicted[-1] >= 2.0 * aim  # geometric schedule, goal met at the end
    # stopped as soon as aimed: putting back the cheapest removed unit of the last step falls below the aim
    full = table.dims.full()
    widths = budget_mod.widths_of(result.masks.alive(), table.dims)
    assert table.speedup(full, widths) == pytest.approx(predicted[-1], abs=1e-3)
    assert any(table.speedup(full, undo) < 2.0 * aim for undo in _undos(widths, table.dims))
    assert _masked_equals_pruned(result, val, tok) < 1e-4


def _undos(widths, dims: Dims) -> list[tuple[list[int], list[int]]]:
    """Every single-layer undo of one move: one head, or one neuron block, put back in one layer."""
    out = []
    for layer in range(dims.layers):
        heads, neurons = list(widths.heads), list(widths.neurons)
        heads[layer] = min(heads[layer] + 1, dims.heads)
        out.append((heads, list(widths.neurons)))
        neurons[layer] = min(neurons[layer] + NEURON_BLOCK, dims.intermediate)
        out.append((list(widths.heads), neurons))
    return out


def test_speedup_budget_stops_when_a_resumed_state_already_meets_it(task, tiny_table):
    """The loop checks the table before each step: a state that meets the goal takes no further step."""
    model, tok, train, _ = task
    alive = Masks.full(model, ["heads", "neurons"])
    alive.heads[:, 1:] = False
    alive.neurons[:, 2:] = False

    class Resume:
        def resume(self, model, fresh):
            return PruneState(alive, [])

        def after_step(self, model, state):
            raise AssertionError("no step expected")

    result = compressor.prune(model, tok, train, _spec(kind="speedup", value=2.0), hook=Resume())
    assert result.steps == [] and result.masks is alive


@pytest.fixture
def measured(tiny_table, monkeypatch):
    """The real model's measured speed-up, faked as `factor` times the table's prediction for its shape."""
    from compressor.pruning.units import alive_units
    from compressor.recovery import choice as api

    table, _ = tiny_table
    calls, factor = [], {"value": 1.3}

    def fake(original, pruned, runtime, batch_size, seq_len):
        full, shape = (budget_mod.widths_of(alive_units(m), table.dims) for m in (original, pruned))
        calls.append((full, shape, runtime, batch_size, seq_len))
        return factor["value"] * table.speedup(full, shape)

    monkeypatch.setattr(api, "measured_speedup", fake)
    return calls, factor


def test_measured_speedup_corrects_the_tables_later_goals(task, tiny_table, measured):
    """A real model 1.3x faster than the table predicts: every step logs the measurement and the correction, the
    budget is held to the corrected prediction, and less goes than the table alone would remove."""
    model, tok, train, val = task
    table, _ = tiny_table
    calls, _ = measured
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = compressor.prune(model, tok, train, _spec(kind="speedup", value=2.0, calibrate=True), validation=val)
    given = [s for e in result.steps for s in e.get("allocation", []) if s["kind"] == "given back"]
    assert len(result.steps) == 2 and len(calls) == 2 + len(given)  # a landing past the target is timed again
    assert all(g["measured_before"] > 2.0 * (1 + budget_mod.OVERSHOOT) for g in given)
    assert all(full == table.dims.full() and tuple(rest) == ("pytorch", 32, 64) for full, _, *rest in calls)
    for entry in result.steps:
        assert entry["measured_speedup"] == pytest.approx(1.3 * entry["predicted_speedup"], rel=1e-3)
        assert entry["calibration"] == pytest.approx(1.3) and entry["expected_speedup"] >= entry["predicted_speedup"]
    assert result.steps[-1]["expected_speedup"] >= 2.0 > result.steps[-1]["predicted_speedup"]
    model.load_state_dict(state)
    plain = compressor.prune(model, tok, train, _spec(kind="speedup", value=2.0), validation=val)
    assert plain.steps[-1]["predicted_speedup"] >= 2.0
    # less goes than the table alone would remove: counted in the table's milliseconds (unit counts depend on which
    # kind the allocation picked, and a neuron block costs a fraction of a head here)
    assert result.steps[-1]["predicted_speedup"] < plain.steps[-1]["predicted_speedup"]


def _drifting(table, factors):
    """A stand-in for the real timing: the table's speed-up times the next of `factors` (the real model matches
    the table at 1.0, runs slower below it)."""
    from compressor.pruning.units import alive_units

    def measure(original, pruned, runtime, batch_size, seq_len):
        shapes = (budget_mod.widths_of(alive_units(m), table.dims) for m in (original, pruned))
        return next(factors) * table.speedup(*shapes)

    return measure


def _distilling_speedup_spec():
    from compressor.recipe import FinetuneSpec

    distil = FinetuneSpec(**FINETUNE.model_dump(), distill={"alpha": 0.5, "temperature": 2.0})
    return _spec(kind="speedup", value=2.0, calibrate=True).model_copy(update={"finetune": distil})


def test_a_step_measured_short_of_its_target_selects_more_before_its_recovery(task, tiny_table, monkeypatch):
    """The real model matches the table at step 1 but is 20% slower from step 2, the last scheduled one: step 2
    corrects the table by its measurement and selects more from its own scores before fine-tuning, so the target
    is met without a top-up step."""
    from compressor.recovery import choice as api

    model, tok, train, val = task
    calls = iter([1.0] + [0.8] * 5)
    monkeypatch.setattr(api, "measured_speedup", _drifting(tiny_table[0], calls))
    result = compressor.prune(model, tok, train, _distilling_speedup_spec(), validation=val)
    steps = result.steps
    assert [s["step"] for s in steps] == [1, 2] and [s["calibration"] for s in steps] == pytest.approx([1, 0.8])
    assert steps[1]["measured_speedup"] >= 2.0 * (1 - budget_mod.SPEEDUP_SLACK)
    assert steps[1]["predicted_speedup"] >= 2.0 / 0.8 * (1 - budget_mod.SPEEDUP_SLACK)  # selected past the table
    assert len(list(calls)) == 3  # three of the six timings taken: step 1, step 2, step 2 after more units
    removed = sum(len(ids) for ids in steps[1]["removed"].values())  # the step's log holds the extra units too
    assert steps[0]["heads_left"] - removed == steps[1]["heads_left"] == int(result.masks.heads.sum())


def test_a_shortfall_the_step_cannot_settle_takes_a_top_up_step(task, tiny_table, monkeypatch):
    """With no extra selection inside the step, a step measured short takes one more step at the final goal (its
    recovery distils: teacher targets cover the top-up draw) and stops."""
    from compressor.recovery import choice as api

    model, tok, train, val = task
    monkeypatch.setattr(api, "measured_speedup", _drifting(tiny_table[0], iter([1.0, 0.8, 0.8, 0.8])))
    monkeypatch.setattr(api, "TOP_UP_STEPS", 0)
    spec = _distilling_speedup_spec()
    result = compressor.prune(model, tok, train, spec, validation=val)
    steps = result.steps
    assert [s["step"] for s in steps] == [1, 2, 3] and [s["calibration"] for s in steps] == pytest.approx([1, 0.8, 0.8])
    assert steps[1]["predicted_speedup"] >= 2.0 and steps[1]["measured_speedup"] < 2.0  # scheduled steps: short
    assert steps[2]["measured_speedup"] >= 2.0  # the top-up meets the goal, and no further step is taken
    assert budget_mod.max_steps(spec) == 2 + budget_mod.TOP_UP_STEPS
    assert budget_mod.max_steps(_spec(kind="speedup", value=2.0)) == 2  # the table alone: no top-up


def test_a_step_measured_past_its_target_gives_units_back_before_its_recovery(task, tiny_table, monkeypatch):
    """The real model matches the table at step 1 but runs 30% faster from step 2, the last scheduled one: step 2
    lands far past its target, so it gives back the units of its own step that matter most per millisecond, down
    to the target on the corrected table, and is timed again; the log and the masks agree, and the masked model
    still equals the physically pruned one."""
    from compressor.recovery import choice as api

    model, tok, train, val = task
    calls = iter([1.0] + [1.3] * 5)
    monkeypatch.setattr(api, "measured_speedup", _drifting(tiny_table[0], calls))
    result = compressor.prune(model, tok, train, _distilling_speedup_spec(), validation=val)
    first, last = result.steps
    given = [s for s in last["allocation"] if s["kind"] == "given back"]
    assert len(given) == 1 and given[0]["units"] > 0
    assert given[0]["measured_before"] > 2.0 * (1 + budget_mod.OVERSHOOT)
    assert 2.0 * (1 - budget_mod.SPEEDUP_SLACK) <= last["measured_speedup"] <= 2.0 * (1 + budget_mod.OVERSHOOT)
    assert len(list(calls)) == 3  # step 1, step 2, step 2 after giving back
    removed = sum(len(ids) for ids in last["removed"].values())
    assert first["heads_left"] - removed == last["heads_left"] == int(result.masks.heads.sum())
    assert _masked_equals_pruned(result, val, tok) < 1e-4


@pytest.mark.parametrize("seed", range(4))
def test_give_back_restores_only_the_steps_units_in_kept_layers_best_first(task, seed):
    """`restore_by_latency`: what comes back was removed by the step, never into a layer or an attention the step
    emptied, the table still predicts the goal, and one unit more (the best-scored head left) would fall below it."""
    model = task[0]
    dims = Dims.from_config(model.config)
    table, costs = _linear_table(dims), unit_costs(model, 64)
    before = Masks.full(model, ["heads", "neurons"])
    after = before.clone()
    after.heads[:, dims.heads // 2 :] = False  # the step took half of every layer's heads and neurons ...
    after.neurons[:, dims.intermediate // 2 :] = False
    after.heads[0], after.neurons[0] = False, False  # ... and layer 0 whole, and layer 1's attention
    after.heads[1] = False
    gen = torch.Generator().manual_seed(seed)
    scores = {
        "heads": torch.rand(dims.layers, dims.heads, generator=gen),
        "neurons": torch.rand(dims.layers, dims.intermediate, generator=gen),
    }
    full = table.dims.full()
    reached = table.speedup(full, budget_mod.widths_of(after.alive(), dims))
    goal = 1 + (reached - 1) / 2
    removed = {kind: before[kind] & ~after[kind] for kind in after}
    plan = budget_mod.restore_by_latency(scores, after, removed, table, goal, costs)
    back = after.with_units(plan)
    assert table.speedup(full, budget_mod.widths_of(back.alive(), dims)) >= goal
    assert not back.heads[0].any() and not back.neurons[0].any()  # the emptied layer stays dropped
    assert not back.heads[1].any()  # and the emptied attention empty (one head back: below min_heads_per_layer)
    for kind in back:
        assert not (back[kind] & ~before[kind]).any()  # nothing the step had not removed
        assert bool((back[kind] & ~after[kind]).any())  # both kinds came back here
    left = removed["heads"] & ~back.heads
    left[:2] = False  # the heads that could have come back and did not: none of them fits any more
    for layer, head in left.nonzero().tolist():
        one_more = back.clone()
        one_more.heads[layer, head] = True
        assert table.speedup(full, budget_mod.widths_of(one_more.alive(), dims)) < goal
    assert budget_mod.restore_by_latency(scores, after, removed, table, reached * 2, costs) == {
        "heads": {},
        "neurons": {},
    }


def test_layer_to_restore_picks_the_dropped_layer_that_lowers_the_loss_most_per_cost(task, tiny_table):
    """Of the layers the step dropped whole, the one whose units bring the loss down most per predicted millisecond
    comes back; a layer already empty before the step, or still kept, is never offered; no dropped layer: None."""
    from compressor.pruning.allocation import layer_to_restore

    model = task[0]
    budget = budget_mod.plan_budget(model, _spec(kind="speedup", value=1.5))
    before = Masks.full(model, ["heads", "neurons"])
    before.heads[2], before.neurons[2] = False, False  # layer 2 was gone before the step
    before.heads[1, 2:] = False  # layer 1 was narrower: half its heads, so it costs less to put back
    alive = before.clone()
    alive.heads[:2], alive.neurons[:2] = False, False  # the step dropped layers 0 and 1
    offered = []

    def loss(masks) -> float:  # each layer back lowers the loss by 1; the base loss is 5
        back = [layer for layer in range(3) if bool(masks["heads"][layer].any())]
        offered.append(back)
        return 5.0 - len(back)

    assert layer_to_restore(budget, before, alive, loss) == 1  # the same gain, the cheaper layer
    assert offered == [[], [0], [1]]  # the base, then each dropped layer alone; never layer 2
    assert layer_to_restore(budget, before, before, loss) is None  # nothing dropped by the step

    def loss_prefers_0(masks) -> float:
        return 5.0 - 10.0 * bool(masks["heads"][0].any()) - bool(masks["heads"][1].any())

    assert layer_to_restore(budget, before, alive, loss_prefers_0) == 0  # ten times the gain outweighs its higher cost


def test_a_step_past_its_target_with_only_whole_layers_gives_a_layer_back_then_selects_units(
    task, tiny_table, monkeypatch
):
    """A step that dropped layer 0 whole lands past its target with no head or neuron of its own left in a kept
    layer: it gives the layer back, lands short, selects heads and neurons again (never a whole layer), and ends
    within 10% of its target; the slices say so, the masks are a subset of the step's start, every layer keeps
    units."""
    from accelerate import Accelerator

    from compressor.recovery import choice
    from compressor.recovery import loop as loop_mod

    model, tok, train, _ = task
    units = ["heads", "neurons", "layers"]
    spec = _spec(kind="speedup", value=1.3, calibrate=True).model_copy(
        update={"units": units, "steps": 1, "finetune": None, "min_heads_per_layer": 1}
    )
    calls = iter([1.0] * 6)
    monkeypatch.setattr(choice, "measured_speedup", _drifting(tiny_table[0], calls))
    loop = loop_mod._prepare(model, tok, train, spec, None, None, 0, Accelerator())
    before = Masks.full(model, units)
    masks = before.clone()
    masks.heads[0], masks.neurons[0] = False, False
    assert loop.budget.predicted_speedup(masks) > 1.3 * (1 + budget_mod.OVERSHOOT)
    gen = torch.Generator().manual_seed(0)
    scores = {kind: torch.rand(mask.shape, generator=gen) for kind, mask in before.items()}
    after, measured, slices = choice.settle(loop, 0, scores, before, masks, step=0)
    assert slices[0]["kind"] == "layer given back" and slices[0]["layer"] == 0
    assert slices[0]["units"] == int(before.heads[0].sum() + before.neurons[0].sum())
    assert {s["kind"] for s in slices[1:]} <= {"heads", "neurons", "rest"} and len(slices) > 1
    speed = measured["measured_speedup"]  # a head here is 7% of the time: the landing is as near as heads allow
    assert speed >= 1.3 * (1 - budget_mod.SPEEDUP_SLACK) and budget_mod.within_target(speed, 1.3)
    assert len(list(calls)) == 3  # timed three times: the step, the layer back, the units selected again
    for kind in after:
        assert not (after[kind] & ~before[kind]).any()
    assert all(bool(after.heads[layer].any()) for layer in range(3))


def test_resumed_run_keeps_the_measured_correction(task, tiny_table, measured):
    """The correction a finished step measured is restored on resume: here it already says the goal is met."""
    model, tok, train, _ = task
    alive = Masks.full(model, ["heads", "neurons"])
    alive.heads[:, 6:] = False
    done = StepRecord(entry={"step": 1, "calibration": 10.0}, scores=torch.zeros(1), masks=alive)

    class Resume:
        def resume(self, model, fresh):
            return PruneState(alive, [done])

        def after_step(self, model, state):
            raise AssertionError("no step expected: the restored correction meets the goal")

    result = compressor.prune(model, tok, train, _spec(kind="speedup", value=2.0, calibrate=True), hook=Resume())
    assert result.steps == [done.entry] and measured[0] == []


def test_calibrate_needs_a_speedup_budget_and_a_positive_measurement(task, tiny_table):
    model = task[0]
    alive = Masks.full(model, ["heads", "neurons"]).alive()
    speed = budget_mod.plan_budget(model, _spec(kind="speedup", value=2.0))
    assert speed.calibrate(alive, 1.5) == pytest.approx(1.5) and speed.expected_speedup(alive) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="positive measurement"):
        speed.calibrate(alive, 0.0)
    with pytest.raises(ValueError, match="speed-up budget"):
        budget_mod.plan_budget(model, _spec(kind="flops", value=0.3)).calibrate(alive, 1.5)


@pytest.mark.parametrize("runtime", ["pytorch", "onnx-fp32"])
def test_measured_speedup_times_real_models_on_the_runtime(task, runtime):
    """The real timing behind the correction runs on both kinds of runtime and leaves the models usable."""
    from compressor.pruning.latency.check import measured_speedup

    model = task[0].eval()
    small = Masks.full(model, ["heads", "neurons"])
    small.heads[:, 2:] = False
    pruned = small.pruned_copy(model)
    ratio = measured_speedup(model, pruned, runtime, batch_size=2, seq_len=8, rounds=2, min_time_s=0.01)
    assert 0 < ratio < float("inf")
    ids = torch.ones(1, 8, dtype=torch.long)
    assert pruned(input_ids=ids).logits.shape == model(input_ids=ids).logits.shape


def test_unreachable_speedup_is_refused_in_one_line(task, tiny_table):
    model, tok, train, _ = task
    spec = _spec(kind="speedup", value=4.0).model_copy(update={"units": ["heads"]})
    with pytest.raises(
        RecipeError, match=r"^prune\.budget\.value: a 4\.0x speed-up on pytorch is out of reach.*expected ≤ 3\.18"
    ):
        compressor.prune(model, tok, train, spec)
    thin = _spec(kind="speedup", value=8.0).model_copy(update={"min_heads_per_layer": 2})  # 8x out of reach
    with pytest.raises(RecipeError, match=r"8\.0x speed-up on pytorch is out of reach"):
        budget_mod.plan_budget(model, thin)
    layers = thin.model_copy(update={"units": ["heads", "neurons", "layers"]})
    assert budget_mod.plan_budget(model, layers).goals[-1] == 8.0  # whole layers may go: reachable


def test_an_unreachable_speedup_fails_before_the_base_finetune(
    tmp_path, tiny_model_dir, tiny_csv, cache_dir, monkeypatch
):
    """A speed-up the recipe's units cannot reach is refused at preflight, from the config and the latency table
    alone: one line naming `prune.budget.value`, exit 2, no run directory, no base fine-tune started."""
    import yaml
    from conftest import tiny_recipe
    from transformers import AutoConfig
    from typer.testing import CliRunner

    from compressor.cli import app
    from compressor.pipeline import runner

    dims = Dims.from_config(AutoConfig.from_pretrained(tiny_model_dir))
    monkeypatch.setattr(budget_mod, "load_or_build", lambda *args, **kwargs: _linear_table(dims))
    started = []
    monkeypatch.setattr(runner, "base_model", lambda run: started.append(run))
    prune = {"criterion": {"name": "taylor"}, "units": ["heads"], "steps": 2, "score_examples": 64,
             "budget": {"kind": "speedup", "value": 4.0, "runtime": "pytorch"}}  # fmt: skip
    out, recipe = tmp_path / "run", tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, out, prune=prune)))
    result = CliRunner().invoke(app, ["run", str(recipe)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "prune.budget.value: a 4.0x speed-up on pytorch is out of reach" in lines[0] and "≤ 3.18" in lines[0]
    assert not out.exists() and not started


def test_latency_selection_prefers_cheap_importance_per_ms(tiny_table):
    """With equal scores, the unit saving more milliseconds goes first (heads cost 1 ms, 32 neurons 0.32 ms)."""
    table, _ = tiny_table
    dims = table.dims
    costs = unit_costs(type("M", (), {"config": _config(dims)})(), 64)
    alive = {"heads": torch.ones(dims.layers, dims.heads, dtype=torch.bool),
             "neurons": torch.ones(dims.layers, dims.intermediate, dtype=torch.bool)}  # fmt: skip
    scores = {k: torch.ones(v.shape) for k, v in alive.items()}
    goal = table.speedup(dims.full(), (tuple([dims.heads] * dims.layers), (dims.intermediate,) * dims.layers)) + 0.01
    plan = budget_mod.select_by_latency(scores, alive, table, goal, costs)
    assert plan["heads"] and not plan["neurons"]


def _config(dims: Dims):
    from types import SimpleNamespace

    return SimpleNamespace(hidden_size=dims.hidden, num_attention_heads=dims.heads, intermediate_size=dims.intermediate)


@pytest.mark.parametrize(
    ("prune", "message"),
    [
        ({"units": ["heads", "neurons"], "target": 0.5}, "prune.units: 'neurons' needs budget kind flops or speedup"),
        ({"target": 0.3, "budget": {"kind": "flops", "value": 0.5}}, "prune.budget: give target"),
        ({"budget": {"kind": "speedup", "value": 0.5}}, "prune.budget.value: for kind 'speedup' expected"),
        ({"budget": {"kind": "flops", "value": 2}}, "prune.budget.value: for kind 'flops' expected a fraction"),
        ({"budget": {"kind": "flops", "value": 0.3, "runtime": "onnx-int8"}}, "prune.budget.runtime: only applies"),
        ({"baseline": "distil"}, "prune.baseline"),
        ({"scope": "per_layer", "budget": {"kind": "flops", "value": 0.3}}, "prune.scope: 'per_layer' applies"),
    ],
)
def test_impossible_budget_combinations_are_refused_in_one_line(prune, message):
    with pytest.raises(RecipeError, match=message) as err:
        parse_recipe({"prune": prune})
    assert "\n" not in str(err.value)


def test_onnx_speedup_budget_needs_that_export():
    budget = {"kind": "speedup", "value": 2.0, "runtime": "onnx-int8"}
    recipe = {"prune": {"budget": budget}, "export": {"variants": ["fp32"]}}
    with pytest.raises(RecipeError, match=r"^recipe: prune\.budget\.runtime: onnx-int8 is measured on the run's own"):
        parse_recipe(recipe)
    assert parse_recipe({"prune": {"budget": budget}}).prune.budget.runtime == "onnx-int8"  # default exports int8


def test_target_is_the_head_budget_shorthand():
    spec = parse_recipe({"prune": {"target": 0.25}}).prune
    assert spec.budget is None and spec.resolved_budget.kind == "heads" and spec.resolved_budget.value == 0.25
    assert spec.baseline == "layer_drop"
    assert parse_recipe({"prune": {"baseline": None}}).prune.baseline is None


def test_layer_drop_baseline_matches_flops_and_recovery_budget(task):
    model = task[0]
    total = masked_flops(model, {}, 64)
    assert layers_to_drop(model, total * 0.62, 64) == 1  # 3 layers: 2/3 left is nearest 62%
    assert layers_to_drop(model, total * 0.30, 64) == 2
    assert layers_to_drop(model, total, 64) == 1  # at least one layer always goes
    dropped = drop_top_layers(model, 2)
    assert masked_flops(dropped, {}, 64) == pytest.approx(total / 3)
    assert removed_layers(dropped) == [1, 2] and removed_layers(model) == []
    assert recovery_spec(FINETUNE, 3, 1000).max_examples == 96 and recovery_spec(FINETUNE, 3, 1000).epochs == 1
    assert recovery_spec(FINETUNE.model_copy(update={"max_examples": None}), 3, 1000).epochs == 3
    assert recovery_spec(None, 3, 1000) is None
    # More example passes than the split holds: all of it, for as many (fractional) epochs as the steps had passes
    beyond = recovery_spec(FINETUNE, 3, 64)
    assert beyond.max_examples is None and beyond.epochs == pytest.approx(96 / 64)
    # A cap above the split's size: each step saw the whole split once, so the baseline gets `steps` epochs
    over_cap = recovery_spec(FINETUNE, 3, 20)
    assert over_cap.max_examples is None and over_cap.epochs == pytest.approx(3)


def test_flat_latency_grid_is_floored_and_empties_a_layer(task):
    """Where the table predicts no saving (a flat grid, marginal 0 ms) units still rank by their floored cost, and
    a goal only reachable by removing a layer whole empties exactly one layer (uniform widths keep every layer)."""
    dims = Dims.from_config(task[0].config)
    flat = LatencyTable("pytorch", 32, 64, 1, dims, [0, dims.heads], [0, dims.intermediate], [[2.0, 2.0], [2.0, 2.0]],
                        outside_ms=0.0)  # fmt: skip
    assert flat.marginal_ms(dims.heads, dims.intermediate, "head") == 0.0
    costs = unit_costs(task[0], 64)
    alive = {"heads": torch.ones(dims.layers, dims.heads, dtype=torch.bool),
             "neurons": torch.ones(dims.layers, dims.intermediate, dtype=torch.bool)}  # fmt: skip
    scores = {k: torch.rand(v.shape, generator=torch.Generator().manual_seed(0)) for k, v in alive.items()}
    scores["heads"][1] = scores["neurons"][1] = 1e-6  # layer 1 is the least important
    plan = budget_mod.select_by_latency(scores, alive, flat, 1.4, costs)
    assert plan["heads"] == {1: list(range(dims.heads))} and plan["neurons"] == {1: list(range(dims.intermediate))}
    uniform = budget_mod.select_by_latency(scores, alive, flat, 1.4, costs, uniform_ffn=True)
    assert all(len(ids) < dims.heads for ids in uniform["heads"].values())  # never a whole layer


def test_speedup_budget_writes_only_its_latency_table(task, tmp_path, monkeypatch, cache_dir):
    """A real (tiny) latency table is measured once into $COMPRESSOR_CACHE/latency and nothing else is written;
    a second prune loads it instead of measuring again."""
    model, tok, train, _ = task
    monkeypatch.chdir(tmp_path)
    spec = _spec(kind="speedup", value=1.3, batch_size=2, seq_len=8).model_copy(update={"finetune": None, "steps": 1})
    result = compressor.prune(model, tok, train, spec)
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    assert written and all(p.parts[:2] == ("cache", "latency") and p.suffix == ".json" for p in written)
    assert result.steps[-1]["predicted_speedup"] >= 1.3

    def no_build(*args, **kwargs):
        raise AssertionError("the cached table should have been used")

    monkeypatch.setattr(LatencyTable, "build", no_build)
    compressor.prune(model, tok, train, spec)


def test_l0_is_told_each_kinds_own_count_to_remove() -> None:
    """Under a FLOP budget with heads and neurons, `target_remove` is per kind (the same share of each kind's
    alive units), and l0 aims its neuron sparsity at the neuron count, not at the head count."""
    from compressor.pruning.units import alive_units, score_all
    from compressor.testing import tiny_batch, tiny_model

    model = tiny_model("bert", seed=0)
    spec = _spec(kind="flops", value=0.5, seq_len=16).model_copy(update={"criterion": {"name": "l0"}})
    alive = alive_units(model)
    remove = budget_mod.plan_budget(model, spec).target_remove(0, alive)
    heads, neurons = int(alive["heads"].sum()), int(alive["neurons"].sum())
    assert set(remove) == {"heads", "neurons"} and 0 < remove["heads"] < heads and remove["neurons"] > heads
    assert remove["neurons"] / neurons == pytest.approx(remove["heads"] / heads, abs=1 / heads)
    extras: dict = {}
    batch = tiny_batch(8, 16)
    score_all("l0", model, alive, [batch], {"steps": 3}, target_remove=remove, extras=extras)
    assert extras["l0"]["target_open"] == heads - remove["heads"]
    assert extras["l0_neurons"]["target_open"] == neurons - remove["neurons"]


def test_a_latency_table_forced_from_a_file_steers_the_budget_and_a_misfit_is_refused(task, tmp_path, monkeypatch):
    """`budget.latency_table` replaces this machine's table (none is measured or cached); one measured for another
    shape, batch or runtime, or a file that is no table, is refused in one line naming the field."""
    model = task[0]
    dims = Dims.from_config(model.config)
    forced = _linear_table(dims, ms_per_head=0.5, ms_per_neuron=0.02)
    path = tmp_path / "other_cpu.json"
    path.write_text(json.dumps(forced.to_dict()))

    def never(*args, **kwargs):
        raise AssertionError("a forced table must not be measured or read from the cache")

    monkeypatch.setattr(budget_mod, "load_or_build", never)
    budget = budget_mod.plan_budget(model, _spec(kind="speedup", value=1.5, latency_table=str(path)))
    assert budget.table == forced
    misfits = {
        "seq_len 64; expected 32": dict(forced.to_dict(), seq_len=64),
        "runtime pytorch; expected onnx-int8": forced.to_dict(),
        "dims": dict(forced.to_dict(), dims={**forced.to_dict()["dims"], "layers": dims.layers + 1}),
    }
    for words, data in misfits.items():
        path.write_text(json.dumps(data))
        runtime = "onnx-int8" if "runtime" in words else "pytorch"
        seq_len = 32 if "seq_len" in words else 64
        spec = _spec(kind="speedup", value=1.5, latency_table=str(path), runtime=runtime, seq_len=seq_len)
        with pytest.raises(UserError, match=f"prune.budget.latency_table: .*{words}"):
            budget_mod.plan_budget(model, spec)
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match="prune.budget.latency_table: .* is no latency table"):
        budget_mod.plan_budget(model, _spec(kind="speedup", value=1.5, latency_table=str(path)))
    with pytest.raises(UserError, match="prune.budget.latency_table: cannot read"):
        budget_mod.plan_budget(model, _spec(kind="speedup", value=1.5, latency_table=str(tmp_path / "none.json")))
    with pytest.raises(ValueError, match="latency_table: only applies to kind 'speedup'"):
        _spec(kind="flops", value=0.4, latency_table=str(path))
    with pytest.raises(ValueError, match="check_rounds: only applies to kind 'speedup', got kind 'heads'"):
        _spec(kind="heads", value=0.4, check_rounds=3)
    assert _spec(kind="speedup", value=1.5, check_rounds=3).budget.check_rounds == 3


def _block_costs_table(dims: Dims, heads_grid: list[int], neurons_grid: list[int]) -> LatencyTable:
    """A layer whose attention and FFN each cost a fixed amount while they have any unit, plus a linear part per
    unit (the shape every measured table has), sampled at the given grid."""

    def ms(h: int, n: int) -> float:
        return 0.3 + (h > 0) * (1.5 + 2.0 * h) + (n > 0) * (0.7 + 0.025 * n)

    grid = [[ms(h, n) for n in neurons_grid] for h in heads_grid]
    return LatencyTable("pytorch", 32, 64, 2, dims, heads_grid, neurons_grid, grid, outside_ms=2.5)


def test_a_blocks_fixed_cost_is_saved_only_with_its_last_unit_so_equal_layers_are_cut_evenly():
    """Four equal layers, units of equal importance: removing one more block of neurons saves the same time in every
    layer until the last, so a 1.6x speed-up leaves the layers' FFNs within a block of one another and none empty.
    A table interpolated from 0 to a quarter of the neurons spread the FFN's fixed cost over that quarter's blocks:
    the same selection then emptied FFNs while other layers kept more than a quarter (the issue-37 symptom)."""
    dims = Dims(hidden=384, heads=12, head_size=32, intermediate=768, layers=4, vocab=100, positions=64, num_labels=2)
    shape = dims.full()
    alive = {kind: torch.ones(dims.layers, w, dtype=torch.bool) for kind, w in (("heads", 12), ("neurons", 768))}
    gen = torch.Generator().manual_seed(0)
    base = {"heads": 2.5, "neurons": 0.02}  # importance per unit: neurons go first, heads too beyond a point
    scores = {kind: base[kind] + 0.01 * torch.rand(mask.shape, generator=gen) for kind, mask in alive.items()}
    head, neuron = 2 * (4 * 64 * 384 * 32 + 2 * 64 * 64 * 32), 2 * 2 * 64 * 384  # FLOPs: only the 0 ms floor uses them
    costs = UnitCosts(64, head, neuron, 12 * head + 768 * neuron)

    def select(table: LatencyTable) -> list[int]:
        plan = budget_mod.select_by_latency(scores, alive, table, 1.6, costs, min_heads_per_layer=2)
        after = budget_mod.widths_of(apply_plan_to_masks(plan, alive), dims)
        assert table.speedup(shape, after) >= 1.6
        return list(after.neurons)

    even = select(_block_costs_table(dims, *grid_axes(dims, DEFAULT_FRACTIONS)))
    assert min(even) > 0 and max(even) - min(even) <= NEURON_BLOCK
    fractions = [grid_counts(12, DEFAULT_FRACTIONS), grid_counts(768, DEFAULT_FRACTIONS)]
    spread = select(_block_costs_table(dims, *fractions))
    assert min(spread) == 0 and max(spread) > 768 // 4


def test_within_target_is_ten_percent_either_side() -> None:
    """The report's 'within 10%' verdict and the benchmarks that re-time members share one rule."""
    assert budget_mod.WITHIN == 0.10
    assert budget_mod.within_target(2.19, 2.0) and budget_mod.within_target(1.81, 2.0)
    assert not budget_mod.within_target(2.21, 2.0) and not budget_mod.within_target(1.79, 2.0)
    assert budget_mod.within_target(7.6, 7.0) and not budget_mod.within_target(7.8, 7.0)
