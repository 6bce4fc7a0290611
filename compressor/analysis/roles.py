"""Token-level role detectors (Voita et al. 2019, Clark et al. 2019) as pure functions of attention maps.

Every function takes one example's attention `att` of shape [K, n, n] (K heads, query × key, rows sum to 1) and
returns per-head statistics that `RoleAccumulator` sums over examples. Choices the papers leave open:

- Queries are the non-special pieces (Voita excludes EOS; we exclude [CLS]/[SEP]/<s>/</s> as queries), keys are
  all pieces, specials included, so a head that parks its attention on [SEP] is *not* positional.
- Positional: the share of queries whose argmax key lies at the head's most frequent relative offset; positional
  if the share is ≥ `positional_threshold` (Voita: 90%).
- Rare word: the rarest piece of the sentence is the least frequent non-special piece outside the `rare_top_k`
  (500) most frequent training pieces (ties: first occurrence); share of queries whose argmax is that piece.
  Voita gives no cut-off; rare-word if the share is ≥ `rare_threshold`.
- Delimiter (Clark): mean attention mass that a query (all real pieces are queries here, as in Clark) puts on
  [CLS], [SEP] and punctuation; delimiter if the three together hold ≥ `delimiter_threshold` of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from compressor.recipe import AnalysisSpec

# The detectors' thresholds are the recipe's `analysis.roles` model itself (defaults follow the papers where they
# give one; field docs in recipe.py and docs/analysis.md), so the two can never drift apart.
RoleConfig = AnalysisSpec.Roles


def argmax_offsets(att: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """[K, q] relative offset (key − query) of each head's maximum attention, for query positions `queries`."""
    pos = torch.nonzero(queries).flatten()
    return att[:, pos].argmax(-1) - pos[None]


def offset_histogram(offsets: torch.Tensor, max_offset: int) -> torch.Tensor:
    """[K, 2·max_offset + 1] counts of each relative offset per head (index max_offset is offset 0)."""
    hist = torch.zeros(offsets.shape[0], 2 * max_offset + 1)
    hist.scatter_add_(1, (offsets + max_offset).clamp(0, 2 * max_offset), torch.ones_like(offsets, dtype=hist.dtype))
    return hist


def positional_from_histogram(hist: torch.Tensor, max_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(share, offset) per head: the most frequent offset and the share of queries that used it."""
    total = hist.sum(1).clamp_min(1)
    best, idx = hist.max(1)
    return best / total, idx - max_offset


def token_frequencies(tokenizer, texts: Iterable[str], max_length: int) -> Counter:
    """Piece-id counts over a training corpus (special tokens excluded)."""
    counts: Counter = Counter()
    texts = list(texts)
    for start in range(0, len(texts), 1024):
        enc = tokenizer(texts[start : start + 1024], truncation=True, max_length=max_length, add_special_tokens=False)
        for ids in enc["input_ids"]:
            counts.update(ids)
    return counts


def rarest_token(ids: list[int], eligible: torch.Tensor, counts: Counter, frequent: set[int]) -> int | None:
    """Position of the least frequent eligible piece not in `frequent` (first one on ties); None if there is none."""
    best, where = None, None
    for pos, tok in enumerate(ids):
        if not eligible[pos] or tok in frequent:
            continue
        c = counts.get(tok, 0)
        if best is None or c < best:
            best, where = c, pos
    return where


def rare_hits(att: torch.Tensor, queries: torch.Tensor, rare_pos: int) -> torch.Tensor:
    """[K] number of queries whose maximum attention lands on the rare piece."""
    return (att[:, queries].argmax(-1) == rare_pos).sum(1).float()


def attention_share(att: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[K] attention mass on the key set `keys`, summed over `queries` (divide by the query count for a mean)."""
    return att[:, queries][:, :, keys].sum((1, 2))


def confidence_sum(att: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """[K] Voita's confidence summed over queries: each query's maximum attention weight."""
    return att[:, queries].max(-1).values.sum(1)


@dataclass
class RoleAccumulator:
    """Running sums of the token-level statistics over examples, for K heads."""

    heads: int
    max_offset: int
    counts: Counter
    frequent: set[int]
    queries: float = 0.0
    all_queries: float = 0.0
    rare_queries: float = 0.0
    rare_sentences: int = 0
    sums: dict[str, torch.Tensor] = field(default_factory=dict)

    def _add(self, key: str, value: torch.Tensor) -> None:
        self.sums[key] = self.sums.get(key, torch.zeros(self.heads)) + value

    def update(self, example, att: torch.Tensor) -> None:
        """Add one example (attention [K, n, n])."""
        words = example.words
        if int(words.sum()) == 0:
            return
        everything = torch.ones_like(words)
        hist = offset_histogram(argmax_offsets(att, words), self.max_offset)
        self.sums["offsets"] = self.sums.get("offsets", torch.zeros_like(hist)) + hist
        self._add("confidence", confidence_sum(att, words))
        self.queries += float(words.sum())
        for name, keys in (("cls", example.cls), ("sep", example.sep), ("punct", example.punct)):
            self._add(name, attention_share(att, everything, keys))
        self.all_queries += example.n
        rare = rarest_token(example.ids, words, self.counts, self.frequent)
        if rare is not None:
            self._add("rare", rare_hits(att, words, rare))
            self.rare_queries += float(words.sum())
            self.rare_sentences += 1

    def result(self, config: RoleConfig) -> dict[str, torch.Tensor]:
        """Per-head maps ([K] tensors) and role flags."""
        zeros = torch.zeros(self.heads)
        share, offset = positional_from_histogram(
            self.sums.get("offsets", torch.zeros(self.heads, 2 * self.max_offset + 1)), self.max_offset
        )
        q, qa = max(self.queries, 1.0), max(self.all_queries, 1.0)
        out = {
            "confidence": self.sums.get("confidence", zeros) / q,
            "positional_share": share,
            "positional_offset": offset.float(),
            "rare_share": self.sums.get("rare", zeros) / max(self.rare_queries, 1.0),
            "cls_share": self.sums.get("cls", zeros) / qa,
            "sep_share": self.sums.get("sep", zeros) / qa,
            "punct_share": self.sums.get("punct", zeros) / qa,
        }
        out["delimiter_share"] = out["cls_share"] + out["sep_share"] + out["punct_share"]
        out["positional"] = out["positional_share"] >= config.positional_threshold
        out["rare_word"] = (out["rare_share"] >= config.rare_threshold) & (self.rare_sentences > 0)
        out["delimiter"] = out["delimiter_share"] >= config.delimiter_threshold
        return out


def frequent_ids(counts: Counter, top_k: int) -> set[int]:
    """The `top_k` most frequent piece ids (Voita's exclusion list for the rare-word role)."""
    return {tok for tok, _ in counts.most_common(top_k)}
