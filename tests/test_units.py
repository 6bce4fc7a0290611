"""FFN neurons and whole layers as prunable units: masked == pruned == reloaded, across architectures."""

from __future__ import annotations

import copy
import json
from functools import cache

import pytest
import torch
from conftest import cli
from transformers import AutoModelForSequenceClassification

from compressor.pruning.masking import full_gates, full_neuron_gates, gated
from compressor.pruning.units import Masks, alive_units, apply_plan_to_masks
from compressor.surgery.arch import (
    arch_spec,
    get_path,
    layers,
    neuron_presence_mask,
    original_ffn_size,
    present_heads,
    present_neurons,
    removed_layers,
)
from compressor.surgery.checkpoint import PLAN_FILE, load_pruned, save_pruned
from compressor.surgery.portable import LAYOUT_KEY
from compressor.surgery.positions import cut_positions
from compressor.surgery.slicing import (
    PlanError,
    SkippedLayer,
    prune_neurons,
    pruned_copy,
    remove_layers,
)
from compressor.testing import ARCHS, tiny_batch, tiny_model

LAYERS, HEADS = 3, 4
INPUTS = {k: v for k, v in tiny_batch(batch=3, seq=9).items() if k != "labels"}


@cache
def base(arch: str) -> torch.nn.Module:
    return tiny_model(arch, layers=LAYERS, heads=HEADS, head_size=8)


def every(arch: str) -> list[int]:
    return list(range(original_ffn_size(base(arch))))


def uneven_plan(arch: str) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Layer 0: some heads and every other neuron; layer 1: everything (removed); layer 2: no neuron left."""
    heads = {0: [1, 3], 1: list(range(HEADS)), 2: [2]}
    return heads, {0: every(arch)[::2], 1: every(arch), 2: every(arch)}


def gates_for(arch: str, heads: dict, neurons: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g, n = full_gates(base(arch)), full_neuron_gates(base(arch))
    for layer, ids in heads.items():
        g[layer, ids] = 0.0
    for layer, ids in neurons.items():
        n[layer, ids] = 0.0
    return g, n


def logits(model: torch.nn.Module, gates=None, neurons=None, **kwargs) -> torch.Tensor:
    with torch.no_grad(), gated(model, gates, neurons):
        return model(**INPUTS, **kwargs).logits


@pytest.mark.parametrize("arch", ARCHS)
def test_neuron_and_layer_removal_matches_masking(arch: str) -> None:
    """Gating units to 0 (the dead layer skipped) gives the pruned model's logits, with and without attentions."""
    heads, neurons = uneven_plan(arch)
    pruned = pruned_copy(base(arch), heads, neurons)
    ref = logits(base(arch), *gates_for(arch, heads, neurons))
    torch.testing.assert_close(logits(pruned), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(pruned, output_attentions=True), ref, atol=1e-5, rtol=0)
    assert removed_layers(pruned) == [1]
    assert isinstance(layers(pruned)[1], SkippedLayer) and not list(layers(pruned)[1].parameters())
    assert [len(n) for n in present_neurons(pruned)] == [len(every(arch)) - len(every(arch)[::2]), 0, 0]
    assert present_heads(pruned) == [[0, 2], [], [0, 1, 3]]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_changed_pruned_copy_writes_back_into_the_masked_model(arch: str) -> None:
    """`Masks.write_back`: every weight of a pruned copy, once changed, lands in the slot it was cut from, so the
    masked model computes what the changed copy computes; the slots surgery dropped keep their weights."""
    heads, neurons = uneven_plan(arch)
    masks = Masks.full(base(arch), ("heads", "neurons")).without({"heads": heads, "neurons": neurons})
    model, gates = copy.deepcopy(base(arch)), gates_for(arch, heads, neurons)
    changed = masks.pruned_copy(model)
    with torch.no_grad():
        for param in changed.parameters():
            param.add_(0.3 * torch.randn_like(param))
    masks.write_back(model, changed)
    torch.testing.assert_close(logits(model, *gates), logits(changed), atol=1e-5, rtol=0)
    assert not torch.allclose(logits(model, *gates), logits(base(arch), *gates), atol=1e-2)
    untouched, removed = dict(base(arch).named_parameters()), {id(p) for p in layers(model)[1].parameters()}
    dead = [(name, p) for name, p in model.named_parameters() if id(p) in removed]  # layer 1: removed whole
    assert dead and all(torch.equal(p, untouched[name]) for name, p in dead)


def remade(model: torch.nn.Module) -> torch.nn.Module:
    model.classifier = torch.nn.Linear(model.classifier.in_features, model.classifier.out_features)
    return model


def zeroed(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        model.classifier.weight.zero_()
    return model


@pytest.mark.parametrize("cut", [remade, zeroed])
def test_cut_positions_refuse_a_cut_that_makes_weights(cut) -> None:
    """A cut that put weights of its own in the model (random or zeros) cannot be written back, and says so."""
    with pytest.raises(RuntimeError, match="classifier"):
        cut_positions(base("bert"), cut)


@pytest.mark.parametrize("arch", ARCHS)
def test_skipped_layer_is_identity(arch: str) -> None:
    """A removed layer passes its input through: removing every layer leaves embeddings → classifier. Its output
    still counts as that layer's hidden state (layers + 1 entries), also when the model had reported hidden states
    before the removal (transformers installs its capture hooks once, on the first such forward)."""
    fresh = remove_layers(pruned_copy(base(arch), {}), range(LAYERS))
    used = pruned_copy(base(arch), {})
    used(**INPUTS, output_hidden_states=True)
    remove_layers(used, range(LAYERS))
    for model in (fresh, used):
        last: list[torch.Tensor] = []
        hook = layers(model)[-1].register_forward_hook(
            lambda _m, _a, output, last=last: last.append(output[0] if isinstance(output, tuple) else output)
        )
        with torch.no_grad():
            out = model(**INPUTS, output_hidden_states=True)
        hook.remove()
        assert len(out.hidden_states) == LAYERS + 1
        states = [*out.hidden_states[:-1], *last]  # the last entry is the encoder's output (ModernBERT: final norm)
        for before, after in zip(states, states[1:], strict=False):
            torch.testing.assert_close(before, after, atol=0, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_of_pruned_model_line_up_with_the_masked_original(arch: str) -> None:
    """`output_hidden_states` of a model with a removed layer has one entry per original layer, each equal to the
    masked original's (the removed layer's entry is its input)."""
    heads, neurons = uneven_plan(arch)
    pruned = pruned_copy(base(arch), heads, neurons)
    reference = tiny_model(arch, layers=LAYERS, heads=HEADS, head_size=8)  # fresh: no capture hooks installed yet
    with torch.no_grad(), gated(reference, *gates_for(arch, heads, neurons)):
        expected = reference(**INPUTS, output_hidden_states=True).hidden_states
    with torch.no_grad():
        got = pruned(**INPUTS, output_hidden_states=True).hidden_states
    assert len(got) == len(expected) == LAYERS + 1
    for layer, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0, msg=f"hidden state {layer}")
    torch.testing.assert_close(got[2], got[1], atol=0, rtol=0)  # layer 1 was removed


def test_layer_is_not_skipped_while_a_unit_is_open() -> None:
    """Heads at 0 but one neuron open: the layer still runs (output differs from the skipped layer)."""
    heads, neurons = {1: list(range(HEADS))}, {1: every("bert")[1:]}
    open_one = logits(base("bert"), *gates_for("bert", heads, neurons))
    skipped = logits(base("bert"), *gates_for("bert", heads, {1: every("bert")}))
    assert not torch.allclose(open_one, skipped, atol=1e-4)
    torch.testing.assert_close(logits(pruned_copy(base("bert"), heads, neurons)), open_one, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_neuron_gates_on_pruned_model_index_original_ids(arch: str) -> None:
    """Random neuron gates on a neuron-pruned model == the same gates on the original with removed ones at 0."""
    pruned = pruned_copy(base(arch), {}, {0: every(arch)[::3], 2: every(arch)[1::2]})
    gates = torch.rand(LAYERS, len(every(arch)), generator=torch.Generator().manual_seed(0)) * 1.5
    ref = logits(base(arch), None, gates * neuron_presence_mask(pruned).float())
    torch.testing.assert_close(logits(pruned, None, gates), ref, atol=1e-5, rtol=0)


def test_neuron_rounds_compose_and_replay_idempotently() -> None:
    """Two rounds == one round with the union; replaying the cumulative plan changes nothing."""
    first, second = {0: [1, 5]}, {0: [2], 2: [7]}
    twice = prune_neurons(pruned_copy(base("bert"), {}, first), second)
    once = pruned_copy(base("bert"), {}, {0: [1, 2, 5], 2: [7]})
    torch.testing.assert_close(logits(twice), logits(once), atol=1e-6, rtol=0)
    before = logits(twice)
    prune_neurons(twice, {0: [1, 2, 5], 2: [7]})
    torch.testing.assert_close(logits(twice), before, atol=0, rtol=0)
    assert twice.config.pruned_neurons == {0: [1, 2, 5], 2: [7]}


@pytest.mark.parametrize(
    ("plan", "message"),
    [({0: [10_000]}, r"layer 0 neurons \[10000\] out of range; expected 0\.\.66"), ({5: [1]}, "layer 5 out of range")],
)
def test_bad_neuron_plan_is_refused_before_changes(plan: dict, message: str) -> None:
    model = pruned_copy(base("bert"), {})
    with pytest.raises(PlanError, match=message):
        prune_neurons(model, plan)
    assert present_neurons(model) == present_neurons(base("bert"))
    with pytest.raises(PlanError, match="layers \\[7\\] out of range"):
        remove_layers(model, [7])


def remote(path) -> torch.nn.Module:
    """Plain transformers with the shipped modeling file (no compressor code involved in building the model)."""
    model = AutoModelForSequenceClassification.from_pretrained(
        path, trust_remote_code=True, attn_implementation="eager"
    )
    assert type(model).__module__.startswith("transformers_modules.")
    return model.eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_uneven_widths_and_removed_layers_reload(arch: str, tmp_path) -> None:
    """Uneven FFN widths, an FFN without neurons and a removed layer reload exactly through `load_pruned` and through
    plain transformers running the shipped code; the layout in config.json says what each layer kept."""
    heads, neurons = uneven_plan(arch)
    pruned = pruned_copy(base(arch), heads, neurons)
    path = save_pruned(pruned, tmp_path / f"uneven-{arch}", original=base(arch))
    plan = json.loads((path / PLAN_FILE).read_text())
    assert plan["removed_layers"] == [1] and "plain_loadable" not in plan
    assert plan["pruned_neurons"] == {str(k): v for k, v in neurons.items()}
    width = len(every(arch))
    layout = json.loads((path / "config.json").read_text())[LAYOUT_KEY]
    assert layout["ffn_size"] == width and layout["num_heads"] == HEADS
    assert layout["blocks"] == [
        {"heads": 2, "ffn": width - len(every(arch)[::2])},
        {"removed": True},
        {"heads": 3, "ffn": 0},
    ]
    card = (path / "README.md").read_text()
    assert "trust_remote_code=True" in card and "compressor.load_pruned" in card
    for loaded in (load_pruned(path, attn_implementation="eager"), remote(path)):
        torch.testing.assert_close(logits(loaded), logits(pruned), atol=0, rtol=0)
        assert present_neurons(loaded) == present_neurons(pruned)
        assert present_heads(loaded) == present_heads(pruned) and removed_layers(loaded) == [1]
        assert get_path(layers(loaded)[2], arch_spec(loaded).ffn_in).out_features == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_uniform_widths_save_the_original_config_and_survive_a_plain_resave(arch: str, tmp_path) -> None:
    """Equal FFN widths no longer rewrite the config (transformers 5 cannot build pruned heads from it anyway): the
    original width is saved, the layout carries the pruned one. A model plain transformers loaded and re-saved
    (no plan file any more, the shipped code copied along) still loads both ways with its original ids."""
    neurons = {layer: every(arch)[layer::4] for layer in range(LAYERS)}
    pruned = pruned_copy(base(arch), {0: [1]}, neurons)
    path = save_pruned(pruned, tmp_path / f"uniform-{arch}", original=base(arch))
    saved = json.loads((path / "config.json").read_text())
    assert saved.get("intermediate_size", saved.get("hidden_dim")) == len(every(arch))
    assert "compressor_ffn_size" not in saved and "plain_loadable" not in json.loads((path / PLAN_FILE).read_text())
    assert {b["ffn"] for b in saved[LAYOUT_KEY]["blocks"]} == {len(every(arch)) - len(every(arch)[::4])}
    assert not hasattr(pruned.config, "compressor_ffn_size") and not hasattr(pruned.config, LAYOUT_KEY)
    plain = remote(path)
    torch.testing.assert_close(logits(plain), logits(pruned), atol=0, rtol=0)
    assert present_neurons(plain) == present_neurons(pruned)  # original ids survive the plain load
    ours = load_pruned(path, attn_implementation="eager")
    torch.testing.assert_close(logits(ours), logits(pruned), atol=0, rtol=0)
    assert original_ffn_size(ours) == len(every(arch))
    plain.save_pretrained(tmp_path / f"resaved-{arch}")  # a user re-saves it with plain transformers
    assert not (tmp_path / f"resaved-{arch}" / PLAN_FILE).exists()
    for again in (
        load_pruned(tmp_path / f"resaved-{arch}", attn_implementation="eager"),
        remote(tmp_path / f"resaved-{arch}"),
    ):
        torch.testing.assert_close(logits(again), logits(pruned), atol=0, rtol=0)
        assert present_neurons(again) == present_neurons(pruned) and present_heads(again) == present_heads(pruned)


def test_ffn_paths_point_at_the_feed_forward_linears() -> None:
    for arch in ARCHS:
        spec, layer = arch_spec(base(arch)), layers(base(arch))[0]
        width = len(every(arch))
        assert get_path(layer, spec.ffn_in).out_features == spec.ffn.neuron_rows() * width  # gated: input + gate
        assert get_path(layer, spec.ffn_out).in_features == width


# --- cost, selection under a FLOP budget --------------------------------------------------------------------


def test_unit_costs_add_up_to_the_model() -> None:
    """Every original layer costs its heads plus its neurons, and the encoder is its layers."""
    from compressor.surgery.cost import encoder_flops, unit_costs

    costs = unit_costs(base("bert"), 16)
    assert costs.layer == HEADS * costs.head + len(every("bert")) * costs.neuron
    assert encoder_flops(base("bert"), 16) == LAYERS * costs.layer
    assert encoder_flops(pruned_copy(base("bert"), {}, {0: [1, 2]}), 16) == LAYERS * costs.layer - 2 * costs.neuron


def _budget_case(uniform: bool, flops: float, seed: int = 0):
    from compressor.pruning.selection import flop_schedule, select_units
    from compressor.pruning.units import pruned_units_copy
    from compressor.surgery.cost import encoder_flops, unit_costs

    model = base("bert")
    g = torch.Generator().manual_seed(seed)
    alive = alive_units(model)
    scores = {kind: torch.rand(mask.shape, generator=g) for kind, mask in alive.items()}
    costs = unit_costs(model, 32)
    total = encoder_flops(model, 32)
    (goal,) = flop_schedule(total, flops, steps=1)
    plan = select_units(scores, alive, costs, goal, uniform_ffn=uniform)
    return model, plan, pruned_units_copy(model, plan), costs, total, goal, scores


@pytest.mark.parametrize("flops", [0.1, 0.35, 0.6, 0.8])
@pytest.mark.parametrize("uniform", [False, True])
def test_flop_budget_lands_within_one_unit(flops: float, uniform: bool) -> None:
    """The pruned model's FLOPs are at or below the budget, by less than one unit (a uniform column is one)."""
    from compressor.surgery.checkpoint import uniform_ffn_width
    from compressor.surgery.cost import encoder_flops, masked_flops

    model, plan, pruned, costs, total, goal, scores = _budget_case(uniform, flops)
    removed = total - encoder_flops(pruned, 32)
    assert masked_flops(model, apply_plan_to_masks(plan, alive_units(model)), 32) == encoder_flops(pruned, 32)
    biggest = max(costs.head, costs.neuron * (LAYERS if uniform else 1))
    assert goal <= removed < goal + biggest
    if uniform:
        assert uniform_ffn_width(pruned) not in (None, 0)
        return
    # Greedy by importance per FLOP: every removed unit ranks below every kept one, whatever its kind.
    ratio = {kind: scores[kind] / costs.of(kind) for kind in scores}
    kept = apply_plan_to_masks(plan, alive_units(model))
    worst_removed = max(float(ratio[k][alive_units(model)[k] & ~kept[k]].max()) for k in ratio if plan[k])
    best_kept = min(float(ratio[k][kept[k]].min()) for k in ratio if kept[k].any())
    assert worst_removed <= best_kept


def test_unreachable_flop_budget_is_refused() -> None:
    """0.9 of the FLOPs cannot go when every layer keeps a head and a neuron (uniform_ffn), nor with heads only."""
    from compressor.pruning.selection import check_flop_budget
    from compressor.recipe import RecipeError
    from compressor.surgery.cost import unit_costs

    costs = unit_costs(base("bert"), 32)
    shape = {kind: tuple(mask.shape) for kind, mask in alive_units(base("bert")).items()}
    check_flop_budget(costs, shape, 0.9, ["heads", "neurons"])
    check_flop_budget(costs, shape, 0.8, ["heads", "neurons"], uniform_ffn=True)
    with pytest.raises(
        RecipeError, match=r"prune\.budget\.value: a FLOP fraction of 0\.9 cannot be reached .*expected ≤ 0\.847"
    ):
        check_flop_budget(costs, shape, 0.9, ["heads", "neurons"], uniform_ffn=True)
    with pytest.raises(RecipeError, match=r"expected ≤ 0\.589"):
        check_flop_budget(costs, shape, 0.6, ["heads"])


def test_units_compete_on_importance_per_flop() -> None:
    """Heads score twice their cost, neurons once theirs, except one head at half its cost: that head goes first,
    then neurons (lower importance per FLOP than the other heads), though each head's raw score is far higher."""
    from compressor.pruning.selection import select_units
    from compressor.surgery.cost import unit_costs

    model = base("bert")
    alive = alive_units(model)
    costs = unit_costs(model, 32)
    scores = {
        "heads": torch.full(alive["heads"].shape, 2.0 * costs.head),
        "neurons": torch.ones(alive["neurons"].shape),
    }
    scores["heads"][1, 2] = 0.5 * costs.head  # half a neuron's importance per FLOP: cheapest to lose
    scores["neurons"] *= costs.neuron
    plan = select_units(scores, alive, costs, costs.head + 3 * costs.neuron)
    assert plan["heads"] == {1: [2]}
    assert sum(len(v) for v in plan["neurons"].values()) == 3


def test_min_heads_per_layer_holds_under_a_flop_budget() -> None:
    from compressor.pruning.selection import select_units
    from compressor.surgery.cost import unit_costs

    alive = alive_units(base("bert"))
    scores = {"heads": torch.zeros(alive["heads"].shape), "neurons": torch.ones(alive["neurons"].shape)}
    plan = select_units(scores, alive, unit_costs(base("bert"), 32), 10**12, min_heads_per_layer=1)
    assert all(HEADS - len(ids) >= 1 for ids in plan["heads"].values())


# --- criteria for neurons, and refusal at validate ----------------------------------------------------------

BATCHES = [tiny_batch(batch=4, seq=9, seed=s) for s in range(2)]
NEURON_CRITERIA = {"taylor": {}, "l0": {"steps": 20}, "magnitude": {}, "random": {}, "ablation": {"examples": 8}}


def _masked_and_pruned(arch: str = "bert"):
    """A model with neurons of layer 0 physically removed, and alive masks that also mask some of layer 2."""
    model = pruned_copy(base(arch), {}, {0: every(arch)[:10]})
    alive = alive_units(model)
    alive["neurons"][2, 5:9] = False
    return model, alive


@pytest.mark.parametrize("name", sorted(NEURON_CRITERIA))
def test_criteria_score_neurons_by_original_id(name: str) -> None:
    """[layers, FFN width] scores: -inf exactly on removed or masked neurons, finite on every alive one."""
    from compressor.pruning.units import score_all

    model, alive = _masked_and_pruned()
    scores = score_all(name, model, alive, BATCHES, NEURON_CRITERIA[name])
    assert scores["neurons"].shape == (LAYERS, len(every("bert")))
    assert torch.isfinite(scores["neurons"][alive["neurons"]]).all()
    assert (scores["neurons"][~alive["neurons"]] == float("-inf")).all()
    assert scores["heads"].shape == (LAYERS, HEADS)


def _loss(model: torch.nn.Module, neurons: torch.Tensor | None = None) -> float:
    with torch.no_grad(), gated(model, None, neurons):
        return sum(float(model(**b).loss) * b["labels"].numel() for b in BATCHES) / sum(
            b["labels"].numel() for b in BATCHES
        )


def test_ablation_neuron_score_is_the_loss_change_of_removing_it() -> None:
    from compressor.pruning.units import score_all

    model, alive = _masked_and_pruned()
    scores = score_all("ablation", model, alive, BATCHES, {"examples": 8})["neurons"]
    before = _loss(model, alive["neurons"].float())
    for layer, neuron in [(0, 20), (1, 3), (2, 40)]:
        without = alive["neurons"].clone()
        without[layer, neuron] = False
        assert scores[layer, neuron] == pytest.approx(_loss(model, without.float()) - before, abs=1e-5)


def test_taylor_neuron_without_effect_scores_zero() -> None:
    """A neuron whose W_2 column is zero cannot change the loss: its mask gradient, hence its score, is 0."""
    from compressor.pruning.units import score_all
    from compressor.surgery.arch import arch_spec

    model = pruned_copy(base("bert"), {})
    with torch.no_grad():
        get_path(layers(model)[1], arch_spec(model).ffn_out).weight[:, 7] = 0.0
    scores = score_all("taylor", model, alive_units(model), BATCHES, {"normalize": "none"})["neurons"]
    assert scores[1, 7] == 0.0
    assert (scores.flatten().topk(10).values > 0).all()


def test_magnitude_neuron_scores_survive_surgery() -> None:
    """Data-free magnitudes of present neurons are the same before and after removing others (original ids)."""
    from compressor.pruning.units import score_all

    model, alive = _masked_and_pruned()
    full = score_all("magnitude", base("bert"), alive_units(base("bert")), BATCHES)["neurons"]
    pruned = score_all("magnitude", model, alive_units(model), BATCHES)["neurons"]
    present = neuron_presence_mask(model)
    torch.testing.assert_close(pruned[present], full[present])


def test_head_scores_with_neurons_masked_equal_scores_on_the_pruned_model() -> None:
    """Scoring heads holds the neuron mask fixed: taylor on masked neurons == taylor after removing them."""
    from compressor.pruning.units import score_all

    model, alive = _masked_and_pruned()
    masked = score_all("taylor", model, alive, BATCHES)["heads"]
    removed = pruned_copy(model, {}, {2: list(range(5, 9))})
    torch.testing.assert_close(score_all("taylor", removed, alive_units(removed), BATCHES)["heads"], masked)


def test_criterion_that_cannot_score_neurons_is_refused() -> None:
    from compressor.pruning import criteria
    from compressor.recipe import RecipeError, parse_recipe

    assert set(NEURON_CRITERIA) <= set(criteria.scoring("neurons"))
    assert "confidence" not in criteria.scoring("neurons")
    prune = {
        "units": ["heads", "neurons"],
        "budget": {"kind": "flops", "value": 0.5},
        "criterion": {"name": "confidence"},
    }
    with pytest.raises(RecipeError, match=r"prune\.criterion\.name: 'confidence' cannot score neurons; expected one"):
        parse_recipe({"prune": prune})
    neurons = alive_units(base("bert"))["neurons"]
    ctx = criteria.ScoreContext(model=base("bert"), alive=neurons, batches=BATCHES, unit="neurons")
    with pytest.raises(ValueError, match="'entropy' cannot score neurons"):
        criteria.score_units("entropy", ctx)


@pytest.mark.parametrize(
    ("prune", "message"),
    [
        ({"units": ["heads", "neurons"]}, "prune.units: 'neurons' needs budget"),
        ({"target": 0.3, "budget": {"kind": "flops", "value": 0.5}}, "prune.budget: give target"),
        ({"uniform_ffn": True}, "prune.uniform_ffn: only applies"),
        ({"budget": {"kind": "flops", "value": 1.2}}, "prune.budget.value: for kind 'flops' expected a fraction"),
        ({"units": ["rows"]}, "prune.units.0: Input should be 'heads', 'neurons', 'layers' or 'hidden'"),
        ({"units": ["layers"]}, "prune.units: 'layers' needs units heads and neurons too"),
    ],
)
def test_unit_recipe_errors_name_the_field(prune: dict, message: str) -> None:
    from compressor.recipe import RecipeError, parse_recipe

    with pytest.raises(RecipeError, match=message.replace(".", r"\.")):
        parse_recipe({"prune": prune})


def test_head_only_recipes_are_unchanged() -> None:
    from compressor.recipe import parse_recipe

    spec = parse_recipe({"prune": {"target": 0.4}}).prune
    assert spec.units == ["heads"] and spec.budget is None and spec.uniform_ffn is False and spec.target == 0.4
    spec = parse_recipe(
        {"prune": {"units": ["heads", "neurons"], "budget": {"kind": "flops", "value": 0.5}, "uniform_ffn": True}}
    )
    assert spec.prune.budget.kind == "flops" and spec.prune.budget.value == 0.5 and spec.prune.budget.seq_len == 64


def test_cli_validate_refuses_criterion_for_neurons_in_one_line(tmp_path) -> None:
    import yaml

    recipe = tmp_path / "r.yaml"
    prune = {
        "units": ["heads", "neurons"],
        "budget": {"kind": "flops", "value": 0.5},
        "criterion": {"name": "attribution"},
    }
    recipe.write_text(yaml.safe_dump({"prune": prune}))
    result = cli("validate", str(recipe))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"compressor: error: {recipe}: prune.criterion.name: 'attribution' cannot score neurons; expected one of "
        "['ablation', 'fisher', 'l0', 'magnitude', 'random', 'taylor']"
    ]


@pytest.mark.parametrize(
    ("target", "steps", "shape", "expected"),
    [
        (0.75, 6, "linear", [9, 18, 27, 36, 45, 54]),
        (0.75, 6, "geometric", [15, 27, 36, 43, 49, 54]),  # each step removes ~21% of what is left
        (0.5, 4, "geometric", [11, 21, 29, 36]),
        (0.5, 1, "geometric", [36]),
    ],
)
def test_head_schedules_end_at_the_target(target, steps, shape, expected) -> None:
    from compressor.pruning.selection import flop_schedule, schedule

    assert schedule(72, target, steps, shape) == expected
    flops = flop_schedule(10**9, target, steps, shape)
    assert flops[-1] == round(target * 10**9) and flops == sorted(flops)
    if shape == "geometric" and steps > 1:  # later steps remove less than earlier ones
        amounts = [b - a for a, b in zip([0, *flops], flops, strict=False)]
        assert amounts == sorted(amounts, reverse=True)


def test_masks_are_the_one_type_of_kept_units() -> None:
    """`Masks` reads as `{kind: mask}` over the kinds it tracks, switches a plan off in new tensors, and is what
    `alive_units` and `apply_plan_to_masks` return; its plan round-trips."""
    from compressor.pruning.units import Masks, masks_to_plan

    model = tiny_model("bert", layers=2, heads=4)
    heads_only = Masks.full(model)
    assert list(heads_only) == ["heads"] and "neurons" not in heads_only and len(heads_only) == 1
    with pytest.raises(KeyError):
        heads_only["neurons"]
    masks = Masks.full(model, ("heads", "neurons"))
    assert dict(masks) == {"heads": masks.heads, "neurons": masks.neurons}
    plan = {"heads": {0: [1, 3]}, "neurons": {1: [0, 5]}}
    after = masks.without(plan)
    assert isinstance(after, Masks) and bool(masks.heads.all()) and bool(masks.neurons.all())  # untouched
    assert after.heads_per_layer() == [2, 4] and int((~after.neurons).sum()) == 2
    assert masks_to_plan(after) == after.unit_plan() == plan
    assert isinstance(apply_plan_to_masks(plan, dict(masks)), Masks)
    present = alive_units(after.pruned_copy(model))
    assert isinstance(present, Masks) and present.heads_per_layer() == [2, 4]
