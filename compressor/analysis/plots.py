"""Figures for the head analysis (matplotlib, Agg backend): layer × head maps, role grid, JS clustering, pruning.

Removed heads (None in the result) are drawn blank. Head ids are 0-based original ids.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.cluster.hierarchy import dendrogram  # noqa: E402

ROLE_COLORS = {
    "positional": "tab:blue",
    "rare_word": "tab:orange",
    "syntactic": "tab:green",
    "delimiter": "tab:gray",
}


def _array(grid: list[list]) -> np.ndarray:
    return np.array([[np.nan if v is None else float(v) for v in row] for row in grid], dtype=float)


def _annotate(ax, data: np.ndarray, fmt: str) -> None:
    if data.size > 200:
        return
    finite = data[np.isfinite(data)]
    mid = (finite.max() + finite.min()) / 2 if finite.size else 0
    for (i, j), v in np.ndenumerate(data):
        if np.isfinite(v):
            ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=6, color="white" if v < mid else "black")


def heatmaps(maps: dict[str, list[list]], path: Path, cols: int = 3) -> Path:
    """One panel per map (layers × heads), each with its own colour bar and values written in the cells."""
    names = list(maps)
    rows = max(1, -(-len(names) // cols))
    first = _array(maps[names[0]]) if names else np.zeros((1, 1))
    w, h = max(3.0, 0.45 * first.shape[1] + 1.5), max(2.0, 0.45 * first.shape[0] + 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * w, rows * h), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        data = _array(maps[name])
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
        im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, aspect="auto")
        _annotate(ax, data, ".0f" if name == "positional_offset" else ".2f")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(data.shape[1]))
        ax.set_yticks(range(data.shape[0]))
        ax.tick_params(labelsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def role_grid(roles: dict[str, list[list]], present: list[list[bool]], path: Path) -> Path:
    """Each head a cell split into one stripe per token-level role (coloured when the head has it)."""
    names = [r for r in ROLE_COLORS if r in roles]
    pres = np.array(present, dtype=bool)
    n_layers, n_heads = pres.shape
    fig, ax = plt.subplots(figsize=(0.55 * n_heads + 2.5, 0.5 * n_layers + 1.2))
    width = 1.0 / max(len(names), 1)
    for layer in range(n_layers):
        for head in range(n_heads):
            if not pres[layer, head]:
                ax.add_patch(plt.Rectangle((head, layer), 1, 1, color="white", hatch="//", ec="lightgray"))
                continue
            for k, role in enumerate(names):
                on = bool(roles[role][layer][head])
                ax.add_patch(
                    plt.Rectangle((head + k * width, layer), width, 1, color=ROLE_COLORS[role] if on else "whitesmoke")
                )
            ax.add_patch(plt.Rectangle((head, layer), 1, 1, fill=False, ec="white", lw=1.5))
    ax.set_xlim(0, n_heads)
    ax.set_ylim(n_layers, 0)
    ax.set_xticks(np.arange(n_heads) + 0.5, range(n_heads))
    ax.set_yticks(np.arange(n_layers) + 0.5, range(n_layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    handles = [plt.Rectangle((0, 0), 1, 1, color=ROLE_COLORS[r]) for r in names]
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title("head roles (stripes: " + ", ".join(names) + "; hatched = removed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def js_clustering(js: dict, path: Path) -> Path:
    """Dendrogram (average linkage on √JSD) and a classical-MDS map of the heads coloured by layer (Clark Fig. 6)."""
    names = js["heads"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1.4, 1]})
    if len(names) >= 2 and js["linkage"]:
        dendrogram(np.array(js["linkage"]), labels=names, ax=left, leaf_font_size=6, color_threshold=None)
        left.set_ylabel("Jensen–Shannon distance (√JSD)")
    left.set_title("head clustering by attention behaviour")
    coords = np.array(js["mds"]) if js["mds"] else np.zeros((0, 2))
    layers = np.array([int(n[1 : n.index("H")]) for n in names]) if names else np.zeros(0)
    sc = right.scatter(coords[:, 0], coords[:, 1], c=layers, cmap="viridis", s=30) if len(names) else None
    for (x, y), name in zip(coords, names, strict=False):
        right.annotate(name, (x, y), fontsize=5, alpha=0.8)
    if sc is not None:
        fig.colorbar(sc, ax=right, label="layer")
    right.set_title("MDS of JS distances (colour = layer)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pruning_roles(steps: list[dict], roles: list[str], path: Path) -> Path:
    """Voita Fig. 8 style: per pruning step, how many kept heads carry each role (and how many kept heads)."""
    labels = [str(s.get("label", s.get("step"))) for s in steps]
    x = np.arange(len(steps))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6, 1.2 * len(steps) + 3), 7), sharex=True)
    width = 0.8 / max(len(roles), 1)
    centre = x + 0.4 - width / 2
    for k, role in enumerate(roles):
        kept = [s["roles"][role]["kept"] for s in steps]
        share_kept = [s["roles"][role]["kept_share"] or 0 for s in steps]
        share_removed = [s["roles"][role]["removed_share"] or 0 for s in steps]
        color = ROLE_COLORS.get(role, f"C{k}")
        top.bar(x + k * width, kept, width, label=role, color=color)
        bottom.plot(centre, share_kept, "-o", color=color, label=f"{role} (kept)")
        bottom.plot(centre, share_removed, "--x", color=color, label=f"{role} (removed)")
    top.plot(centre, [s["heads_kept"] for s in steps], "k_", markersize=20, label="heads kept")
    top.set_ylabel("kept heads with the role")
    top.legend(fontsize=7, ncol=3)
    bottom.set_ylabel("share of group with the role")
    bottom.set_xticks(centre, labels)
    bottom.set_xlabel("pruning step")
    bottom.legend(fontsize=6, ncol=2)
    fig.suptitle("roles of the heads kept vs removed as pruning proceeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
