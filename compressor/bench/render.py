"""The bench report: report.json (versioned), report.md and the plots, written atomically as one directory."""

from __future__ import annotations

import json
from pathlib import Path

from compressor.bench.plots import plot_accuracy_speedup, plot_heads, plot_throughput
from compressor.bench.timing import headline_batch
from compressor.core import atomic
from compressor.guard.report import REGRESSION_FILES

SCHEMA_VERSION = 2  # 2: throughput/speed-ups keyed [variant][seq_len][batch]; several sequence lengths


BENCH_FILES = ("report.json", "report.md", "throughput_vs_batch.png", "accuracy_vs_speedup.png", "heads_per_layer.png")


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _quality_md(result: dict) -> list[str]:
    q = result["quality"]
    if q is None:
        return ["No evaluation data was given; quality was not measured.", ""]
    ref = q["reference"]
    lines = [
        f"{q['n']} examples, the same batches for every variant (a model with another tokenizer: its own "
        f"tokenisation of them). Δ and McNemar compare each variant with `{ref}` on the same examples; p ≥ 0.05 "
        "means the difference is within noise.",
        "",
        "| variant | accuracy (%) | 95% CI | Δ vs ref (points) | 95% CI of Δ | agreement (%) | max abs Δlogit | "
        "McNemar p |",
        "|---|---:|---|---:|---|---:|---:|---:|",
    ]
    for name, row in q["results"].items():
        if q["has_labels"]:
            ci, dci = row["accuracy_ci95"], row["accuracy_delta_ci95"]
            acc = f"{_pct(row['accuracy'])} | {_pct(ci[0])}–{_pct(ci[1])} | {100 * row['accuracy_delta']:+.2f} | "
            acc += f"{100 * dci[0]:+.2f} to {100 * dci[1]:+.2f}"
            p = _f(row["mcnemar"]["p_value"], ".3g")
        else:
            acc, p = "– | – | – | –", "–"
        diff = _f(row["max_abs_logit_diff"], ".2e")  # None: another tokenizer, logits of other inputs
        lines.append(f"| {name} | {acc} | {_pct(row['agreement'])} | {diff} | {p} |")
    return lines + [""]


def _throughput_md(result: dict) -> list[str]:
    setup, ref = result["setup"], result["reference"]
    lines = []
    for seq in setup["seq_lens"]:
        for b in setup["batch_sizes"]:
            lines += [
                f"### Sequence length {seq}, batch {b}",
                "",
                "| variant | examples/s (median) | IQR | ms/batch (median) | min–max ms | speed-up vs ref | IQR | "
                "FLOP-ideal | measured / ideal | peak RSS growth (MB) |",
                "|---|---:|---|---:|---|---:|---|---:|---:|---:|",
            ]
            for name, per_seq in result["throughput"].items():
                row, sp = per_seq[str(seq)][str(b)], result["speedups"][name][str(seq)][str(b)]
                eps, ms = row["examples_per_s"], row["ms_per_batch"]
                ideal = result["summary"][name]["flop_ideal_speedup_by_seq_len"][str(seq)]
                mem = row["peak_rss_delta_bytes"]
                lines.append(
                    f"| {name} | {eps['median']:.1f} | {eps['q1']:.1f}–{eps['q3']:.1f} | {ms['median']:.2f} | "
                    f"{ms['min']:.2f}–{ms['max']:.2f} | {sp['median']:.3f}× | {sp['q1']:.3f}–{sp['q3']:.3f} | "
                    f"{_f(ideal, '.3f')} | {_f(sp['median'] / ideal if ideal else None, '.3f')} | "
                    f"{_f(mem / 1e6 if mem is not None else None, '.1f')} |"
                )
            lines.append("")
    lines += [
        f"Speed-ups are per-round ratios of seconds per batch against `{ref}` (paired within a round). The FLOP-ideal "
        "ratio is that of encoder FLOPs at the table's sequence length.",
        "",
        f"Peak RSS growth: {MEMORY_CAVEAT}",
    ]
    return lines + [""]


MEMORY_CAVEAT = (
    "how far the process's resident-set high-water mark rose above its resident size while the variant was timed, "
    "median over the rounds (variants visited in a rotating order). All variants run in one process, so memory an "
    "earlier measurement left resident (allocator caches, ONNX Runtime arenas) is not counted again: this is a lower "
    "bound of a variant's working set that still depends somewhat on what ran before it; compare orders of "
    "magnitude, not small differences."
)


def _size_md(result: dict) -> list[str]:
    lengths = result["setup"]["seq_lens"]
    flop_cols = " | ".join(f"encoder FLOPs / example at {s} tokens" for s in lengths)
    lines = [
        f"| variant | kind | size on disk (MB) | size ratio | heads | heads per layer | {flop_cols} |",
        "|---|---|---:|---:|---:|---|" + "---:|" * len(lengths),
    ]
    for name, s in result["summary"].items():
        hpl = " ".join(map(str, s["heads_per_layer"])) if s["heads_per_layer"] is not None else "–"
        by_seq = s["flops_per_example_by_seq_len"]
        flops = " | ".join(f"{by_seq[str(t)]:,}" if by_seq[str(t)] else "–" for t in lengths)
        lines.append(
            f"| {name} | {s['kind']} | {s['size_bytes'] / 1e6:.1f} | {_f(s['size_ratio'], '.2f')}× | "
            f"{_f(s['heads'], 'd')} | {hpl} | {flops} |"
        )
    return lines + [""]


def cpu_line(result: dict) -> list[str]:
    """['CPU: model (x86 generation), cores; int8 features: ...', ''] for a bench result that records its CPU (older
    ones do not: []): the int8 rows' speed-ups hold for CPUs with the same int8 features only."""
    cpu = result.get("cpu")
    if not cpu:
        return []
    generation = f" ({cpu['generation']})" if cpu.get("generation") else ""
    return [
        f"CPU: {cpu['model']}{generation}, {cpu['cores']} cores; int8 features: {cpu['int8_features']} (int8 "
        "speed-ups, marked int8 below, hold for CPUs with the same features: OpenVINO's int8 needs VNNI or AMX to "
        "pay).",
        "",
    ]


def int8_mark(row: dict) -> str:
    """' (int8; CPU: <features>)' for a summary entry or frontier row of an int8 runtime, else ''."""
    features = row.get("cpu_int8_features")
    return f" (int8; CPU: {features})" if features else ""


def render_bench_md(result: dict) -> str:
    """Markdown tables for a `bench` result (pure function of the dict, so it can be re-rendered from JSON)."""
    setup, m, ref = result["setup"], result["machine"], result["reference"]
    head, seq = headline_batch(setup["batch_sizes"]), setup["seq_lens"][0]
    lines = [
        "# Benchmark",
        "",
        f"Reference: `{ref}`. Sequence lengths {setup['seq_lens']} (synthetic ids, no padding); batch sizes "
        f"{setup['batch_sizes']}; every length at every batch size. {setup['rounds']} interleaved rounds (each the "
        f"fastest call of ≥ {setup.get('min_calls', 1)} calls and ≥ {setup['min_time_s']} s) after "
        f"{setup['warmup']} warm-up calls; PyTorch threads {setup['torch_threads']}; threads per variant "
        f"{setup['candidate_threads']}.",
    ]
    for name, note in setup.get("candidate_threads_notes", {}).items():
        lines.append(f"Threads of `{name}`: {note}.")
    if setup.get("stopping"):
        lines.append(f"Rounds are a maximum: {setup['stopping']}.")
    lines += [f"Left out: {line}." for line in result.get("skipped", [])]
    lines += [
        f"Machine: {m['processor']}, {m['cpu_count']} CPUs, load average at the end {m['load_average']}; "
        f"torch {m['torch']}, onnxruntime {m['onnxruntime']}. Absolute times depend on the machine and its load; "
        "compare ratios.",
        "",
        *cpu_line(result),
        f"## Summary (batch {head}, sequence length {seq})",
        "",
        "| variant | accuracy (%) | Δ vs ref (points) | McNemar p | speed-up | FLOP-ideal | size ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in result["summary"].items():
        delta = None if s.get("accuracy_delta") is None else f"{100 * s['accuracy_delta']:+.2f}"
        lines.append(
            f"| {name}{int8_mark(s)} | {_pct(s.get('accuracy'))} | {delta or '–'} | {_f(s.get('mcnemar_p'), '.3g')} | "
            f"{s['headline_speedup']:.3f}× | {_f(s['flop_ideal_speedup'], '.3f')} | {_f(s['size_ratio'], '.2f')}× |"
        )
    lines += ["", "## Quality", "", *_quality_md(result), "## Throughput", "", *_throughput_md(result)]
    lines += ["## Size and heads", "", *_size_md(result)]
    lines += ["## Plots", "", "![throughput](throughput_vs_batch.png)", ""]
    lines += ["![accuracy vs speed-up](accuracy_vs_speedup.png)", "", "![heads per layer](heads_per_layer.png)", ""]
    return "\n".join(lines)


def check_out_dir(out_dir: str | Path) -> Path:
    """Refuse an output directory that holds anything but an earlier benchmark's files (`BENCH_FILES` and a
    regression check's `REGRESSION_FILES`): the bench report replaces the whole directory."""
    return atomic.check_replaceable(out_dir, (*BENCH_FILES, *REGRESSION_FILES), "bench output")


def write_bench_report(result: dict, out_dir: str | Path) -> list[Path]:
    """Write report.json (versioned), report.md and three PNG plots as the directory `out_dir`; returns the paths.

    The directory is built aside and swapped in (`compressor.core.atomic.directory`): readers, and a killed run, see the
    previous complete output or the new one, never a mix.
    """
    import matplotlib

    matplotlib.use("Agg")
    out = check_out_dir(out_dir)
    payload = {k: v for k, v in result.items() if k != "files"}
    payload["schema_version"] = SCHEMA_VERSION
    with atomic.directory(out) as tmp:
        (tmp / "report.json").write_text(json.dumps(payload, indent=2, default=str))
        (tmp / "report.md").write_text(render_bench_md(payload))
        plot_throughput(payload, tmp / "throughput_vs_batch.png")
        plot_accuracy_speedup(payload, tmp / "accuracy_vs_speedup.png")
        plot_heads(payload, tmp / "heads_per_layer.png")
    return [out / name for name in BENCH_FILES]
