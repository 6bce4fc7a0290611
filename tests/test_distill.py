"""Distillation: teacher logits computed once and reused, weight 0 equals plain fine-tuning, the loss terms; and the
recovery that trains a masked model's pruned copy ends where training under the masks does."""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate import Accelerator
from conftest import tiny_recipe
from transformers import AutoTokenizer

from compressor.core.errors import UserError
from compressor.pipeline.runner import run_recipe
from compressor.pruning.masking import gated, passthrough_layers
from compressor.pruning.units import Masks
from compressor.recipe import DistillSpec, FinetuneSpec, parse_recipe
from compressor.recovery import distill
from compressor.recovery.draws import drawn_examples, recovery_examples
from compressor.recovery.evaluate import evaluate, evaluate_kept
from compressor.recovery.train import train, train_kept
from compressor.sources import load_task_data
from compressor.sources.batches import tokenize
from compressor.surgery.slicing import remove_layers
from compressor.testing import tiny_batch, tiny_model


@pytest.fixture(scope="module")
def train_split(tiny_model_dir, tiny_csv):
    """The tokenised train split of the fixture CSV and its tokenizer."""
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, "unused"))
    data = load_task_data(recipe.data)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tokenize(data.train, tokenizer, data.text_fields, 16), tokenizer


def count_rows(model: torch.nn.Module) -> list[int]:
    """A forward hook that records how many examples each forward of `model` saw."""
    seen: list[int] = []
    model.register_forward_hook(
        lambda module, args, kwargs, out: seen.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    return seen


SPEC = FinetuneSpec(epochs=1, lr=5e-4, batch_size=16, max_examples=64)


def test_teacher_logits_computed_once_and_reused(tmp_path, train_split) -> None:
    ds, tokenizer = train_split
    teacher, student = tiny_model("bert", seed=1), tiny_model("bert", seed=2, randomized=False)
    expected = teacher(**{k: torch.tensor([ds[3][k]]) for k in ("input_ids", "attention_mask", "token_type_ids")})
    forwards = count_rows(teacher)
    acc = Accelerator(cpu=True)
    targets = distill.load_or_compute(tmp_path / "t", teacher, ds, tokenizer, acc, DistillSpec(teacher_batch_size=50))
    assert sum(forwards) == len(ds) and len(forwards) == -(-len(ds) // 50)  # one forward per example, no more
    assert torch.allclose(targets.logits[3], expected.logits[0], atol=1e-5)
    for seed in range(2):  # two fine-tuning steps reuse the cached targets: the teacher is never run again
        train(student, ds, tokenizer, SPEC, acc, seed=seed, teacher=targets)
    again = distill.load_or_compute(tmp_path / "t", teacher, ds, tokenizer, acc, DistillSpec())
    assert sum(forwards) == len(ds), "teacher ran again instead of reusing its cached logits"
    assert torch.equal(again.logits, targets.logits) and again.teacher is None


def test_hidden_matching_runs_a_frozen_teacher_copy(tmp_path, train_split) -> None:
    """Only with hidden_weight > 0 is a teacher kept; it is a frozen copy that fine-tuning leaves untouched."""
    ds, tokenizer = train_split
    model = tiny_model("bert", seed=1, randomized=False)
    acc = Accelerator(cpu=True)
    targets = distill.load_or_compute(tmp_path / "t", model, ds, tokenizer, acc, DistillSpec(hidden_weight=1.0))
    assert targets.hidden and targets.teacher is not model
    before = copy.deepcopy(targets.teacher.state_dict())
    stats = train(model, ds, tokenizer, SPEC, acc, teacher=targets)
    assert stats["distill"]["hidden_weight"] == 1.0
    after = targets.teacher.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_weight_zero_reproduces_plain_finetuning_exactly(tmp_path, train_split) -> None:
    ds, tokenizer = train_split
    acc = Accelerator(cpu=True)
    plain, distilled = tiny_model("bert", randomized=False), tiny_model("bert", randomized=False)
    teacher = tiny_model("bert", seed=5)
    targets = distill.load_or_compute(tmp_path / "t", teacher, ds, tokenizer, acc, DistillSpec(alpha=0.0))
    torch.manual_seed(0)
    train(plain, ds, tokenizer, SPEC, acc, seed=3)
    torch.manual_seed(0)
    train(distilled, ds, tokenizer, SPEC, acc, seed=3, teacher=targets)
    weights = distilled.state_dict()
    assert all(torch.equal(v, weights[k]) for k, v in plain.state_dict().items())
    # Negative control: with the KL term on, the same run ends elsewhere.
    on = tiny_model("bert", randomized=False)
    torch.manual_seed(0)
    train(on, ds, tokenizer, SPEC, acc, seed=3, teacher=distill.TeacherTargets(targets.logits, DistillSpec(alpha=0.9)))
    assert any(not torch.equal(v, on.state_dict()[k]) for k, v in plain.state_dict().items())


def test_kd_loss_is_zero_only_at_the_teacher() -> None:
    logits = torch.tensor([[2.0, -1.0], [0.5, 0.5]])
    assert distill.kd_loss(logits, logits, 2.0).item() == pytest.approx(0.0, abs=1e-7)
    assert distill.kd_loss(-logits, logits, 2.0).item() > 0.1


def test_hidden_loss_ignores_padding() -> None:
    states = tuple(torch.randn(2, 5, 8) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    noisy = tuple(s.clone() for s in states)
    for s in noisy:
        s[0, 3:] += 100.0  # padding positions only
    assert distill.hidden_loss(noisy, states, mask).item() == 0.0
    assert distill.hidden_loss(states[::-1], states, mask).item() > 0.0


def test_hidden_loss_leaves_out_skipped_layers() -> None:
    states = tuple(torch.randn(2, 5, 8) for _ in range(4))
    mask = torch.ones(2, 5, dtype=torch.long)
    off = (states[0], states[1], states[2] + 3.0, states[3])  # layer 1 (hidden_states[2]) off the teacher's
    assert distill.hidden_loss(off, states, mask, skip={1}).item() == 0.0
    assert distill.hidden_loss(off, states, mask).item() == pytest.approx(9.0 / 3)  # the other two layers count
    assert distill.hidden_loss(off, states, mask, skip={0, 1, 2}).item() == 0.0


def test_passthrough_layers_are_the_removed_and_the_fully_gated() -> None:
    model = remove_layers(tiny_model("bert"), [1])
    config = model.config
    assert passthrough_layers(model, None, None) == {1}
    gates = torch.ones(config.num_hidden_layers, config.num_attention_heads)
    neurons = torch.ones(config.num_hidden_layers, config.intermediate_size)
    gates[0], neurons[0] = 0.0, 0.0
    assert passthrough_layers(model, gates, neurons) == {0, 1}
    assert passthrough_layers(model, gates, None) == {1}  # the FFN still runs: not a pass-through


def test_hidden_matching_leaves_a_removed_layer_out(tmp_path, train_split) -> None:
    """A student that is the teacher with its last layer removed matches every kept layer exactly: its hidden term
    is 0, so its loss equals logit distillation alone; matching the removed layer too would add a term."""
    ds, tokenizer = train_split
    teacher = tiny_model("bert", seed=3)
    student = remove_layers(copy.deepcopy(teacher), [teacher.config.num_hidden_layers - 1])
    acc = Accelerator(cpu=True)
    spec = DistillSpec(alpha=0.5, hidden_weight=1.0)
    targets = distill.load_or_compute(tmp_path / "t", teacher, ds, tokenizer, acc, spec)
    batch = {k: torch.tensor([ds[i][k] for i in range(4)]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    batch |= {"labels": torch.tensor([ds[i]["labels"] for i in range(4)]), distill.INDEX_COLUMN: torch.arange(4)}
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    logits_only = distill.TeacherTargets(targets.logits, DistillSpec(alpha=0.5))
    with torch.no_grad():
        skip = passthrough_layers(student, None, None)
        kept = distill.mixed_loss(student, inputs, batch, targets, skip)
        plain = distill.mixed_loss(student, inputs, batch, logits_only)
        every = distill.mixed_loss(student, inputs, batch, targets)
    assert kept.item() == pytest.approx(plain.item(), abs=1e-6)
    assert every.item() > plain.item() + 1e-3


def test_training_with_hidden_matching_leaves_out_the_removed_layer(tmp_path, train_split, monkeypatch) -> None:
    """`train` passes the student's removed layer to every batch's hidden-state matching."""
    ds, tokenizer = train_split
    teacher = tiny_model("bert", seed=3)
    student = remove_layers(copy.deepcopy(teacher), [0])
    acc = Accelerator(cpu=True)
    targets = distill.load_or_compute(tmp_path / "t", teacher, ds, tokenizer, acc, DistillSpec(hidden_weight=1.0))
    skips, real = [], distill.hidden_loss
    monkeypatch.setattr(distill, "hidden_loss", lambda *a: skips.append(set(a[3])) or real(*a))
    stats = train(student, ds, tokenizer, SPEC, acc, teacher=targets)
    assert stats["steps"] == len(skips) > 0 and all(skip == {0} for skip in skips)


def test_cached_targets_for_other_data_are_refused(tmp_path, train_split) -> None:
    ds, tokenizer = train_split
    acc = Accelerator(cpu=True)
    distill.load_or_compute(tmp_path / "t", tiny_model("bert"), ds, tokenizer, acc, DistillSpec())
    with pytest.raises(UserError, match="prune.finetune.distill: cached teacher targets .* cover"):
        distill.load_or_compute(tmp_path / "t", tiny_model("bert"), ds.select(range(10)), tokenizer, acc, DistillSpec())


@pytest.mark.parametrize("baseline", [None, "layer_drop"])
def test_run_computes_teacher_targets_once_and_reports_distillation(
    tmp_path, tiny_model_dir, tiny_csv, cache_dir, monkeypatch, baseline
) -> None:
    """One teacher pass over the examples the steps (and the layer-drop baseline, when on) draw, never more."""
    calls: list[int] = []
    real = distill.compute_logits

    def spy(teacher, train_ds, *args):
        calls.append(len(train_ds))
        return real(teacher, train_ds, *args)

    monkeypatch.setattr(distill, "compute_logits", spy)
    finetune = {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 96, "distill": {"alpha": 0.7}}
    overrides = {"prune.finetune": finetune, "prune.baseline": baseline}
    report = run_recipe(parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "out", **overrides)))
    drawn = set(recovery_examples(240, 96, [0, 1]))  # the train split is 80% of 300; steps 0 and 1 use seeds 0, 1
    if baseline:
        drawn |= set(drawn_examples(240, 96 * 2, 0))  # the baseline: both steps' budget in one fine-tune, seed 0
    assert calls == [len(drawn)] and len(drawn) < 240  # once for both steps, only the examples they draw
    assert all(step["finetune"]["distill"]["alpha"] == 0.7 for step in report["steps"])
    assert (tmp_path / "out" / "state" / "teacher" / distill.LOGITS_FILE).exists()


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [
        ("prune", {"finetune": {"distill": {"alpha": 1.5}}}, "prune.finetune.distill.alpha: Input should be less"),
        ("prune", {"finetune": {"distill": {"temperature": 0}}}, "prune.finetune.distill.temperature: Input should"),
        ("prune", {"finetune": {"distill": {"weight": 1}}}, "prune.finetune.distill.weight: unknown key"),
        ("base_finetune", {"distill": {"alpha": 0.5}}, "base_finetune.distill: unknown key"),
        ("export", {"int8": {"max_drop": -0.1}}, "export.int8.max_drop: Input should be greater than or equal to 0"),
        ("export", {"variants": ["int8_dynamic"]}, "export.variants.0: Input should be 'fp32', 'optimized', 'int8'"),
    ],
)
def test_bad_distill_and_int8_settings_name_the_field(section, value, message) -> None:
    from compressor.recipe import RecipeError

    with pytest.raises(RecipeError, match=message):
        parse_recipe({section: value})


def test_distill_and_int8_settings_parse_with_defaults() -> None:
    recipe = parse_recipe({"prune": {"finetune": {"distill": {}}}, "export": {"variants": ["fp32", "int8_static"]}})
    assert recipe.prune.finetune.distill == DistillSpec(alpha=0.5, temperature=2.0, hidden_weight=0.0)
    assert recipe.export.int8.max_drop == 0.005 and recipe.export.int8.per_channel
    assert parse_recipe({}).prune.finetune.distill is None  # off unless asked for


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def test_training_the_pruned_copy_ends_where_training_under_the_masks_does(tmp_path, train_split) -> None:
    """`train_kept` (the pruned copy trained, distilled, its weights written back) gives the masked model that
    `train` under the masks gives, with dropout off (its draws are what differ); the removed layer is untouched;
    `evaluate_kept` (on the pruned copy) reads what `evaluate` under the masks reads."""
    ds, tokenizer = train_split
    acc = Accelerator(cpu=True)
    start = _without_dropout(tiny_model("bert", randomized=False))
    width = start.config.intermediate_size
    plan = {"heads": {0: [1, 3], 1: [0, 1, 2, 3]}, "neurons": {0: list(range(0, width, 2)), 1: list(range(width))}}
    masks = Masks.full(start, ("heads", "neurons")).without(plan)
    targets = distill.load_or_compute(tmp_path / "t", tiny_model("bert", seed=5), ds, tokenizer, acc, DistillSpec())
    masked, kept, gates = copy.deepcopy(start), copy.deepcopy(start), (masks.head_gates(), masks.neuron_gates())
    torch.manual_seed(0)
    train(masked, ds, tokenizer, SPEC, acc, gates[0], seed=3, neurons=gates[1], teacher=targets)
    torch.manual_seed(0)
    train_kept(kept, masks, ds, tokenizer, SPEC, acc, seed=3, teacher=targets)
    inputs = {k: v for k, v in tiny_batch(batch=4, seq=9).items() if k != "labels"}

    def logits(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad(), gated(model, *gates):
            return model(**inputs).logits

    torch.testing.assert_close(logits(kept), logits(masked), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(logits(kept), logits(start), atol=1e-3)  # it trained
    on_copy, masked_eval = evaluate_kept(kept, masks, ds, tokenizer), evaluate(kept, ds, tokenizer, None, *gates)
    assert on_copy["accuracy"] == masked_eval["accuracy"]
    assert on_copy["loss"] == pytest.approx(masked_eval["loss"], abs=1e-5)
    before = dict(start.named_parameters())
    layer = [(name, p) for name, p in kept.named_parameters() if name.startswith("bert.encoder.layer.1.")]
    assert layer and all(torch.equal(p, before[name]) for name, p in layer)
