"""Head distances (Clark et al. 2019): Jensen–Shannon divergence between two heads' attention distributions.

Clark sums the divergence over the tokens of a sequence; we average it over the (real) query tokens and then over
sequences, so the value is comparable across lengths and lies in [0, 1] (base-2 logarithms). Clustering uses the
Jensen–Shannon *distance* √JSD (a metric) with average linkage; a classical-MDS embedding gives Clark's 2-D plot.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.cluster.hierarchy import fcluster, leaves_list, linkage
from scipy.spatial.distance import squareform

LN2 = math.log(2.0)


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(p, p).sum(-1) / LN2


def js_divergence(att: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """[K, K] mean over queries of JSD(head a's row, head b's row) for one sequence's attention [K, n, n]."""
    k = att.shape[0]
    h = _entropy(att)  # [K, n]
    out = torch.zeros(k, k)
    for start in range(0, k, chunk):
        a = att[start : start + chunk]
        mix = (a[:, None] + att[None]) / 2  # [c, K, n, n]
        jsd = _entropy(mix) - (h[start : start + chunk, None] + h[None]) / 2
        out[start : start + chunk] = jsd.clamp_min(0).mean(-1)
    return out


def cluster(divergence: np.ndarray, max_clusters: int = 8) -> dict:
    """Average-linkage clustering on √JSD: leaf order, flat cluster labels (≤ `max_clusters`), linkage matrix."""
    k = divergence.shape[0]
    if k < 2:
        return {"order": list(range(k)), "labels": [1] * k, "linkage": []}
    dist = np.sqrt(np.clip((divergence + divergence.T) / 2, 0, None))
    np.fill_diagonal(dist, 0.0)
    z = linkage(squareform(dist, checks=False), method="average")
    labels = fcluster(z, t=min(max_clusters, k), criterion="maxclust")
    return {"order": leaves_list(z).tolist(), "labels": labels.tolist(), "linkage": z.tolist()}


def classical_mds(divergence: np.ndarray, dims: int = 2) -> np.ndarray:
    """[K, dims] coordinates whose Euclidean distances approximate √JSD (Torgerson's classical MDS)."""
    k = divergence.shape[0]
    d2 = np.clip((divergence + divergence.T) / 2, 0, None)  # squared distance = JSD
    j = np.eye(k) - np.ones((k, k)) / k
    b = -0.5 * j @ d2 @ j
    vals, vecs = np.linalg.eigh(b)
    top = np.argsort(vals)[::-1][:dims]
    coords = vecs[:, top] * np.sqrt(np.clip(vals[top], 0, None))
    if coords.shape[1] < dims:
        coords = np.pad(coords, ((0, 0), (0, dims - coords.shape[1])))
    return coords
