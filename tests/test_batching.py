"""Length-grouped and length-sorted batching: every example once per epoch, little padding, seeded; predictions in
the split's (or the sample's) order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compressor.bench import collect_logits, measure_quality, pytorch_candidate
from compressor.recovery.evaluate import predict
from compressor.sources.batches import LengthGroupedBatches, in_sample_order, sample_batches, sorted_batches

LENGTHS = np.random.default_rng(0).integers(3, 65, size=1000).tolist()


def padded_tokens(batches: list[list[int]]) -> int:
    return sum(len(b) * max(LENGTHS[i] for i in b) for b in batches)


def test_each_epoch_sees_every_example_once_in_batches_of_similar_length() -> None:
    sampler = LengthGroupedBatches(LENGTHS, batch_size=32, seed=3)
    first, second = list(sampler), list(sampler)
    for epoch in (first, second):
        assert sorted(i for b in epoch for i in b) == list(range(len(LENGTHS)))
        assert len(epoch) == len(sampler) == 32 and sorted(len(b) for b in epoch) == [8] + [32] * 31
    random_batches = [list(range(i, min(i + 32, len(LENGTHS)))) for i in range(0, len(LENGTHS), 32)]
    assert padded_tokens(first) < 0.7 * padded_tokens(random_batches), "grouping pads far less than a random order"
    assert first != second, "each epoch draws a new order"
    assert first == list(LengthGroupedBatches(LENGTHS, batch_size=32, seed=3)), "the order is a function of the seed"
    assert first != list(LengthGroupedBatches(LENGTHS, batch_size=32, seed=4))


def test_predict_returns_the_splits_order_and_the_unsorted_logits(task) -> None:
    model, tokenizer, train, _ = task
    logits, labels = predict(model, train, tokenizer, batch_size=8)
    assert torch.equal(labels, torch.tensor(train["labels"]))
    one_by_one = torch.cat([predict(model, train.select([i]), tokenizer)[0] for i in range(len(train))])
    assert torch.allclose(logits, one_by_one, atol=1e-5), "row i is example i whatever batch it ran in"


def examples(batches: list[dict]) -> list[tuple[int, ...]]:
    """The unpadded token ids of every example in `batches`, sorted."""
    rows = (r[m.bool()].tolist() for b in batches for r, m in zip(b["input_ids"], b["attention_mask"], strict=True))
    return sorted(tuple(r) for r in rows)


def test_grouped_score_batches_hold_the_same_sample(task) -> None:
    _, tokenizer, train, _ = task
    plain = sample_batches(train, tokenizer, 40, 8, seed=1)
    grouped = sample_batches(train, tokenizer, 40, 8, seed=1, by_length=True)
    assert examples(plain) == examples(grouped)
    assert sum(b["input_ids"].numel() for b in grouped) <= sum(b["input_ids"].numel() for b in plain)


@pytest.fixture
def ragged(task):
    """The tiny task's model and tokenizer with a split of texts of 1 to 6 words (the task's all have 6)."""
    from conftest import make_rows
    from datasets import Dataset

    from compressor.sources.batches import tokenize

    model, tokenizer, _, _ = task
    rows = [{**r, "text": " ".join(r["text"].split()[: 1 + i % 6])} for i, r in enumerate(make_rows(60, seed=5))]
    return model.eval(), tokenizer, tokenize(Dataset.from_list(rows), tokenizer, ["text"], 16)


def test_sorted_batches_pad_least_and_give_results_in_the_samples_order(ragged) -> None:
    model, tokenizer, train = ragged
    plain = sample_batches(train, tokenizer, 40, 8, seed=1)
    ordered = sorted_batches(train, tokenizer, 40, 8, seed=1)
    assert examples(plain) == examples(ordered), "the same sample"
    widths = [b["input_ids"].shape[1] for b in ordered]
    assert widths == sorted(widths) and len(set(widths)) > 1
    assert sum(b["input_ids"].numel() for b in ordered) < sum(b["input_ids"].numel() for b in plain)
    labels = np.concatenate([b["labels"].numpy() for b in ordered])
    assert np.array_equal(in_sample_order(ordered, labels), np.concatenate([b["labels"].numpy() for b in plain]))
    candidate = pytorch_candidate("m", model, 16)
    sorted_logits, plain_logits = collect_logits(candidate, ordered), collect_logits(candidate, plain)
    assert not np.allclose(sorted_logits[:-1], sorted_logits[1:]), "rows differ, so the order is checked"
    np.testing.assert_allclose(sorted_logits, plain_logits, atol=1e-5)
    with pytest.raises(ValueError, match="39 rows do not match the batches' 40 positions"):
        in_sample_order(ordered, labels[:-1])


def test_candidates_sorted_their_own_way_are_compared_example_by_example(ragged) -> None:
    """A reference's own tokenisation sorts the same sample in another order: the bench lines the rows up again."""
    model, tokenizer, train = ragged
    batches = sorted_batches(train, tokenizer, 40, 8, seed=1)
    a, b = pytorch_candidate("a", model, 16), pytorch_candidate("b", model, 16)
    b.eval_batches = sorted_batches(train, tokenizer, 40, 5, seed=1)[::-1]
    out = measure_quality([a, b], batches, "a")["results"]
    assert out["b"]["agreement"] == 1.0 and out["b"]["hits"] == out["a"]["hits"]
    plain = measure_quality([a], sample_batches(train, tokenizer, 40, 8, seed=1), "a")["results"]
    assert plain["a"]["hits"] == out["a"]["hits"], "hits are in the sample's order, as unsorted batches give them"
