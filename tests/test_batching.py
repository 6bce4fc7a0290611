"""Length-grouped batching: every example once per epoch, little padding, seeded; predictions in the split's order."""

from __future__ import annotations

import numpy as np
import torch

from compressor.recovery.evaluate import predict
from compressor.sources.batches import LengthGroupedBatches, sample_batches

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
