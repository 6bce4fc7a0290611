"""The human-readable run report (`report.md`), written from the same dict as `report.json`."""

from __future__ import annotations

from pathlib import Path


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _steps_table(steps: list[dict]) -> list[str]:
    lines = [
        "| step | heads left | heads per layer | val acc after prune | val acc after fine-tune | seconds |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for s in steps:
        ft = s.get("val_after_finetune", {}).get("accuracy")
        lines.append(
            f"| {s['step']} | {s['heads_left']} | {' '.join(map(str, s['heads_per_layer']))} | "
            f"{_pct(s['val_after_prune']['accuracy'])} | {_pct(ft)} | {s['seconds']:.0f} |"
        )
    return lines


def render(report: dict) -> str:
    o, p = report["original"], report["pruned"]
    lines = [
        f"# compressor run: {report['name']}",
        "",
        f"Model `{report['model_source']}` on `{report['data_source']}` (labels: {', '.join(report['labels'])}).",
        "",
        "## Result",
        "",
        "| | original | pruned |",
        "|---|---:|---:|",
        f"| test accuracy (%) | {_pct(o['test']['accuracy'])} | {_pct(p['test']['accuracy'])} |",
        f"| heads | {p['heads_total']} | {p['heads_left']} |",
        f"| parameters | {o['parameters']:,} | {p['parameters']:,} |",
        f"| encoder FLOPs / example | {o['encoder_flops_per_example']:,} | {p['encoder_flops_per_example']:,} |",
        "",
        f"FLOP ratio original/pruned: {p['flop_ratio']:.3f}. Masked vs physically pruned max |Δlogit|: "
        f"{p['masked_vs_pruned_max_abs_diff']:.2e}. Saved model: `{p['model_dir']}`.",
        "",
        "## Pruning steps",
        "",
        *_steps_table(report["steps"]),
    ]
    if "export" in report:
        lines += [
            "",
            "## ONNX export",
            "",
            "| variant | size (MB) | max abs Δlogit vs PyTorch | agreement |",
            "|---|---:|---:|---:|",
        ]
        for name, info in report["export"].items():
            lines.append(
                f"| {name} | {info['size_bytes'] / 1e6:.1f} | {info['max_abs_diff']:.2e} | {_pct(info['agreement'])} |"
            )
    if "bench" in report:
        lines += ["", "## Benchmark", "", "Full tables and plots: [bench/report.md](bench/report.md)."]
    if "analysis" in report:
        lines += ["", "## Head roles", "", "Details and figures: [analysis/analysis.md](analysis/analysis.md).", ""]
        lines += ["| step | role | kept | removed |", "|---:|---|---|---|"]
        for entry in report["analysis"].get("pruning_steps", []):
            for role, row in entry.items():
                if isinstance(row, dict) and "kept" in row:
                    lines.append(f"| {entry['step']} | {role} | {row['kept']} | {row['removed']} |")
    lines += ["", f"Total time: {report.get('seconds', 0):.0f} s.", ""]
    return "\n".join(lines)


def write_run_report(report: dict, out: Path) -> Path:
    from compressor.runner import write_atomic

    path = Path(out) / "report.md"
    write_atomic(path, render(report))
    return path
