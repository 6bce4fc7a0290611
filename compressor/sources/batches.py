"""Tokenised splits and their batches: the model-input contract, tokenisation and dynamic-padding loaders.

Every runtime (PyTorch training and scoring, ONNX export and parity, the benchmark's candidates) feeds a classifier
the same keys of a tokenised batch: `MODEL_INPUTS`, restricted to those the model declares (DistilBERT takes no
`token_type_ids`). `tokenize` turns a split into model inputs plus `labels`; `loader` and `sample_batches` pad
them into batches (length-grouped where nothing needs batches to mix lengths); `eval_batches` is how the CLI
commands and the pipeline turn a split into padded batches; `sorted_batches` (what the benchmark scores) pads least,
and `in_sample_order` puts what was computed on them back in the sample's order.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

if TYPE_CHECKING:
    import datasets
    from accelerate import Accelerator

V = TypeVar("V")
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
POSITION = "position"  # a sorted batch's key: each example's index in the sample it was cut from


def input_keys(accepted: Collection[str] | None = None) -> tuple[str, ...]:
    """The contract's keys that a model accepting `accepted` (all when None) takes, in contract order."""
    return tuple(k for k in MODEL_INPUTS if accepted is None or k in accepted)


def model_inputs(batch: Mapping[str, V], accepted: Collection[str] | None = None) -> dict[str, V]:
    """The entries of `batch` a classifier's forward takes (labels and other columns dropped)."""
    keys = input_keys(accepted)
    return {k: v for k, v in batch.items() if k in keys}


def eval_batches(
    data,
    tokenizer,
    split: Literal["train", "validation", "test"],
    max_length: int,
    examples: int | None = None,
    batch_size: int = 32,
    seed: int = 0,
    by_length: bool = False,
) -> list[dict]:
    """A seeded sample of `examples` (all when None) of a `TaskData` split, tokenised (pairs as pairs) and padded
    into batches with `labels`; `by_length`: the same sample in batches sorted by length (`sorted_batches`)."""
    tokenised = tokenize(getattr(data, split), tokenizer, data.text_fields, max_length)
    cut = sorted_batches if by_length else sample_batches
    return cut(tokenised, tokenizer, examples or len(tokenised), batch_size, seed=seed)


def tokenize(ds: datasets.Dataset, tokenizer, text_fields: Sequence[str], max_length: int) -> datasets.Dataset:
    """Tokenise one split (single sentences or pairs), keeping only model inputs and `labels` (where it has any)."""

    def encode(batch: dict) -> dict:
        texts = [batch[f] for f in text_fields]
        out = tokenizer(*texts, truncation=True, max_length=max_length)
        if "label" in batch:  # an unlabelled split (`data.train_labels: false`) has none
            out["labels"] = batch["label"]
        return out

    keep = [c for c in ds.column_names]
    return ds.map(encode, batched=True, remove_columns=keep, desc="tokenize", load_from_cache_file=False)


SPLITS = ("train", "validation", "test")


def tokenize_splits(data, tokenizer, max_length: int) -> dict[str, datasets.Dataset]:
    """Every split of a `TaskData` tokenised by `tokenizer` (pairs as pairs), keyed "train", "validation", "test"."""
    return {name: tokenize(getattr(data, name), tokenizer, data.text_fields, max_length) for name in SPLITS}


GROUP_BATCHES = 50  # batches per length-sorted group (HF Trainer's `group_by_length` uses the same mega-batch size)


class LengthGroupedBatches(Sampler[list[int]]):
    """Seeded shuffled batches of examples of similar length, so dynamic padding pads little.

    Why: real classification text is ragged, and a random batch pads to its longest member: every Linear computes
    the padding too. Each epoch shuffles
    the examples (seed + epoch), sorts each group of `GROUP_BATCHES` batches by length, cuts it into batches and
    shuffles the batches, so every example is still seen once per epoch in a seeded, reproducible order.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int):
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        order = rng.permutation(len(self.lengths))
        span = self.batch_size * GROUP_BATCHES
        batches = []
        for start in range(0, len(order), span):
            group = order[start : start + span]
            group = group[np.argsort(-self.lengths[group], kind="stable")]
            batches += [group[i : i + self.batch_size].tolist() for i in range(0, len(group), self.batch_size)]
        yield from (batches[i] for i in rng.permutation(len(batches)))


def lengths(ds: datasets.Dataset) -> list[int]:
    """Tokens per example of a tokenised split."""
    return [len(ids) for ids in ds["input_ids"]]


def loader(
    ds: datasets.Dataset, tokenizer, batch_size: int, shuffle: bool = False, seed: int = 0, by_length: bool = False
) -> DataLoader:
    """Dynamic-padding loader; shuffling uses its own seeded generator so runs are reproducible, and with
    `by_length` it shuffles batches of similar length (`LengthGroupedBatches`)."""
    from transformers import DataCollatorWithPadding

    collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")
    if shuffle and by_length:
        return DataLoader(ds, batch_sampler=LengthGroupedBatches(lengths(ds), batch_size, seed), collate_fn=collate)
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=generator, collate_fn=collate)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def sample_split(ds: datasets.Dataset, n: int, seed: int) -> datasets.Dataset:
    """A fixed, seeded sample of `n` examples of `ds` (all of it, unchanged, when it has no more)."""
    return ds.shuffle(seed=seed).select(range(n)) if len(ds) > n else ds


def sample_batches(
    ds: datasets.Dataset,
    tokenizer,
    n: int,
    batch_size: int,
    seed: int,
    accelerator: Accelerator | None = None,
    by_length: bool = False,
) -> list[dict]:
    """A fixed, seeded sample of `n` examples as padded batches (each process gets its shard under DDP); with
    `by_length`, batches of similar length in a seeded order (`LengthGroupedBatches`), where no consumer needs
    the batches to mix lengths (the int8 gate does: it must see batches like the ones served)."""
    ds = sample_split(ds, n, seed)
    dl = loader(ds, tokenizer, batch_size, shuffle=by_length, seed=seed, by_length=by_length)
    if accelerator is not None and accelerator.num_processes > 1:
        dl = accelerator.prepare_data_loader(dl)
    return list(dl)


def sorted_batches(ds: datasets.Dataset, tokenizer, n: int, batch_size: int, seed: int) -> list[dict]:
    """The sample `sample_batches` draws (the same `n` examples, seed and order), cut into batches sorted by length.

    Why: a benchmark scores every candidate on the whole test and validation splits, and a batch of ragged text
    pads to its longest member; sorted, the batches pad almost nothing. Each batch carries `POSITION`, every
    example's index in the sample, so that `in_sample_order` gives results (logits, labels, hits) in the sample's
    order whatever tokenizer sorted them: another model's tokenisation of the same examples lines up."""
    ds = sample_split(ds, n, seed)
    order = np.argsort(lengths(ds), kind="stable")
    batches = list(loader(ds.select(order), tokenizer, batch_size))
    for start, batch in zip(range(0, len(order), batch_size), batches, strict=True):
        batch[POSITION] = torch.as_tensor(order[start : start + batch_size])
    return batches


def in_sample_order(batches: Sequence[Mapping], values: np.ndarray) -> np.ndarray:
    """`values` (one row per example, concatenated over `batches`) in the order of the sample the batches were cut
    from: batches with `POSITION` (`sorted_batches`) are put back, others are in that order already."""
    if not batches or POSITION not in batches[0]:
        return values
    positions = np.concatenate([np.asarray(b[POSITION]) for b in batches])
    if len(positions) != len(values) or not np.array_equal(np.sort(positions), np.arange(len(values))):
        raise ValueError(f"in_sample_order: {len(values)} rows do not match the batches' {len(positions)} positions")
    out = np.empty_like(values)
    out[positions] = values
    return out
