"""The Python API: `compressor.prune` on a model in memory, no files written, resumable through a hook."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import compressor
from compressor.pruning.masking import gated
from compressor.recipe import PruneSpec, TrainSpec
from compressor.recovery.loop import PruneState
from compressor.recovery.train import model_inputs
from compressor.sources.batches import sample_batches

SPEC = PruneSpec(
    target=0.5,
    steps=2,
    score_examples=32,
    score_batch_size=16,
    finetune=TrainSpec(epochs=1, lr=5e-4, batch_size=16, max_examples=48),
)


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def test_prune_in_memory_writes_no_files_and_pruned_equals_masked(task, tmp_path, monkeypatch):
    model, tok, train, val = task
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path)

    result = compressor.prune(model, tok, train, SPEC, validation=val, seed=0)

    assert _files(tmp_path) == before  # nothing written in the working directory
    assert result.model is model  # pruned in place (masked), heads still present
    assert int(result.masks.heads.sum()) == 6 and result.masks.heads.shape == (3, 4)
    removed = {(layer, h) for layer, heads in result.plan.items() for h in heads}
    assert removed == {tuple(ix) for ix in (~result.masks.heads).nonzero().tolist()}
    assert [s["heads_left"] for s in result.steps] == [9, 6] and len(result.scores) == 2
    assert {"val_after_prune", "val_after_finetune", "finetune", "removed"} <= set(result.steps[0])
    # step 2 scored only the heads alive after step 1: the ones step 1 removed are -inf
    assert torch.isneginf(result.scores[1][~result.step_masks[0].heads]).all()
    assert torch.isfinite(result.scores[1][result.step_masks[0].heads]).all()

    small = result.pruned()
    batch = next(iter(sample_batches(val, tok, 16, 16, seed=0)))
    with torch.inference_mode(), gated(model, result.masks.head_gates()):
        masked = model(**model_inputs(batch)).logits
    with torch.inference_mode():
        assert torch.allclose(small(**model_inputs(batch)).logits, masked, atol=1e-5)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())


class MemoryHook:
    """A `StepHook` keeping snapshots in memory; `resume_from` replays the snapshot after that many steps."""

    def __init__(self, resume_from: int | None = None, snapshots: list | None = None):
        self.snapshots = snapshots if snapshots is not None else []
        self.resume_from = resume_from
        self.calls = 0

    def after_step(self, model, state: PruneState) -> None:
        self.calls += 1
        self.snapshots.append((copy.deepcopy(model.state_dict()), copy.deepcopy(state)))

    def resume(self, model, fresh: PruneState) -> PruneState:
        if self.resume_from is None:
            return fresh
        weights, state = self.snapshots[self.resume_from - 1]
        model.load_state_dict(weights)
        return copy.deepcopy(state)


def test_hook_sees_every_step_and_resuming_ends_where_an_uninterrupted_prune_does(task):
    model, tok, train, val = task
    fresh_model = copy.deepcopy(model)
    full = MemoryHook()
    uninterrupted = compressor.prune(model, tok, train, SPEC, validation=val, seed=3, hook=full)
    assert full.calls == 2 and [len(s.steps) for _, s in full.snapshots] == [1, 2]

    resumed_hook = MemoryHook(resume_from=1, snapshots=full.snapshots[:1])
    resumed = compressor.prune(fresh_model, tok, train, SPEC, validation=val, seed=3, hook=resumed_hook)
    assert resumed_hook.calls == 1  # only the second step ran
    assert torch.equal(resumed.masks.heads, uninterrupted.masks.heads)
    assert resumed.steps[0] == uninterrupted.steps[0]  # the first step's log came back from the hook
    for name, value in uninterrupted.model.state_dict().items():
        assert torch.allclose(resumed.model.state_dict()[name], value, atol=1e-6), name


def test_prune_without_validation_or_finetune_logs_no_accuracy(task):
    model, tok, train, _ = task
    spec = PruneSpec.model_validate(
        {**SPEC.model_dump(), "finetune": None, "steps": 1, "criterion": {"name": "magnitude"}}
    )
    result = compressor.prune(model, tok, train, spec)
    keys = {"step", "removed", "heads_left", "heads_per_layer", "scores", "score_seconds", "seconds"}
    assert set(result.steps[0]) == keys | {"goal", "goal_index", "members"}  # one step: it closes the one target
    assert result.steps[0]["members"] == [0.5] and [m.step for m in result.members] == [1]
    assert result.masks.heads.sum() == 6


@pytest.mark.parametrize("arch", ["bert", "distilbert", "electra"])
def test_as_sdpa_copies_a_pruned_model_in_memory_with_equal_logits(arch, tmp_path, monkeypatch):
    from compressor.bench.candidates import as_sdpa
    from compressor.surgery.slicing import pruned_copy
    from compressor.testing import tiny_batch, tiny_model

    monkeypatch.chdir(tmp_path)
    model = pruned_copy(tiny_model(arch), {0: [1, 2], 2: [0, 1, 2, 3]}).eval()
    fast = as_sdpa(model)
    assert list(tmp_path.iterdir()) == []  # no save-then-reload round trip
    assert fast.config._attn_implementation == "sdpa" and fast.config.pruned_heads == model.config.pruned_heads
    batch = model_inputs(tiny_batch())
    with torch.inference_mode():
        assert torch.allclose(fast(**batch).logits, model(**batch).logits, atol=1e-5)


def test_prune_family_in_memory_gives_each_member_its_own_weights(task):
    """`values` in the API: one member per target, each with the weights of the step that reached it (not the
    final ones), and its pruned copy equals its masked model."""
    model, tok, train, val = task
    spec = SPEC.model_copy(update={"target": None, "budget": {"kind": "heads", "values": [0.25, 0.5]}, "steps": 2})
    spec = PruneSpec.model_validate(spec.model_dump())
    result = compressor.prune(model, tok, train, spec, validation=val, seed=0)
    members = result.members
    assert [(m.target, m.step) for m in members] == [(0.25, 1), (0.5, 2)]
    assert [int(m.masks.heads.sum()) for m in members] == [9, 6]
    first = result.member_model(members[0])
    assert first is not model and result.member_model(members[1]) is model
    changed = [k for k, v in first.state_dict().items() if not torch.equal(v, model.state_dict()[k])]
    assert changed, "the first member kept the final weights; step 2's fine-tune should have changed some"
    batch = next(iter(sample_batches(val, tok, 16, 16, seed=0)))
    with torch.inference_mode(), gated(first, members[0].masks.head_gates()):
        masked = first(**model_inputs(batch)).logits
    with torch.inference_mode():
        small = members[0].masks.pruned_copy(first)
        assert torch.allclose(small(**model_inputs(batch)).logits, masked, atol=1e-5)


def test_prune_refuses_a_model_that_is_not_a_sequence_classifier_in_one_line(task):
    """The API passes its model through the same check as the CLI's sources: a token classifier with the task's
    label count is refused before any step, naming the class, instead of failing inside the first loss."""
    from transformers import AutoModelForTokenClassification

    from compressor.core.errors import UserError
    from compressor.testing import tiny_config

    model, tokenizer, train, _ = task
    token_model = AutoModelForTokenClassification.from_config(tiny_config("bert"))
    with pytest.raises(UserError, match=r"^model: BertForTokenClassification is not a sequence classifier; expected "
                                        r"BertForSequenceClassification") as err:  # fmt: skip
        compressor.prune(token_model, tokenizer, train, PruneSpec(target=0.25, steps=1, finetune=None))
    assert "\n" not in str(err.value)
