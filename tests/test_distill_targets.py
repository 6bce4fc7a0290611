"""Teacher targets only for the examples the steps draw: the draw is known up front, the teacher runs once per
distinct drawn example, and training ends exactly where targets for every example would have led it."""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate import Accelerator
from datasets import Dataset

import compressor
from compressor.recipe import DistillSpec, FinetuneSpec, PruneSpec
from compressor.recovery import distill
from compressor.recovery.draws import drawn_examples, recovery_examples
from compressor.recovery.layer_drop import layer_drop_baseline, recovery_spec
from compressor.surgery.cost import masked_flops

FINETUNE = FinetuneSpec(epochs=1, lr=5e-4, batch_size=16, max_examples=40, distill=DistillSpec(alpha=0.7))
SPEC = PruneSpec(target=0.5, steps=2, score_examples=32, score_batch_size=16, finetune=FINETUNE)


def count_rows(model: torch.nn.Module) -> list[int]:
    """A forward hook that records how many examples each forward of `model` saw."""
    seen: list[int] = []
    model.register_forward_hook(
        lambda module, args, kwargs, out: seen.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    return seen


@pytest.mark.parametrize(("n", "cap", "seed"), [(50, 20, 0), (50, 20, 7), (50, 50, 1), (50, None, 2)])
def test_drawn_examples_are_the_shuffled_head_fine_tuning_always_used(n, cap, seed) -> None:
    ds = Dataset.from_dict({"i": list(range(n))})
    drawn = drawn_examples(n, cap, seed)
    if cap is None or cap >= n:
        assert drawn is None
    else:
        assert drawn == ds.shuffle(seed=seed).select(range(cap))["i"]


def test_recovery_examples_is_the_sorted_union() -> None:
    union = recovery_examples(50, 20, [0, 1])
    assert union == sorted(set(drawn_examples(50, 20, 0)) | set(drawn_examples(50, 20, 1)))
    assert 20 < len(union) < 50
    assert recovery_examples(50, 60, [0, 1]) is None  # a step that uses every example needs them all


def test_teacher_runs_once_per_distinct_drawn_example(task) -> None:
    model, tok, train, val = task
    teacher = copy.deepcopy(model)
    forwards = count_rows(teacher)
    compressor.prune(model, tok, train, SPEC, validation=val, teacher=teacher, seed=4)
    drawn = recovery_examples(len(train), FINETUNE.max_examples, [4, 5])
    assert sum(forwards) == len(drawn) < len(train)


def test_drawn_targets_train_exactly_like_targets_for_every_example(task) -> None:
    model, tok, train, val = task
    teacher = copy.deepcopy(model)
    everything = distill.load_or_compute(None, teacher, train, tok, Accelerator(cpu=True), FINETUNE.distill)
    assert not everything.missing()
    drawn_only, full = copy.deepcopy(model), copy.deepcopy(model)
    a = compressor.prune(drawn_only, tok, train, SPEC, validation=val, teacher=teacher, seed=2)
    b = compressor.prune(full, tok, train, SPEC, validation=val, teacher=everything, seed=2)
    assert [s["finetune"]["train_loss"] for s in a.steps] == [s["finetune"]["train_loss"] for s in b.steps]
    weights = full.state_dict()
    assert all(torch.equal(v, weights[k]) for k, v in drawn_only.state_dict().items())


def test_a_row_never_computed_is_an_error_not_a_nan_loss(task) -> None:
    model, tok, train, _ = task
    targets = distill.load_or_compute(None, model, train, tok, Accelerator(cpu=True), FINETUNE.distill, [0, 5])
    assert targets.missing([0, 1, 5, 7]) == [1, 7]
    assert torch.isfinite(targets.rows(torch.tensor([5, 0]))).all()
    with pytest.raises(RuntimeError, match=r"no logits for train examples \[1\]"):
        targets.rows(torch.tensor([0, 1]))


def test_cached_targets_are_keyed_by_example_and_reused(task, tmp_path) -> None:
    model, tok, train, _ = task
    acc, drawn = Accelerator(cpu=True), drawn_examples(len(train), 30, 0)
    forwards = count_rows(model)
    first = distill.load_or_compute(tmp_path / "t", model, train, tok, acc, FINETUNE.distill, drawn)
    again = distill.load_or_compute(tmp_path / "t", model, train, tok, acc, FINETUNE.distill, drawn)
    assert sum(forwards) == 30 and torch.equal(first.logits.nan_to_num(7.0), again.logits.nan_to_num(7.0))
    with pytest.raises(compressor.core.errors.UserError, match="lack 1 of the examples the steps draw"):
        other = sorted({*drawn, next(i for i in range(len(train)) if i not in drawn)})
        distill.load_or_compute(tmp_path / "t", model, train, tok, acc, FINETUNE.distill, other)


def test_baseline_computes_only_the_examples_the_steps_did_not_draw(task, monkeypatch) -> None:
    model, tok, train, _ = task
    acc = Accelerator(cpu=True)
    steps = distill.step_examples(len(train), FINETUNE, 0, SPEC.steps)
    partial = distill.load_or_compute(None, model, train, tok, acc, FINETUNE.distill, steps)
    everything = distill.load_or_compute(None, model, train, tok, acc, FINETUNE.distill)
    flops = masked_flops(model, {}, 16) // 2
    passes: list[int] = []
    real = distill.compute_logits
    monkeypatch.setattr(distill, "compute_logits", lambda m, ds, *a: passes.append(len(ds)) or real(m, ds, *a))
    torch.manual_seed(0)
    lazy = layer_drop_baseline(copy.deepcopy(model), flops, 16, train, tok, FINETUNE, SPEC.steps, acc, teacher=partial)
    drawn = drawn_examples(len(train), recovery_spec(FINETUNE, SPEC.steps, len(train)).max_examples, 0)
    assert passes == [len(set(drawn) - set(steps))] and passes[0] > 0
    torch.manual_seed(0)
    eager = layer_drop_baseline(model, flops, 16, train, tok, FINETUNE, SPEC.steps, acc, teacher=everything)
    weights = eager.model.state_dict()
    assert all(torch.equal(v, weights[k]) for k, v in lazy.model.state_dict().items())


def test_teacher_targets_are_computed_under_the_runs_autocast(task) -> None:
    """The one-off teacher pass runs in the fine-tunes' precision (`accelerator.autocast()`) and stores fp32: with
    bf16 autocast its logits move off the fp32 ones by bf16's rounding only."""
    model, tok, train, _ = task
    acc = Accelerator(cpu=True)
    exact = distill.compute_logits(model, train, tok, acc, 16)
    acc.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    cast = distill.compute_logits(model, train, tok, acc, 16)
    assert cast.dtype == torch.float32 and cast.shape == exact.shape
    assert torch.allclose(cast, exact, atol=0.1) and not torch.equal(cast, exact)
