"""Measured allocation between heads and FFN neurons: each slice of a step goes to the kind that costs least loss."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import compressor
from compressor.pruning.allocation import kept_loss, masked_loss, select_measured, thin_layers
from compressor.pruning.budget import plan_budget
from compressor.pruning.masking import gated
from compressor.pruning.units import apply_plan_to_masks, masks_to_plan, pruned_units_copy
from compressor.recipe import PruneSpec, TrainSpec
from compressor.recovery.loop import Masks
from compressor.recovery.train import model_inputs
from compressor.sources.batches import sample_batches
from compressor.surgery.cost import masked_flops, unit_costs


def _spec(**overrides) -> PruneSpec:
    base = dict(
        units=["heads", "neurons"],
        budget={"kind": "flops", "value": 0.4},
        steps=2,
        score_examples=32,
        score_batch_size=16,
        finetune=TrainSpec(epochs=1, lr=5e-4, batch_size=16, max_examples=32),
        criterion={"name": "taylor"},
    )
    return PruneSpec(**(base | overrides))


def _removed(alive: dict, kind: str) -> int:
    return int((~alive[kind]).sum())


@pytest.mark.parametrize(
    ("penalised", "chosen"),
    [("heads", "neurons"), ("neurons", "heads")],
)
def test_each_slice_goes_to_the_kind_whose_removal_costs_less_loss(task, penalised, chosen):
    """A loss that grows only with removed `penalised` units makes every slice pick the other kind, and the step
    still lands on its FLOP goal within one unit."""
    model = task[0]
    budget = plan_budget(model, _spec())
    alive = Masks.full(model, ["heads", "neurons"]).alive()
    scores = {kind: torch.rand(mask.shape, generator=torch.Generator().manual_seed(0)) for kind, mask in alive.items()}

    def loss(a: dict) -> float:
        return float(_removed(a, penalised))

    plan, log, _ = select_measured(budget, 0, scores, alive, loss, parts=4)
    after = apply_plan_to_masks(plan, alive)
    assert [s["kind"] for s in log] == [chosen] * 4
    assert _removed(after, penalised) == 0 and _removed(after, chosen) > 0
    removed = budget.total_flops - masked_flops(model, after, budget.costs.seq_len)
    costs = unit_costs(model, budget.costs.seq_len)
    assert budget.goals[0] <= removed < budget.goals[0] + max(costs.head, costs.neuron)


def test_a_kind_that_runs_out_leaves_the_rest_to_the_common_scale(task):
    """When the cheap kind cannot reach the goal alone (heads capped per layer), the step is finished by the
    budget's cross-kind selection and still meets its goal."""
    model = task[0]
    costs = unit_costs(model, 64)
    heads_share = 2 * costs.head / costs.layer  # what removing all but 2 heads per layer (of 4) saves
    spec = _spec(min_heads_per_layer=2, budget={"kind": "flops", "value": round(heads_share + 0.05, 3)}, steps=1)
    budget = plan_budget(model, spec)
    alive = Masks.full(model, ["heads", "neurons"]).alive()
    scores = {kind: torch.ones(mask.shape) for kind, mask in alive.items()}
    plan, log, _ = select_measured(budget, 0, scores, alive, lambda a: float(_removed(a, "neurons")), parts=1)
    after = apply_plan_to_masks(plan, alive)
    assert int(after["heads"].sum(1).max()) == 2  # every removable head went first, then the rest
    assert budget.total_flops - masked_flops(model, after, budget.costs.seq_len) >= budget.goals[0]
    assert [s["kind"] for s in log] == ["heads", "rest"] and _removed(after, "neurons") > 0


def test_masked_loss_equals_the_physically_pruned_models_loss(task):
    model, tok, train, _ = task
    alive = Masks.full(model, ["heads", "neurons"]).alive()
    alive["heads"][0, :2] = False
    alive["neurons"][1, ::3] = False
    batches = sample_batches(train, tok, 32, 16, seed=0)
    pruned = pruned_units_copy(model, masks_to_plan(alive)).eval()
    with torch.no_grad():
        losses = [F.cross_entropy(pruned(**model_inputs(b)).logits, b["labels"], reduction="sum") for b in batches]
    expected = float(sum(losses)) / sum(len(b["labels"]) for b in batches)
    assert masked_loss(model, batches, alive) == pytest.approx(expected, abs=1e-5)
    full = {k: torch.ones_like(v) for k, v in alive.items()}
    assert masked_loss(model, batches, full) != pytest.approx(expected, abs=1e-6)


def test_kept_loss_runs_on_the_kept_units_and_equals_the_masked_originals_loss(task):
    """The allocation's passes run on a pruned copy of the step's units: any narrower mask gives the masked
    original's loss (a layer gated whole included), and a mask that revives a removed unit is refused."""
    model, tok, train, _ = task
    batches = sample_batches(train, tok, 32, 16, seed=0)
    kept = Masks.full(model, ["heads", "neurons"])
    kept.heads[0, :2] = False
    kept.neurons[1, ::3] = False
    loss = kept_loss(model, batches, kept)
    narrower = kept.clone()
    narrower.heads[1, 0] = False
    narrower.neurons[0, :5] = False
    whole_layer = kept.clone()
    whole_layer.heads[1] = False
    whole_layer.neurons[1] = False
    for alive in (kept, narrower, whole_layer):
        assert loss(alive) == pytest.approx(masked_loss(model, batches, alive), abs=1e-5)
    assert loss(narrower) != pytest.approx(loss(kept), abs=1e-6)
    with pytest.raises(ValueError, match="already removed"):
        loss(Masks.full(model, ["heads", "neurons"]))


def test_prune_logs_the_measured_slices_and_meets_the_flop_budget(task):
    model, tok, train, val = task
    total = masked_flops(model, {}, 64)
    result = compressor.prune(model, tok, train, _spec(), validation=val)
    for step in result.steps:
        assert {s["kind"] for s in step["allocation"]} <= {"heads", "neurons", "rest"}
        assert step["allocation"][0]["loss_before"] > 0
    assert total - masked_flops(model, result.masks.alive(), 64) >= 0.4 * total
    ratio = compressor.prune(task[0], tok, train, _spec(allocation="ratio"), validation=val)
    assert all("allocation" not in step for step in ratio.steps)


def test_allocation_examples_limits_the_loss_passes_to_the_first_scoring_batches(task):
    """`allocation_examples` makes the measured passes read the first batches of the scoring sample only (a
    post-training sample of thousands need not be read nine times a step); null reads them all."""
    model, tok, train, _ = task
    batches = sample_batches(train, tok, 32, 16, seed=0, by_length=True)  # the loop's scoring batches
    full = Masks.full(model, ["heads", "neurons"])
    expected = [masked_loss(model, part, full) for part in (batches[:1], batches)]
    specs = [_spec(steps=1, allocation_examples=n) for n in (16, None)]
    runs = [compressor.prune(copy.deepcopy(model), tok, train, spec) for spec in specs]
    assert [r.steps[0]["allocation"][0]["loss_before"] for r in runs] == pytest.approx(expected, abs=1e-5)
    assert expected[0] != pytest.approx(expected[1], abs=1e-4)


def _full_and_thin_layer_1(model) -> tuple[Masks, Masks]:
    """Every unit of `model`, and the same with layer 1 thin (2 heads, a quarter of its FFN neurons left)."""
    full = Masks.full(model, ["heads", "neurons"])
    thinned = full.clone()
    thinned["heads"][1, 2:] = False
    thinned["neurons"][1, thinned["neurons"].shape[1] // 4 :] = False
    return full, thinned


def test_whole_layers_compete_as_a_kind_by_the_measured_loss_of_dropping_each(task):
    """With `layers`, a thin layer (a quarter of its neurons, its minimum of heads) whose removal costs no loss
    goes whole (its last heads too, though kept layers hold `min_heads_per_layer`); the other kinds are untouched
    while the loss says they cost more. A full-width layer does not compete whole, however cheap its drop looks:
    width goes first (`allocation.THIN`)."""
    model = task[0]
    spec = _spec(units=["heads", "neurons", "layers"], min_heads_per_layer=2, budget={"kind": "flops", "value": 0.5})
    budget = plan_budget(model, spec)
    full, thinned = _full_and_thin_layer_1(model)
    assert thin_layers(thinned, 2) == {1} and thin_layers(full, 2) == set()
    scores = {kind: torch.rand(mask.shape, generator=torch.Generator().manual_seed(0)) for kind, mask in full.items()}

    def loss(a) -> float:  # dropping layer 1 is free; every other removal costs
        others = [layer for layer in range(3) if layer != 1]
        return sum(float((~a[kind][others]).sum()) for kind in a) + 0.01 * float((~a["heads"][1]).sum() == 0)

    plan, log, _ = select_measured(budget, 0, scores, thinned, loss, parts=2, layers=True)
    after = apply_plan_to_masks(plan, thinned)
    assert "layers" in [s["kind"] for s in log]
    assert not after["heads"][1].any() and not after["neurons"][1].any()  # layer 1 removed whole
    assert after["heads"][[0, 2]].all() and after["neurons"][[0, 2]].all()
    removed = budget.total_flops - masked_flops(model, after, budget.costs.seq_len)
    assert removed >= budget.goals[0]
    without = select_measured(budget, 0, scores, thinned, loss, parts=2)[1]
    assert "layers" not in [s["kind"] for s in without]  # only when asked
    at_full_width = select_measured(budget, 0, scores, full, loss, parts=2, layers=True)[1]
    assert at_full_width and "layers" not in [s["kind"] for s in at_full_width]


def test_prune_with_layer_units_removes_layers_and_the_pruned_model_matches(task):
    """End to end on the tiny model: a FLOP budget beyond what heads (kept ≥ 3 of 4 per layer) and neurons can
    give alone is reached by dropping layers whole; the physically pruned model equals the masked one."""
    model, tok, train, val = task
    spec = _spec(units=["heads", "neurons", "layers"], min_heads_per_layer=3, budget={"kind": "flops", "value": 0.75})
    result = compressor.prune(model, tok, train, spec, validation=val)
    total = masked_flops(model, {}, 64)
    assert total - masked_flops(model, result.masks.alive(), 64) >= 0.75 * total
    heads = result.masks.heads.sum(1)
    assert (heads == 0).any() and ((heads == 0) | (heads >= 3)).all()  # kept layers keep their minimum
    batch = next(iter(sample_batches(val, tok, 16, 16, seed=0)))
    pruned = result.pruned()
    with torch.inference_mode(), gated(result.model.eval(), result.masks.head_gates(), result.masks.neuron_gates()):
        masked = result.model(**model_inputs(batch)).logits
    with torch.inference_mode():
        assert float((masked - pruned(**model_inputs(batch)).logits).abs().max()) < 1e-4
    assert len(pruned.config.removed_layers) == int((heads == 0).sum())


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"units": ["heads", "layers"]}, "'layers' needs units heads and neurons too"),
        ({"allocation": "ratio"}, "allocation 'measured'"),
        ({"uniform_ffn": True}, "uniform_ffn off"),
    ],
)
def test_layer_units_need_heads_neurons_and_measured_allocation(overrides, words):
    base = {"units": ["heads", "neurons", "layers"]}
    with pytest.raises(ValueError, match=words):
        _spec(**(base | overrides))


def test_masked_loss_runs_under_the_accelerators_autocast(task):
    """The allocation's loss passes run in the run's precision (`accelerator.autocast()`): with bf16 autocast the
    loss moves off the fp32 one by bf16's rounding only, and without an accelerator it is the fp32 loss."""
    from accelerate import Accelerator

    model, tok, train, _ = task
    batches = sample_batches(train, tok, 32, 16, seed=0)
    alive = Masks.full(model, ["heads", "neurons"]).alive()
    alive["heads"][0, :2] = False
    acc = Accelerator(cpu=True)
    exact = masked_loss(model, batches, alive, acc)
    assert exact == pytest.approx(masked_loss(model, batches, alive), abs=1e-6)
    acc.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    cast = masked_loss(model, batches, alive, acc)
    assert cast == pytest.approx(exact, rel=0.05) and cast != exact


def test_layer_drops_are_measured_only_for_the_layers_a_step_offers(task, monkeypatch):
    """With `layers`, a step measures a layer's drop only when that layer is offered (thin) or the finish needs
    every layer: at full width no layer-drop pass runs, with one thin layer only its own; the values are those of
    measuring every layer on the step's units (`layer_drop_increases`), so the plan is the same."""
    from compressor.pruning import allocation

    model = task[0]
    spec = _spec(units=["heads", "neurons", "layers"], min_heads_per_layer=2, budget={"kind": "flops", "value": 0.3})
    budget = plan_budget(model, spec)
    full, thinned = _full_and_thin_layer_1(model)
    scores = {kind: torch.rand(mask.shape, generator=torch.Generator().manual_seed(0)) for kind, mask in full.items()}

    def loss(a) -> float:  # a removal in a lower layer costs less
        return sum(float(((~a[kind]).float().sum(1) * torch.arange(1.0, 4.0)).sum()) for kind in a)

    measured: list[int] = []
    real = allocation.layer_drop_increases
    spy = lambda a, f, b, layers=None: measured.extend(layers) or real(a, f, b, layers)  # noqa: E731
    monkeypatch.setattr(allocation, "layer_drop_increases", spy)
    select_measured(budget, 0, scores, full, loss, parts=2, layers=True)
    assert measured == []
    lazy = select_measured(budget, 0, scores, thinned, loss, parts=2, layers=True)[0]
    assert measured == [1]
    eager_of = allocation.LayerDrops.of
    monkeypatch.setattr(
        allocation.LayerDrops, "of", lambda self, layers: (eager_of(self, range(3)), eager_of(self, layers))[1]
    )
    assert select_measured(budget, 0, scores, thinned, loss, parts=2, layers=True)[0] == lazy
    assert allocation.LayerDrops(thinned, loss, loss(thinned)).all() == real(thinned, loss, loss(thinned))
