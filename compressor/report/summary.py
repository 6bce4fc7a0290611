"""The human-readable report (`report.md`) of a one-target run, rendered from its typed report
(`report.schema.RunReport`, the one `report.json` is written from); `recommendation` computes what it recommends."""

from __future__ import annotations

from compressor.bench.render import _pct, cpu_line, int8_mark
from compressor.deploy.quantize import smoothing_note
from compressor.report.card import describe_distillation
from compressor.report.recommendation import _recommendation_line
from compressor.report.references import references_section, training_lines
from compressor.report.schema import RunReport


def _steps_table(steps: list[dict]) -> list[str]:
    lines = [
        "| step | heads left | heads per layer | val acc after prune | val acc after fine-tune or rescale | seconds |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for s in steps:
        ft = s.get("val_after_finetune", s.get("val_after_rescale", {})).get("accuracy")
        lines.append(
            f"| {s['step']} | {s['heads_left']} | {' '.join(map(str, s['heads_per_layer']))} | "
            f"{_pct(s['val_after_prune']['accuracy'])} | {_pct(ft)} | {s['seconds']:.0f} |"
        )
    return lines


def _bench_table(bench: dict) -> list[str]:
    """One row per candidate: quality with its 95% CI and the paired test, speed-up vs the FLOP ideal."""
    lines = [*cpu_line(bench), "| variant | accuracy (%) [95% CI] | agreement (%) | McNemar p | speed-up (batch, "
             "tokens) | FLOP-ideal |", "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, row in bench.get("summary", {}).items():
        ci = row.get("accuracy_ci95") or [None, None]
        acc = f"{_pct(row.get('accuracy'))} [{_pct(ci[0])}, {_pct(ci[1])}]" if row.get("accuracy") is not None else "–"
        p, speed, ideal = row.get("mcnemar_p"), row.get("headline_speedup"), row.get("flop_ideal_speedup")
        p_text = "–" if p is None else f"{p:.3g}"
        where = ", ".join(str(row[k]) for k in ("headline_batch", "headline_seq_len") if row.get(k) is not None)
        speed_text = "–" if speed is None else f"{speed:.2f}× ({where})"
        ideal_text = "–" if ideal is None else f"{ideal:.2f}×"
        lines.append(f"| {name}{int8_mark(row)} | {acc} | {_pct(row.get('agreement'))} | {p_text} | {speed_text} | "
                     f"{ideal_text} |")  # fmt: skip
    return lines


def _roles_table(analysis: dict) -> list[str]:
    """Share of role-carrying heads among the kept and the removed heads after each step (Voita Fig. 8)."""
    steps = analysis.get("pruning_steps", [])
    if not steps:
        return ["(no pruning steps)"]
    roles = list(steps[0].get("roles", {}))
    lines = ["| step | kept / removed | " + " | ".join(roles) + " |", "|---:|---|" + "---:|" * len(roles)]
    for entry in steps:
        r = entry["roles"]
        kept = " | ".join(f"{r[x]['kept']} ({_pct(r[x]['kept_share'])}%)" for x in roles)
        removed = " | ".join(f"{r[x]['removed']} ({_pct(r[x]['removed_share'])}%)" for x in roles)
        lines.append(f"| {entry['step']} | kept {entry['heads_kept']} | {kept} |")
        lines.append(f"| {entry['step']} | removed {entry['heads_removed']} | {removed} |")
    return lines


def distillation(report: dict) -> dict | None:
    """The distillation settings the recovery fine-tuning used (None when it was off or nothing was fine-tuned)."""
    used = [s["finetune"]["distill"] for s in report.get("steps", []) if s.get("finetune", {}).get("distill")]
    return used[0] if used else None


def recovery_lines(rec: dict | None) -> list[str]:
    """The recovery mode (the report's `recovery` section), its seconds and, for rescale, one row per fitted
    sublayer: the relative residual of the pruned sublayer's output against the unpruned one's before and after the
    least-squares scales."""
    if not rec:
        return []
    sample = f" on a sample of {rec['sample_size']} training examples" if rec.get("sample_size") else ""
    lines = [
        f"Recovery: `{rec['mode']}`{sample}; pruning steps {rec['steps_seconds']:.0f} s (rescale fits "
        f"{rec['rescale_seconds']:.0f} s, fine-tuning {rec['finetune_seconds']:.0f} s)."
    ]
    if rec.get("fits"):
        lines += ["", "| step | layer | units | kept | residual before | residual after | status |",
                  "|---:|---:|---|---:|---:|---:|---|"]  # fmt: skip
        lines += [
            f"| {f['step']} | {e['layer']} | {e['kind']} | {e['units']} | {e['residual_before']:.4f} | "
            f"{e['residual_after']:.4f} | {e['status']} |"
            for f in rec["fits"]
            for e in f["layers"]
        ]
    return lines


def _export_table(export: dict) -> list[str]:
    """One row per ONNX variant: size, parity vs PyTorch, and for int8 the validation gate and its verdict."""
    lines = [
        "| variant | size (MB) | max abs Δlogit vs PyTorch | agreement | val acc vs fp32 (drop, max) | status |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, info in export.items():
        status = info.get("status", "passed parity")
        status = f"**{status}** (kept on disk, never recommended)" if status == "rejected" else status
        label = f"{name}{smoothing_note(info.get('smoothing'))}"
        lines.append(
            f"| {label} | {info['size_bytes'] / 1e6:.1f} | {info['max_abs_diff']:.2e} | {_pct(info['agreement'])} | "
            f"{_gate_cell(info.get('gate'))} | {status}{_fallback_note(info.get('fp32_fallback'))} |"
        )
    return lines


def graph_lines(export: dict) -> list[str]:
    """Which exporter wrote the graphs (and why another could not), and which of ONNX Runtime's fusions the
    optimised graph holds: attention per layer with heads, with each fused node's head count, and the rest."""
    fp32, opt = export.get("fp32", {}), export.get("optimized")
    lines = []
    if "exporter" in fp32:
        why = "; ".join(f"{name} failed: {reason}" for name, reason in fp32.get("exporter_fallback", {}).items())
        lines.append(f"Graphs written by {fp32['exporter']}" + (f" (fallback: {why})." if why else "."))
    if opt and "fused_ops" in opt:
        ops = ", ".join(f"{op} ×{n}" for op, n in opt["fused_ops"].items()) or "none"
        heads = opt.get("attention_heads_per_node") or []
        per_node = f" (heads per fused node: {', '.join(map(str, heads))})" if heads else ""
        undone = ", ".join(f"{op} ×{n}" for op, n in opt.get("unfused_ops", {}).items())
        why = f"; unfused for the CPU (ONNX Runtime's kernel is slower than its parts): {undone}" if undone else ""
        lines.append(
            f"Optimised graph: attention fusion {opt['attention_fusion']}{per_node} over "
            f"{opt['attention_layers']} layer(s) with heads; fused ops: {ops}{why}."
        )
    return ["", *lines] if lines else []


def _gate_cell(g: dict | None) -> str:
    """'val acc vs fp32 (drop, max)' for an int8 gate, plus the agreement when the gate requires one."""
    if g is None:
        return "–"
    cell = f"{_pct(g['accuracy'])} vs {_pct(g['fp32_accuracy'])} ({100 * g['drop']:+.2f}"
    cell += f", max {_pct(g['max_drop'])})" if g["max_drop"] is not None else ", no max)"
    if g.get("min_agreement") is not None:
        cell += f"; agreement {_pct(g['agreement_with_fp32'])} (min {_pct(g['min_agreement'])})"
    return cell


def _fallback_note(fallback: dict | None) -> str:
    """What the fp32 fallback did to an int8 variant that failed its first gate."""
    if not fallback:
        return ""
    first = fallback["first_gate"]
    before = f"first try: {_pct(first['accuracy'])}, agreement {_pct(first['agreement_with_fp32'])}"
    if fallback["passed"]:
        kept = ", ".join(f"`{n}`" for n in fallback["kept_fp32"])
        return f" after keeping {len(fallback['kept_fp32'])} node(s) in fp32: {kept} ({before})"
    return f"; an fp32 fallback of up to {len(fallback['tries'])} node(s) did not pass ({before})"


def _units_lines(pruned: dict) -> list[str]:
    """Units removed per kind and the layers removed whole (runs that prune FFN neurons)."""
    removed = pruned.get("units_removed")
    if not removed or not removed.get("neurons"):
        return []
    layers = pruned.get("removed_layers") or []
    return [
        "",
        f"Units removed: {removed['heads']} heads, {removed['neurons']} FFN neurons, {removed['layers']} whole "
        f"layers{' (' + ', '.join(map(str, layers)) + ')' if layers else ''}. FFN neurons per layer left: "
        f"{' '.join(map(str, pruned.get('ffn_neurons_per_layer', [])))}.",
    ]


def _budget_lines(budget: dict) -> list[str]:
    """The budget asked beside what the run reached; for a speed-up, predicted and measured side by side."""
    if budget["kind"] != "speedup":
        what = "heads" if budget["kind"] == "heads" else "encoder FLOPs"
        return [f"Asked: remove {_pct(budget['value'])}% of {what}; reached FLOP ratio {budget['flop_ratio']:.3f}."]
    spread = _x_spread(measured := budget.get("measured_speedup"), budget.get("measured_iqr"))
    lines = [
        f"| speed-up on {budget['runtime']} at batch {budget['batch_size']}, {budget['seq_len']} tokens | value |",
        "|---|---:|",
        f"| asked | {budget['value']:.2f}× |",
        f"| predicted by the latency table | {_x(budget.get('predicted_speedup'))} |",
        f"| measured by the last pruning step (its correction of the table) | {_x(budget.get('measured_in_run'))} |",
        f"| measured (the model alone vs {budget.get('measured_vs', 'the original')}; IQR over rounds) | {spread} |",
    ]
    if measured is not None:
        verdict = "within" if budget["within_10pct"] else "NOT within"
        lines += ["", f"Measured is {verdict} 10% of asked. Steps run: {budget['steps_run']}."]
    return lines


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _x_spread(value: float | None, iqr: list[float] | None) -> str:
    """A median speed-up and its interquartile range over rounds ("4.50× (4.19–4.78)"): noise in view."""
    return f"{_x(value)} ({iqr[0]:.2f}–{iqr[1]:.2f})" if iqr and value is not None else _x(value)


def _baseline_lines(base: dict) -> list[str]:
    """The layer-dropping baseline at (nearly) the pruned FLOPs, with McNemar's test against the pruned model."""
    ft = base.get("finetune") or {}
    return [
        "| | pruned | layer-drop baseline |",
        "|---|---:|---:|",
        f"| test accuracy (%) | {_pct(base['pruned_accuracy'])} | {_pct(base['baseline_accuracy'])} |",
        f"| encoder FLOPs / example | {base['target_flops_per_example']:,} | {base['encoder_flops_per_example']:,} |",
        "",
        f"Baseline: top {base['layers_dropped']} layers dropped (no scores), fine-tuned for {ft.get('steps', 0)} "
        f"steps (the pruning run's recovery budget). Pruned − baseline: {100 * base['pruned_minus_baseline']:+.2f} "
        f"points, McNemar exact p = {base['mcnemar_p']:.3g} (n = {base['n']}).",
    ]


def render(report: RunReport) -> str:
    """report.md of a one-target run, from its typed report (completed with its recommendation)."""
    o, p = report.original, report.pruned
    lines = [
        f"# compressor run: {report.name}",
        "",
        f"Model `{report.model_source}` on `{report.data_source}` (labels: {', '.join(report.labels)}).",
        "",
        "## Result",
        "",
        "| | original | pruned |",
        "|---|---:|---:|",
        f"| test accuracy (%) | {_pct(o.test.accuracy)} | {_pct(p.test.accuracy)} |",
        f"| heads | {p.heads_total} | {p.heads_left} |",
        *([f"| residual width | {o.hidden_size} | {p.hidden_size} |"] if o.hidden_size != p.hidden_size else []),
        f"| parameters | {o.parameters:,} | {p.parameters:,} |",
        f"| encoder FLOPs / example | {o.encoder_flops_per_example:,} | {p.encoder_flops_per_example:,} |",
        "",
        f"FLOP ratio original/pruned: {p.flop_ratio:.3f}. Masked vs physically pruned max |Δlogit|: "
        f"{p.masked_vs_pruned_max_abs_diff:.2e}. Saved model: `{p.model_dir}`.",
        *_units_lines(p.dump()),
    ]
    if report.budget is not None:
        lines += ["", "## Budget", "", *_budget_lines(report.budget.dump())]
        lines += [relative_budget_text(report.relative_budget).strip()] if report.relative_budget else []
    if report.baseline is not None:
        lines += ["", "## Baseline: dropping top layers at the same FLOPs", "", *_baseline_lines(report.baseline)]
    lines += [
        "",
        _recommendation_line(report.recommendation),
        "",
        "## Pruning steps",
        "",
        f"Recovery fine-tuning: {describe_distillation(report.distillation)}.",
        "",
        *_steps_table(report.steps),
    ]
    if report.recovery:
        lines += ["", *recovery_lines(report.recovery)]
    if report.member_finetune is not None:
        lines += final_finetune_lines([(None, report.member_finetune)], baseline=bool(report.baseline))
    if report.export is not None:
        lines += ["", "## ONNX export", "", *_export_table(report.export), *graph_lines(report.export)]
    if report.bench is not None:
        lines += ["", "## Benchmark", "", *_bench_table(report.bench)]
        lines += [
            "",
            "Quality vs speed of every candidate (original, pruned, layer-drop baseline, references; PyTorch and each "
            "ONNX variant), the frontier at a glance:",
            "",
            "![accuracy vs speed-up](bench/accuracy_vs_speedup.png)",
            "",
            "Full tables and plots (all sequence lengths and batch sizes, spread, memory): "
            "[bench/report.md](bench/report.md).",
            *references_section(report.versus_references, report.references),
            *(
                training_lines([("pruned", len(report.steps), report.member_finetune)], report.steps, report.references)
                if report.versus_references
                else []
            ),
        ]
    if report.analysis is not None:
        lines += ["", "## Head roles of kept vs removed heads", "", *_roles_table(report.analysis)]
        lines += ["", "Details and figures: [analysis/analysis.md](analysis/analysis.md)."]
    return "\n".join(lines + ["", *time_lines(report)])


def final_finetune_lines(done: list[tuple[str | None, dict]], baseline: bool) -> list[str]:
    """The report's sentence on the final fine-tune (`prune.member_finetune`) of each (label, fine-tune) in `done`
    (label None: a one-target run's one model), and that the layer-drop baseline had the same where the run has one
    (`baseline`); none when nothing was fine-tuned. One-target and family reports both say it through here."""
    if not done:
        return []
    parts = [final_finetune_text(ft) if label is None else f"{label} {final_finetune_text(ft)}" for label, ft in done]
    heading = "Final fine-tune" if len(done) == 1 and done[0][0] is None else "Final fine-tune of each member"
    same = "; the layer-drop baseline had the same" if baseline else ""
    return ["", f"{heading} (`prune.member_finetune`), validation accuracy: {'; '.join(parts)}{same}."]


def final_finetune_text(ft: dict) -> str:
    """A final fine-tune (`prune.member_finetune`): validation accuracy before → after it, and its seconds."""
    before = _pct((ft.get("val_before") or {}).get("accuracy"))
    return f"{before} → {_pct(ft['val_after']['accuracy'])}% ({ft['seconds']:.0f} s)"


def relative_budget_text(relative: dict | None) -> str:
    """A budget `relative_to` a reference, in words: each multiple of the reference's measured speed-up and the
    target it became ("" without one)."""
    if not relative:
        return ""
    pairs = ", ".join(f"{m:g} → {t:g}x" for m, t in zip(relative["multiples"], relative["targets"], strict=True))
    speedup = relative["reference_speedup"]
    return (
        f" Targets relative to `{relative['reference']}`, whose shape measured {speedup:.2f}x the model's on the "
        f"budget's runtime before the run: {pairs}."
    )


def time_lines(report: RunReport) -> list[str]:
    """The run's total time and, when the phases were timed, where it went."""
    where = "" if report.device in (None, "cpu") else f" on {report.device}"  # a GPU; every timing is on the CPU
    how = where + ("" if report.mixed_precision in (None, "no") else f" in {report.mixed_precision} autocast")
    lines = [f"Total time: {report.seconds or 0:.0f} s." + (f" Fine-tunes ran{how}." if how else ""), ""]
    if report.timings:
        lines += ["## Where the time went", "", *_timings_table(report.timings, report.seconds), ""]
    return lines


def _timings_table(timings: dict[str, float], total: float | None) -> list[str]:
    """One row per phase of the run, in run order: wall seconds and share of the run's total."""
    total = total or sum(timings.values())
    lines = ["| phase | seconds | share |", "|---|---:|---:|"]
    lines += [f"| {name} | {sec:.0f} | {100 * sec / total:.0f}% |" for name, sec in timings.items()]
    return lines
