"""Pande et al. 2021 ("The heads hypothesis"): sieve bias scores and one-sided tests per head and role.

For query i and role f the sieve S_f(i) is the set of keys the role says to look at:
- local: the neighbours i−1 and i+1 (non-special);
- syntactic: every piece of the words joined to i's word by a dependency arc (head or dependent);
- block: every piece of the same block: the same text of a sentence pair (the tokenizer's sequence ids, so also
  for models whose token_type_ids are all 0), else the same spaCy sentence; sequences with a single block carry no
  information and are skipped;
- delimiter: [CLS] and [SEP].
Queries are the non-special pieces with a non-empty sieve. The sieve bias of a sequence is the attention per key
inside the sieves divided by the attention per key overall (1/n, since rows sum to 1):
`bias = (Σ_i Σ_{j∈S(i)} A_ij / Σ_i |S(i)|) · n`; 1 means no preference.

A role is assigned when a one-sided test rejects H0: mean bias ≤ τ over sequences (default a one-sample t-test;
`wilcoxon` tests the median instead), after correcting the p-values of all head × role tests together
(Holm by default; `bh` = Benjamini–Hochberg via scipy, `bonferroni`, `none`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

SIEVE_ROLES = ("local", "syntactic", "block", "delimiter")


def local_sieve(special: torch.Tensor) -> torch.Tensor:
    """[n, n] bool: keys at offsets ±1 that are not special tokens."""
    n = special.shape[0]
    idx = torch.arange(n)
    near = (idx[:, None] - idx[None, :]).abs() == 1
    return near & ~special[None, :]


def delimiter_sieve(cls: torch.Tensor, sep: torch.Tensor) -> torch.Tensor:
    """[n, n] bool: every query's sieve is the set of [CLS]/[SEP] positions."""
    keys = cls | sep
    return keys[None, :].expand(keys.shape[0], -1).clone()


def block_sieve(blocks: torch.Tensor) -> torch.Tensor:
    """[n, n] bool: same block id (−1 = no block, e.g. special tokens)."""
    same = blocks[:, None] == blocks[None, :]
    return same & (blocks[:, None] >= 0) & (blocks[None, :] >= 0)


def syntactic_sieve(piece_word: list[int], heads: list[int], aligned: torch.Tensor) -> torch.Tensor:
    """[n, n] bool: keys in words that are the query word's syntactic head or dependents."""
    n_words = len(heads)
    adj = torch.zeros(n_words, n_words, dtype=torch.bool)
    for i, h in enumerate(heads):
        if h != i and aligned[i] and aligned[h]:
            adj[i, h] = adj[h, i] = True
    pw = torch.tensor(piece_word)
    valid = pw >= 0
    out = torch.zeros(len(piece_word), len(piece_word), dtype=torch.bool)
    if valid.any():
        w = pw.clamp_min(0)
        out = adj[w][:, w] & valid[:, None] & valid[None, :]
    return out


def sieve_bias(att: torch.Tensor, sieve: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """[K] sieve bias of one sequence (NaN when no query has a non-empty sieve)."""
    n = att.shape[-1]
    q = queries & sieve.any(1)
    size = sieve[q].sum()
    if int(size) == 0:
        return torch.full((att.shape[0],), float("nan"))
    inside = (att[:, q] * sieve[q][None].to(att.dtype)).sum((1, 2))
    return inside / float(size) * n


def one_sided_pvalues(samples: np.ndarray, tau: float, test: str = "t") -> np.ndarray:
    """p-values per column of `samples` [sequences, K] (NaN = missing) for H0: mean ≤ τ vs H1: mean > τ.

    A column with fewer than 2 values gets NaN (untested); a constant column gets 0 if above τ else 1.
    """
    out = np.full(samples.shape[1], np.nan)
    for k in range(samples.shape[1]):
        x = samples[:, k]
        x = x[np.isfinite(x)]
        if x.size < 2:
            continue
        if np.ptp(x) == 0:
            out[k] = 0.0 if x[0] > tau else 1.0
            continue
        if test == "t":
            out[k] = stats.ttest_1samp(x, popmean=tau, alternative="greater").pvalue
        elif test == "wilcoxon":
            d = x - tau
            out[k] = 1.0 if np.all(d == 0) else stats.wilcoxon(d, alternative="greater").pvalue
        else:
            raise ValueError(f"analysis.roles.sieve_test: expected 't' or 'wilcoxon', got '{test}'")
    return out


def holm(p: np.ndarray) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (step-down, monotone, capped at 1)."""
    m = p.size
    order = np.argsort(p)
    adjusted = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.maximum.accumulate(adjusted)
    out = np.empty(m)
    out[order] = adjusted
    return out


def adjust(p: np.ndarray, method: str) -> np.ndarray:
    """Multiple-comparison adjustment of the finite entries of `p` (NaN stays NaN)."""
    out = np.full_like(p, np.nan, dtype=float)
    finite = np.isfinite(p)
    if not finite.any():
        return out
    x = p[finite]
    if method == "holm":
        out[finite] = holm(x)
    elif method == "bh":
        out[finite] = stats.false_discovery_control(x, method="bh")
    elif method == "bonferroni":
        out[finite] = np.minimum(1.0, x * x.size)
    elif method == "none":
        out[finite] = x
    else:
        raise ValueError(
            f"analysis.roles.sieve_correction: expected 'holm', 'bh', 'bonferroni' or 'none', got '{method}'"
        )
    return out


def assign_roles(
    biases: dict[str, np.ndarray], tau: float, alpha: float, test: str = "t", correction: str = "holm"
) -> dict[str, dict]:
    """Per role: mean bias, raw and adjusted p-values and rejections ([K] each); adjustment spans all roles."""
    raw = {role: one_sided_pvalues(x, tau, test) for role, x in biases.items()}
    names = list(raw)
    flat = np.concatenate([raw[r] for r in names]) if names else np.zeros(0)
    adj = adjust(flat, correction)
    out, start = {}, 0
    for role in names:
        k = raw[role].size
        a = adj[start : start + k]
        start += k
        x = biases[role]
        with np.errstate(all="ignore"):
            mean = np.array([np.nanmean(c) if np.isfinite(c).any() else math.nan for c in x.T])
        out[role] = {
            "mean_bias": mean,
            "sequences": np.isfinite(x).sum(0),
            "p": raw[role],
            "p_adjusted": a,
            "reject": np.nan_to_num(a, nan=1.0) < alpha,
        }
    return out
