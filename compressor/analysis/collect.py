"""Tokenised examples with the token classes the role detectors need, and per-example attention maps.

Attention comes from `model(..., output_attentions=True)`: one [batch, present heads, T, T] tensor per layer, where
a layer that lost every head gives [batch, 0, T, T]. `attention_maps` scatters present heads back to their
*original* ids, so every detector works on a fixed [layers × original heads] grid and removed heads are masked out
at the end (see `presence`).
"""

from __future__ import annotations

import unicodedata
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from compressor.errors import UserError
from compressor.layout import num_layers, original_num_heads, presence_mask, present_heads

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Example:
    """One tokenised text: piece ids, character offsets and which pieces are [CLS]/[SEP]/punctuation/special."""

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    special: torch.Tensor  # [n] bool: any special token ([CLS], [SEP], <s>, </s>, ...)
    cls: torch.Tensor  # [n] bool
    sep: torch.Tensor  # [n] bool
    punct: torch.Tensor  # [n] bool: non-special pieces made only of punctuation characters
    segments: torch.Tensor  # [n] long: token_type_ids (all 0 for single-segment inputs)

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def words(self) -> torch.Tensor:
        """Non-special pieces: the queries of Voita's token-level detectors."""
        return ~self.special


def is_punctuation(piece: str) -> bool:
    """True when a piece (word-piece/BPE markers stripped) consists only of Unicode punctuation."""
    core = piece.removeprefix("##").lstrip("Ġ▁")
    return bool(core) and all(unicodedata.category(c).startswith("P") for c in core)


def _require_fast(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(
            "analysis: the tokenizer must be a fast (Rust) tokenizer, since word alignment needs character offsets; "
            f"got {type(tokenizer).__name__}"
        )


def encode(tokenizer, texts: list[str], max_length: int) -> list[Example]:
    """Tokenise each text (truncated to `max_length`) and classify its pieces."""
    _require_fast(tokenizer)
    enc = tokenizer(
        texts,
        truncation=True,
        max_length=max_length,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        return_token_type_ids=True,
    )
    out = []
    for i, text in enumerate(texts):
        ids = list(enc["input_ids"][i])
        special = torch.tensor(enc["special_tokens_mask"][i], dtype=torch.bool)
        idt = torch.tensor(ids)
        pieces = tokenizer.convert_ids_to_tokens(ids)
        punct = torch.tensor([is_punctuation(p) for p in pieces], dtype=torch.bool) & ~special
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        out.append(
            Example(
                text=text,
                ids=ids,
                offsets=[tuple(o) for o in enc["offset_mapping"][i]],
                special=special,
                cls=(idt == cls_id) & special if cls_id is not None else torch.zeros_like(special),
                sep=(idt == sep_id) & special if sep_id is not None else torch.zeros_like(special),
                punct=punct,
                segments=torch.tensor(enc["token_type_ids"][i], dtype=torch.long),
            )
        )
    return out


def presence(model: nn.Module) -> torch.Tensor:
    """[layers, original heads] bool: heads that still have weights (and therefore attention maps)."""
    return presence_mask(model)


def _batch_inputs(examples: list[Example], model: nn.Module, pad_id: int) -> dict[str, torch.Tensor]:
    width = max(e.n for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(examples), width, dtype=torch.long)
    types = torch.zeros(len(examples), width, dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : e.n] = torch.tensor(e.ids)
        mask[row, : e.n] = 1
        types[row, : e.n] = e.segments
    inputs = {"input_ids": ids, "attention_mask": mask}
    if getattr(model.config, "type_vocab_size", 0) and model.config.model_type != "distilbert":
        inputs["token_type_ids"] = types
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in inputs.items()}


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers' "falling back to the manual attention implementation" notice for one forward."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


@torch.inference_mode()
def attention_maps(
    model: nn.Module, examples: list[Example], batch_size: int, pad_id: int = 0
) -> Iterator[tuple[Example, torch.Tensor]]:
    """Yield (example, attention [layers, original heads, n, n]) in float32 on CPU; absent heads are zeros.

    Works with any attention implementation: transformers falls back to eager attention when attention
    probabilities are requested (the fallback warning is silenced).
    """
    model.eval()
    n_layers, n_heads = num_layers(model), original_num_heads(model)
    heads = present_heads(model)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        with _quiet():
            out = model(**_batch_inputs(chunk, model, pad_id), output_attentions=True)
        width = max(e.n for e in chunk)
        full = torch.zeros(len(chunk), n_layers, n_heads, width, width)
        for layer, att in enumerate(out.attentions):
            if att is not None and att.shape[1] > 0:
                full[:, layer, heads[layer]] = att.detach().float().cpu()
        for row, e in enumerate(chunk):
            yield e, full[row, :, :, : e.n, : e.n]
