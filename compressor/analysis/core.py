"""`analyze_heads`: one pass over an evaluation sample that answers what each head does.

The result is a plain JSON-serialisable dict; every per-head quantity is a [layers][original heads] list with
`None` for heads the model no longer has. Role flags come from three sources that may overlap:
Voita/Clark's token-level rules (positional, rare_word, delimiter), the dependency-relation rule (syntactic), and
Pande's sieve tests (sieve_local, sieve_syntactic, sieve_block, sieve_delimiter). "any" is the union of Voita's
*specialised* roles (positional, rare_word, syntactic); delimiter heads are Clark's no-op heads and are counted
separately rather than as specialised.

Sentence-pair tasks are analysed on the pairs as the model saw them (`collect.encode`): the block sieve then tests
attention within each text of the pair, and the syntactic analysis parses each text separately (`syntax` module).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy import stats
from torch import nn
from tqdm.auto import tqdm

from compressor.analysis import sieve as sv
from compressor.analysis import syntax as sx
from compressor.analysis.collect import Text, attention_maps, encode, split_texts
from compressor.analysis.distance import classical_mds, cluster, js_divergence
from compressor.analysis.roles import RoleAccumulator, RoleConfig, frequent_ids, token_frequencies
from compressor.core.errors import UserError
from compressor.surgery.arch import presence_mask

SCHEMA = 1
SYNTAX_OFF = "turned off by the caller (syntax=False / --no-syntax)"
log = logging.getLogger("compressor")
TOKEN_ROLES = ("positional", "rare_word", "syntactic", "delimiter")
SIEVE_ROLES = tuple(f"sieve_{r}" for r in sv.SIEVE_ROLES)
SPECIALISED = ("positional", "rare_word", "syntactic")

# The per-head token-role maps every analysis reports (layer × head grids), in the order they are shown.
TOKEN_MAPS = (
    "confidence",
    "positional_share",
    "positional_offset",
    "rare_share",
    "cls_share",
    "sep_share",
    "punct_share",
    "delimiter_share",
)


def head_name(layer: int, head: int) -> str:
    """0-based `L<layer>H<head>` (original head id)."""
    return f"L{layer}H{head}"


def _grid(values: torch.Tensor | np.ndarray, present: torch.Tensor, digits: int = 4) -> list[list]:
    """[L, H] values → nested lists; absent heads and non-finite values become None."""
    v = torch.as_tensor(np.asarray(values, dtype=np.float64)).reshape(present.shape)
    out = []
    for row, alive in zip(v.tolist(), present.tolist(), strict=True):
        out.append([round(x, digits) if a and math.isfinite(x) else None for x, a in zip(row, alive, strict=True)])
    return out


def _flags(values: torch.Tensor | np.ndarray, present: torch.Tensor) -> list[list]:
    v = torch.as_tensor(np.asarray(values, dtype=bool)).reshape(present.shape)
    return [
        [bool(x) if a else None for x, a in zip(r, p, strict=True)]
        for r, p in zip(v.tolist(), present.tolist(), strict=True)
    ]


def _sieves(example, piece_word, heads, aligned, sentences) -> dict[str, torch.Tensor | None]:
    """The four sieves of one example (None where the role is undefined for it)."""
    out = {
        "local": sv.local_sieve(example.special),
        "delimiter": sv.delimiter_sieve(example.cls, example.sep),
        "syntactic": None,
        "block": None,
    }
    seg = example.blocks  # the text of a pair each piece belongs to
    if len(set(seg[~example.special].tolist())) > 1:
        out["block"] = sv.block_sieve(seg)
    elif piece_word is not None:
        blocks = torch.tensor([sentences[w] if w >= 0 else -1 for w in piece_word])
        if len(set(blocks[blocks >= 0].tolist())) > 1:
            out["block"] = sv.block_sieve(blocks)
    if piece_word is not None:
        out["syntactic"] = sv.syntactic_sieve(piece_word, heads, aligned)
    return out


def _parser(syntax: bool | Literal["auto"]):
    """(spaCy pipeline or None, why syntax is skipped or None) for `analyze_heads`'s `syntax` argument."""
    if syntax == "auto":
        try:
            return sx.load_parser(), None
        except sx.ParserUnavailable as err:
            log.warning("analysis: syntactic roles skipped: %s (to get them: %s)", err.reason, sx.INSTALL_HINT)
            return None, err.reason
    if syntax:
        return sx.load_parser(), None
    return None, SYNTAX_OFF


def _nonempty(text: Text) -> bool:
    return any(t and t.strip() for t in ((text,) if isinstance(text, str) else text))


def analyze_heads(
    model: nn.Module,
    tokenizer,
    texts: Sequence[Text],
    train_texts: Sequence[Text],
    *,
    max_length: int = 128,
    batch_size: int = 16,
    scores: dict[str, torch.Tensor] | None = None,
    syntax: bool | Literal["auto"] = True,
    config: RoleConfig | None = None,
) -> dict:
    """Roles, sieve tests, confidence, criterion maps and JS distances for every head, over `texts`.

    `texts` are single strings, or `(first, second)` tuples for a sentence-pair task (encoded as a pair, as in
    training; `collect.model_texts` builds either from a dataset split). `train_texts` (same kind) give the piece
    frequencies of the rare-word role; `scores` ({criterion: [L, H]}) are added as maps. `syntax=True` needs spaCy
    and its English model (a one-line `UserError` otherwise); `syntax=False` skips spaCy (no syntactic role, no
    syntactic sieve, block only for pair inputs); `syntax="auto"` uses spaCy when it can be loaded and otherwise
    logs one warning and goes on without it. `result["settings"]["syntax_skipped"]` says why syntax was skipped
    (None when it ran). The keyword options are `compressor analyze`'s and the recipe's `analysis` settings.
    """
    config = config or RoleConfig()
    texts = [t for t in texts if _nonempty(t)]
    if not texts:
        raise UserError("analysis: no non-empty texts to analyse; expected at least one evaluation example")
    present = presence_mask(model)
    nlp, skipped = _parser(syntax)
    seen = _collect(model, tokenizer, texts, train_texts, present, max_length, batch_size, config, nlp)
    result = _assemble(present, config, seen, scores, max_length)
    result["settings"]["syntax_skipped"] = skipped
    return result


@dataclass
class _Pass:
    """What one pass over the examples accumulated: token roles (`acc`), syntactic relations (`rel`, None without
    a parser), sieve biases per role, the mean JS distance between present heads (`alive_idx`), and the inputs'
    shape (how many examples, whether they were sentence pairs)."""

    acc: RoleAccumulator
    rel: sx.RelationAccumulator | None
    biases: dict[str, list[torch.Tensor]]
    js: torch.Tensor
    alive_idx: torch.Tensor
    examples: int
    pairs: bool


def _collect(model, tokenizer, texts, train_texts, present, max_length, batch_size, config, nlp) -> _Pass:
    """Run the model over `texts` once, feeding every example's attention to each accumulator. Nine arguments: the
    analysis inputs and settings `analyze_heads` resolved, passed on as they are."""
    n_layers, n_heads = present.shape
    k = n_layers * n_heads
    alive_idx = torch.nonzero(present.flatten()).flatten()
    examples = encode(tokenizer, texts, max_length)
    # piece frequencies per text (a pair's two texts counted separately; specials excluded anyway)
    counts = token_frequencies(
        tokenizer, [t for col in split_texts(list(train_texts) or texts) for t in col], max_length
    )
    acc = RoleAccumulator(k, max_length, counts, frequent_ids(counts, config.rare_top_k))
    rel = sx.RelationAccumulator(k) if nlp is not None else None
    docs = sx.parse_parts(nlp, [e.parts for e in examples]) if nlp is not None else [None] * len(examples)
    biases: dict[str, list[torch.Tensor]] = {r: [] for r in sv.SIEVE_ROLES}
    js_sum, js_n = torch.zeros(len(alive_idx), len(alive_idx)), 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    maps = tqdm(attention_maps(model, examples, batch_size, pad), total=len(examples), desc="analysis", leave=False)
    for i, (example, att) in enumerate(maps):
        att = att.reshape(k, example.n, example.n)
        acc.update(example, att)
        js_sum += js_divergence(att[alive_idx])
        js_n += 1
        piece_word = heads = aligned = sentences = None
        if docs[i] is not None:
            spans, heads, deps, sentences = sx.parts_words(docs[i])
            piece_word = sx.align_segments(example.offsets, example.special, example.blocks, spans)
            word_att, aligned = sx.word_attention(att, piece_word, len(heads))
            rel.update(word_att, aligned, sx.relation_instances(heads, deps, aligned))
        for role, sieve in _sieves(example, piece_word, heads, aligned, sentences).items():
            if sieve is not None:
                biases[role].append(sv.sieve_bias(att, sieve, example.words))
    pairs = len(examples[0].parts) > 1
    return _Pass(acc, rel, biases, js_sum / max(js_n, 1), alive_idx, len(examples), pairs)


def _syntactic(roles: dict, table: list[dict], k: int) -> torch.Tensor:
    """Mark the heads syntactic in any relation (`roles["syntactic"]`); returns each head's best gain over the
    relation baselines (NaN where no relation was counted)."""
    syntactic = torch.zeros(k, dtype=torch.bool)
    gain = torch.full((k,), float("nan"))
    for row in table:
        syntactic |= row["syntactic"]
        g = row["accuracy"] - row["baseline"]
        gain = torch.where(torch.isnan(gain), g, torch.maximum(gain, g))
    roles["syntactic"] = syntactic
    return gain


def _sieve_tests(roles: dict, maps: dict, biases: dict, present: torch.Tensor, config: RoleConfig) -> dict:
    """The sieve tests per role over the present heads: adds each role's mean-bias map and flags (`sieve_<role>`);
    returns the report's `sieve` section."""
    k, flat_present = present.numel(), present.flatten().numpy()
    samples = {
        r: (torch.stack(b).numpy() if b else np.full((0, k), np.nan))[:, flat_present] for r, b in biases.items()
    }
    tested = sv.assign_roles(samples, config.sieve_tau, config.sieve_alpha, config.sieve_test, config.sieve_correction)

    def expand(x: np.ndarray, fill) -> np.ndarray:
        full = np.full(k, fill, dtype=np.asarray(x).dtype if fill is not None else float)
        full[flat_present] = x
        return full

    out = {}
    for role, t in tested.items():
        maps[f"sieve_bias_{role}"] = _grid(expand(t["mean_bias"], np.nan), present)
        out[role] = {
            "mean_bias": maps[f"sieve_bias_{role}"],
            "p": _grid(expand(t["p"], np.nan), present, 6),
            "p_adjusted": _grid(expand(t["p_adjusted"], np.nan), present, 6),
            "reject": _flags(expand(t["reject"], False), present),
            "sequences": int(np.max(t["sequences"])) if t["sequences"].size else 0,
        }
        roles[f"sieve_{role}"] = torch.as_tensor(expand(t["reject"], False))
    return {
        "tau": config.sieve_tau,
        "alpha": config.sieve_alpha,
        "test": config.sieve_test,
        "correction": config.sieve_correction,
        "tests": int(sum(np.isfinite(t["p"]).sum() for t in tested.values())),
        "roles": out,
    }


def _assemble(present: torch.Tensor, config: RoleConfig, seen: _Pass, scores: dict | None, max_length: int) -> dict:
    """The analysis result from one pass: role flags and counts, maps, relations, sieve tests, JS clustering."""
    roles = seen.acc.result(config)
    n_layers, n_heads = present.shape
    syntax = seen.rel is not None
    table = seen.rel.table(config.min_relation_count, config.syntactic_margin) if syntax else []
    gain = _syntactic(roles, table, present.numel())
    maps = {name: _grid(roles[name], present) for name in TOKEN_MAPS}
    if syntax:
        maps["syntactic_gain"] = _grid(gain, present)
    sieve = _sieve_tests(roles, maps, seen.biases, present, config)
    for name, s in (scores or {}).items():
        maps[f"score_{name}"] = _grid(
            torch.as_tensor(s, dtype=torch.float64).masked_fill(~present, float("nan")), present, 6
        )
    flags = {r: roles[r] & present.flatten() for r in (*TOKEN_ROLES, *SIEVE_ROLES)}
    result = {
        "schema": SCHEMA,
        "layers": n_layers,
        "heads": n_heads,
        "present": present.tolist(),
        "examples": seen.examples,
        "settings": {**config.model_dump(), "max_length": max_length, "syntax": syntax, "pairs": seen.pairs},
        "maps": maps,
        "roles": {r: _flags(f, present) for r, f in flags.items()},
        "counts": {r: int(f.sum()) for r, f in flags.items()},
        "positional_heads": _positional_list(roles, present),
        "relations": [_relation_row(row, n_heads, present) for row in table],
        "sieve": sieve,
        "rare_word": {"sentences": seen.acc.rare_sentences, "top_k_excluded": config.rare_top_k},
        "overlaps": {
            "roles": overlaps({r: flags[r] for r in TOKEN_ROLES}),
            "sieve": overlaps({r: flags[r] for r in SIEVE_ROLES}),
        },
        "js": _js_block(seen.js, seen.alive_idx, n_heads),
        "score_correlations": _score_correlations(scores, roles["confidence"], present),
    }
    counts = result["counts"]
    counts["any"] = int(sum(role_masks(result)["any"].flatten()))
    counts["analysed_heads"] = int(present.sum())
    return result


def _positional_list(roles: dict, present: torch.Tensor) -> list[dict]:
    out = []
    n_heads = present.shape[1]
    for idx in torch.nonzero(roles["positional"] & present.flatten()).flatten().tolist():
        layer, head = divmod(idx, n_heads)
        out.append(
            {
                "head": head_name(layer, head),
                "offset": int(roles["positional_offset"][idx]),
                "share": round(float(roles["positional_share"][idx]), 4),
            }
        )
    return out


def _relation_row(row: dict, n_heads: int, present: torch.Tensor) -> dict:
    acc = row["accuracy"].masked_fill(~present.flatten(), float("-inf"))
    best = int(acc.argmax())
    heads = torch.nonzero(row["syntactic"] & present.flatten()).flatten().tolist()
    return {
        "relation": row["relation"],
        "direction": row["direction"],
        "count": row["count"],
        "baseline_offset": row["baseline_offset"],
        "baseline": round(row["baseline"], 4),
        "best_head": head_name(*divmod(best, n_heads)),
        "best_accuracy": round(float(acc[best]), 4),
        "gain": round(float(acc[best]) - row["baseline"], 4),
        "syntactic_heads": [head_name(*divmod(h, n_heads)) for h in heads],
    }


def _js_block(js: torch.Tensor, alive_idx: torch.Tensor, n_heads: int) -> dict:
    div = js.numpy().astype(float)
    names = [head_name(*divmod(int(i), n_heads)) for i in alive_idx]
    clusters = cluster(div)
    return {
        "heads": names,
        "divergence": np.round(div, 5).tolist(),
        "order": clusters["order"],
        "clusters": clusters["labels"],
        "linkage": clusters["linkage"],
        "mds": np.round(classical_mds(div), 5).tolist() if len(names) else [],
    }


def _score_correlations(scores, confidence: torch.Tensor, present: torch.Tensor) -> dict:
    """Spearman ρ between each criterion's scores and Voita's confidence over the analysed heads."""
    out = {}
    for name, s in (scores or {}).items():
        x = torch.as_tensor(s, dtype=torch.float64).flatten()
        ok = present.flatten() & torch.isfinite(x)
        if int(ok.sum()) >= 3:
            rho = stats.spearmanr(x[ok].numpy(), confidence.double()[ok].numpy()).statistic
            out[name] = {"spearman_vs_confidence": None if not math.isfinite(rho) else round(float(rho), 4)}
    return out


def overlaps(flags: dict[str, torch.Tensor]) -> dict:
    """Heads per exact role combination ("none" for heads with no role) and per pair of roles."""
    names = list(flags)
    combos: dict[str, int] = {}
    if names:
        stacked = torch.stack([flags[n].bool() for n in names], 1)
        for row in stacked.tolist():
            key = "+".join(n for n, f in zip(names, row, strict=True) if f) or "none"
            combos[key] = combos.get(key, 0) + 1
    pairs = {f"{a}&{b}": int((flags[a] & flags[b]).sum()) for a, b in itertools.combinations(names, 2)}
    return {"combinations": dict(sorted(combos.items(), key=lambda kv: -kv[1])), "pairs": pairs}


def role_masks(result: dict) -> dict[str, torch.Tensor]:
    """[L, H] bool per role (absent heads False), plus "any" = positional ∪ rare_word ∪ syntactic."""
    masks = {
        role: torch.tensor([[bool(v) for v in row] for row in grid], dtype=torch.bool)
        for role, grid in result["roles"].items()
    }
    shape = (result["layers"], result["heads"])
    any_mask = torch.zeros(shape, dtype=torch.bool)
    for role in SPECIALISED:
        if role in masks:
            any_mask |= masks[role]
    masks["any"] = any_mask
    return masks


def kept_vs_removed(result: dict, alive: torch.Tensor) -> dict:
    """Per role: how many of the kept and of the removed heads carry it, and the share within each group.

    `alive` is [L, H] over original ids (True = kept). Heads absent from the analysed model count in neither group.
    """
    alive = torch.as_tensor(alive, dtype=torch.bool)
    present = torch.tensor(result["present"], dtype=torch.bool)
    if tuple(alive.shape) != tuple(present.shape):
        raise ValueError(f"alive: expected shape {tuple(present.shape)}, got {tuple(alive.shape)}")
    kept, removed = alive & present, ~alive & present
    n_kept, n_removed = int(kept.sum()), int(removed.sum())
    out: dict = {"heads_kept": n_kept, "heads_removed": n_removed, "roles": {}}
    for role, mask in role_masks(result).items():
        a, b = int((mask & kept).sum()), int((mask & removed).sum())
        out["roles"][role] = {
            "kept": a,
            "kept_share": round(a / n_kept, 4) if n_kept else None,
            "removed": b,
            "removed_share": round(b / n_removed, 4) if n_removed else None,
        }
    return out
