"""The bench plots: throughput vs batch size, accuracy vs speed-up, heads per layer (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compressor.bench.timing import headline_batch


def _save(fig, ax, path: Path) -> Path:
    """Finish a benchmark figure the same way for every plot: grid, legend, tight layout, PNG, closed."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


LINE_STYLES = ("-", "--", ":", "-.")


MARKERS = ("o", "s", "^", "D")


def plot_throughput(result: dict, path: Path) -> Path:
    """Examples/s vs batch size: one colour per variant, one line style and marker per sequence length."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    sizes, lengths = result["setup"]["batch_sizes"], result["setup"]["seq_lens"]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, per_seq) in enumerate(result["throughput"].items()):
        for j, seq in enumerate(lengths):
            rows = per_seq[str(seq)]
            med = [rows[str(b)]["examples_per_s"]["median"] for b in sizes]
            low = [rows[str(b)]["examples_per_s"]["q1"] for b in sizes]
            high = [rows[str(b)]["examples_per_s"]["q3"] for b in sizes]
            colour = colours[i % len(colours)]
            label = name if len(lengths) == 1 else f"{name}, {seq} tokens"
            style = {"ls": LINE_STYLES[j % len(LINE_STYLES)], "marker": MARKERS[j % len(MARKERS)]}
            ax.plot(sizes, med, color=colour, label=label, **style)
            ax.fill_between(sizes, low, high, color=colour, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("examples / s (median, IQR band)")
    if len(lengths) > 1:
        ax.set_yscale("log")
    which = "length" if len(lengths) == 1 else "lengths"
    ax.set_title(f"Throughput at sequence {which} {', '.join(map(str, lengths))}")
    return _save(fig, ax, path)


def plot_accuracy_speedup(result: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    head, seq = str(headline_batch(result["setup"]["batch_sizes"])), str(result["setup"]["seq_lens"][0])
    for name, s in result["summary"].items():
        sp = result["speedups"][name][seq][head]
        acc = s.get("accuracy")
        y = 100 * acc if acc is not None else 100 * s.get("agreement", float("nan"))
        ci = s.get("accuracy_ci95")
        yerr = [[y - 100 * ci[0]], [100 * ci[1] - y]] if ci else None
        xerr = [[sp["median"] - sp["q1"]], [sp["q3"] - sp["median"]]]
        ax.errorbar(sp["median"], y, xerr=xerr, yerr=yerr, fmt="o", capsize=3, label=name)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(f"speed-up vs {result['reference']} at batch {head}, {seq} tokens (median, IQR)")
    has_acc = result["quality"] is not None and result["quality"]["has_labels"]
    ax.set_ylabel("accuracy (%), 95% CI" if has_acc else "agreement with reference (%)")
    ax.set_title("Accuracy vs speed-up")
    return _save(fig, ax, path)


def plot_heads(result: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = {}
    for name, s in result["summary"].items():
        hpl = s["heads_per_layer"]
        if hpl is not None and tuple(hpl) not in {tuple(v) for v in rows.values()}:
            rows[name] = hpl
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    width = 0.8 / max(len(rows), 1)
    for i, (name, hpl) in enumerate(rows.items()):
        ax.bar(np.arange(len(hpl)) + i * width, hpl, width=width, label=name)
    if rows:
        n_layers = len(next(iter(rows.values())))
        ax.set_xticks(np.arange(n_layers) + width * (len(rows) - 1) / 2, [str(i) for i in range(n_layers)])
    ax.set_xlabel("layer")
    ax.set_ylabel("attention heads left")
    ax.set_title("Heads left per layer")
    if rows:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


FRONTIER_MARKERS = {"member": "o", "original": "s", "baseline": "x", "reference": "D"}


def plot_frontier(rows: list[dict], path: Path) -> Path:
    """Test accuracy vs speed-up of every frontier row (`bench.frontier`), one colour per runtime, one marker per
    role; Pareto-optimal points ringed and joined, members and references labelled (a reference by "ref <label>")."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    runtimes = sorted({r["runtime"] for r in rows})
    colours = dict(zip(runtimes, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    seen = set()
    for r in rows:
        if r["speedup"] is None or r["accuracy"] is None:
            continue
        key = (r["role"], r["runtime"])
        label = f"{r['role']} · {r['runtime']}" if key not in seen else None
        seen.add(key)
        ax.scatter(r["speedup"], 100 * r["accuracy"], marker=FRONTIER_MARKERS[r["role"]], color=colours[r["runtime"]],
                   label=label, zorder=3)  # fmt: skip
        if r["role"] in ("member", "reference"):
            text = r["model"] if r["role"] == "member" else f"ref {r['model']}"
            ax.annotate(text, (r["speedup"], 100 * r["accuracy"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
    best = sorted((r for r in rows if r["pareto"]), key=lambda r: r["speedup"])
    if best:
        ax.plot([r["speedup"] for r in best], [100 * r["accuracy"] for r in best], color="black", lw=0.8, ls=":")
        ax.scatter([r["speedup"] for r in best], [100 * r["accuracy"] for r in best], s=120, facecolors="none",
                   edgecolors="black", label="Pareto-optimal", zorder=2)  # fmt: skip
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    batch, seq = rows[0]["batch"], rows[0]["seq_len"]
    ax.set_xlabel(f"speed-up vs the PyTorch original at batch {batch}, {seq} tokens (median)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Speed/quality frontier")
    return _save(fig, ax, path)
