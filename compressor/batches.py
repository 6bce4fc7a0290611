"""The model-input contract and the one load → tokenise → batch sequence for evaluation data.

Every runtime (PyTorch training and scoring, ONNX export and parity, the benchmark's candidates) feeds a classifier
the same keys of a tokenised batch: `MODEL_INPUTS`, restricted to those the model declares (DistilBERT takes no
`token_type_ids`). `eval_batches` is how the CLI commands and the pipeline turn a split into padded batches.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Literal, TypeVar

V = TypeVar("V")
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


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
) -> list[dict]:
    """A seeded sample of `examples` (all when None) of a `TaskData` split, tokenised (pairs as pairs) and padded
    into batches with `labels`."""
    from compressor.train import sample_batches, tokenize

    tokenised = tokenize(getattr(data, split), tokenizer, data.text_fields, max_length)
    return sample_batches(tokenised, tokenizer, examples or len(tokenised), batch_size, seed=seed)
