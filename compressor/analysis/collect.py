"""Tokenised examples with the token classes the role detectors need, and per-example attention maps.

Inputs are encoded exactly as training encodes them (`sources.batches.tokenize` calls `tokenizer(*fields)`): a
single-text task gives one string per example, a sentence-pair task a `(first, second)` tuple that is tokenised as a
pair, so the pieces, [SEP]s, truncation and token_type_ids are the ones the model was trained on.

Attention comes from `pruning.masking.AttentionRecorder`: one [batch, present heads, T, T] tensor per layer that
has heads, keyed by layer (transformers 5's `output_attentions` lists only layers whose attention module ran, so a
layer without heads would shift the rest). `attention_maps` scatters present heads back to their
*original* ids, so every detector works on a fixed [layers × original heads] grid and removed heads are masked out
at the end (see `presence`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from compressor.core.errors import UserError
from compressor.pruning.masking import AttentionRecorder
from compressor.surgery.arch import arch_spec, num_layers, original_num_heads, present_heads

Text = str | tuple[str, ...]  # one model input: a text, or the texts of a sentence pair


@dataclass
class Example:
    """One tokenised input: piece ids, character offsets and which pieces are [CLS]/[SEP]/punctuation/special.

    For a pair, `offsets` of each piece are relative to the text it comes from (`sequence_ids`).
    """

    text: Text
    ids: list[int]
    offsets: list[tuple[int, int]]
    special: torch.Tensor  # [n] bool: any special token ([CLS], [SEP], <s>, </s>, ...)
    cls: torch.Tensor  # [n] bool
    sep: torch.Tensor  # [n] bool
    punct: torch.Tensor  # [n] bool: non-special pieces made only of punctuation characters
    segments: torch.Tensor  # [n] long: token_type_ids (all 0 for single-segment inputs)
    sequence_ids: torch.Tensor | None = None  # [n] long: which input text a piece comes from, −1 for specials

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def parts(self) -> tuple[str, ...]:
        """The input texts: one for a single-text task, two for a pair."""
        return (self.text,) if isinstance(self.text, str) else tuple(self.text)

    @property
    def blocks(self) -> torch.Tensor:
        """[n] long: the input text of each piece (−1 for specials); falls back to token_type_ids."""
        seq = self.sequence_ids if self.sequence_ids is not None else self.segments
        return seq.masked_fill(self.special, -1)

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


def model_texts(ds, fields: Sequence[str], n: int | None = None) -> list[Text]:
    """The model inputs of a dataset split (the first `n` rows): one string per row for one text field, a
    `(first, second)` tuple for two, i.e. what `compressor.sources.batches.tokenize` feeds to `tokenizer(*fields)`."""
    if n is not None:
        ds = ds.select(range(min(n, len(ds))))
    columns = [[str(v) for v in ds[f]] for f in fields]
    return columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))


def split_texts(texts: Sequence[Text]) -> list[list[str]]:
    """Column-wise texts: `[texts]` for single texts, `[firsts, seconds]` for pairs (all inputs must agree)."""
    if not texts:
        return [[]]
    width = 1 if isinstance(texts[0], str) else len(texts[0])
    if any((1 if isinstance(t, str) else len(t)) != width for t in texts) or width not in (1, 2):
        raise ValueError("texts: expected all single texts or all (first, second) pairs")
    if isinstance(texts[0], str):
        return [list(texts)]
    return [list(col) for col in zip(*texts, strict=True)]


def encode(tokenizer, texts: Sequence[Text], max_length: int) -> list[Example]:
    """Tokenise each input (a text, or a pair tokenised as a pair; truncated to `max_length` as in training) and
    classify its pieces."""
    _require_fast(tokenizer)
    enc = tokenizer(
        *split_texts(texts),
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
                sequence_ids=torch.tensor([-1 if s is None else s for s in enc.sequence_ids(i)], dtype=torch.long),
            )
        )
    return out


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
    if arch_spec(model).takes_token_types(model.config):
        inputs["token_type_ids"] = types
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in inputs.items()}


@torch.inference_mode()
def attention_maps(
    model: nn.Module, examples: list[Example], batch_size: int, pad_id: int = 0
) -> Iterator[tuple[Example, torch.Tensor]]:
    """Yield (example, attention [layers, original heads, n, n]) in float32 on CPU; absent heads are zeros.

    Works with any attention implementation the architecture's recorder supports (`AttentionRecorder`).
    """
    model.eval()
    n_layers, n_heads = num_layers(model), original_num_heads(model)
    heads = present_heads(model)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        with AttentionRecorder().attach(model) as recorder:
            model(**_batch_inputs(chunk, model, pad_id))
        width = max(e.n for e in chunk)
        full = torch.zeros(len(chunk), n_layers, n_heads, width, width)
        for layer, att in recorder.probs.items():
            full[:, layer, heads[layer]] = att.detach().float().cpu()
        for row, e in enumerate(chunk):
            yield e, full[row, :, :, : e.n, : e.n]
