"""The human-readable report (`report.md`) of a one-target run, rendered from its typed report
(`report.schema.RunReport`, the one `report.json` is written from); `recommendation` computes what it recommends."""

from __future__ import annotations

from dataclasses import dataclass

from compressor.bench.render import _pct, cpu_line, int8_mark
from compressor.core.candidates import ORIGINAL_NAME, SINGLE, CandidateName, name_of
from compressor.core.runtimes import for_variant, runtime
from compressor.deploy.quantize import smoothing_note
from compressor.report.card import describe_distillation
from compressor.report.references import references_section
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


DEFAULT_MAX_DROP = 0.01  # `bench.max_drop`'s default, for reports written before the field existed


def recommendation(report: dict) -> dict | None:
    """The fastest benchmarked variant of the pruned model that passes every gate, at the benchmark's headline
    batch size and sequence length: fp32 and optimised graphs passed their parity gate (or the export would have
    failed), int8 variants must not be `rejected`, and every variant's test accuracy must be within `bench.max_drop`
    of the original's (measured on the same examples; null disables it). When no variant is accurate enough the
    answer is `{"variant": None, "reason": ...}`: a collapsed model is never recommended for its speed. None without
    a benchmark."""
    bench = report.get("bench", {})
    summary, exported = bench.get("summary", {}), report.get("export", {})
    rejected = {_shipped_name(n) for n, e in exported.items() if e.get("status") == "rejected"}
    shipped = {name_of(SINGLE, "member")} | {_shipped_name(n) for n in exported}  # not the original or baseline
    speeds = {
        name: row["headline_speedup"]
        for name, row in summary.items()
        if name in shipped and name not in rejected and row.get("headline_speedup") is not None
    }
    if not speeds:
        return None
    gate = _accuracy_gate(report, bench.get("max_drop", DEFAULT_MAX_DROP))
    passing = {name: speed for name, speed in speeds.items() if gate.passes(summary[name].get("accuracy"))}
    best = max(passing, key=passing.get) if passing else None
    passed_over = _passed_over(summary, exported, shipped, rejected, gate, passing.get(best, 0.0))
    if best is None:
        reason = gate.failure(summary, speeds)
        return {"variant": None, "reason": reason, "rejected": sorted(rejected), "not_recommended": passed_over}
    row = summary[best]
    return {
        "variant": best,
        "speedup": passing[best],
        "batch": row.get("headline_batch"),
        "seq_len": row.get("headline_seq_len"),
        "accuracy": row.get("accuracy"),
        "max_drop": gate.max_drop,
        "rejected": sorted(rejected),
        "not_recommended": passed_over,
    }


def _shipped_name(variant: str) -> str:
    """The bench name of the one-target run's export `variant`."""
    return name_of(SINGLE, "member", for_variant(variant).name)


def _passed_over(
    summary: dict, exported: dict, shipped: set[str], rejected: set[str], gate: _Gate, floor: float
) -> list[dict]:
    """Every shipped variant faster than the recommendation (`floor`) that was not picked, fastest first, each with
    one line a user understands: which gate it failed, by how much, and what the gate allows."""
    out = []
    for name in sorted(shipped & summary.keys(), key=lambda n: -(summary[n].get("headline_speedup") or 0)):
        speed = summary[name].get("headline_speedup")
        if speed is None or speed <= floor:
            continue
        if name in rejected:
            variant = runtime(CandidateName.parse(name).runtime).variant
            why = _int8_gate_reason(exported[variant].get("gate") or {})
        else:
            why = gate.shortfall(summary[name].get("accuracy"))
        out.append({"variant": name, "speedup": speed, "reason": f"{name}: {speed:.2f}× but {why}"})
    return out


def _int8_gate_reason(g: dict) -> str:
    """Why an int8 variant failed its validation gate against its own fp32 graph, in words."""
    parts = []
    if g.get("max_drop") is not None and g["drop"] > g["max_drop"] + 1e-12:
        parts.append(
            f"{100 * g['drop']:.2f} validation points below its fp32 graph; its int8 gate allows "
            f"{100 * g['max_drop']:.2f}"
        )
    if g.get("min_agreement") is not None and g["agreement_with_fp32"] < g["min_agreement"] - 1e-12:
        parts.append(
            f"agrees with its fp32 graph on {_pct(g['agreement_with_fp32'])}% of validation predictions; its int8 "
            f"gate asks {_pct(g['min_agreement'])}%"
        )
    return " and ".join(parts) or "failed its int8 gate"


@dataclass(frozen=True)
class _Gate:
    """The recommendation's quality gate: test accuracy at most `max_drop` below the original's."""

    original: float | None
    max_drop: float | None

    def passes(self, accuracy: float | None) -> bool:
        if self.max_drop is None or self.original is None:
            return True
        return accuracy is not None and self.original - accuracy <= self.max_drop + 1e-12

    def shortfall(self, accuracy: float | None) -> str:
        """Why `accuracy` fails the gate, in words: how far below the original it is and what the gate allows."""
        if accuracy is None:
            return "its test accuracy was not measured"
        return (
            f"{100 * (self.original - accuracy):.2f} points below the original on test; the gate allows "
            f"{100 * self.max_drop:.2f} (bench.max_drop)"
        )

    def failure(self, summary: dict, candidates: dict) -> str:
        """One line: the gate and the best accuracy any candidate reached."""
        scored = {n: summary[n]["accuracy"] for n in candidates if summary[n].get("accuracy") is not None}
        best = max(scored, key=scored.get) if scored else None
        reached = f"the best is {best} at {_pct(scored[best])}%" if best else "no variant's accuracy was measured"
        return (
            f"no shipped variant's test accuracy is within {100 * self.max_drop:.2f} points of the original's "
            f"{_pct(self.original)}% (bench.max_drop {self.max_drop}); {reached}"
        )


def _accuracy_gate(report: dict, max_drop: float | None) -> _Gate:
    """The gate against the original's accuracy on the benchmark's examples (else its test-split accuracy)."""
    row = report.get("bench", {}).get("summary", {}).get(ORIGINAL_NAME, {})
    original = row.get("accuracy", report.get("original", {}).get("test", {}).get("accuracy"))
    return _Gate(original, max_drop)


def _recommendation_line(rec: dict | None) -> str:
    """The one-target run's recommendation (`recommendation`) as a line of report.md."""
    if rec is None:
        return "Recommendation: none (no benchmarked variant passed every gate)."
    why_not = "".join(f"\n- not recommended: {r['reason']}." for r in rec.get("not_recommended", []))
    if rec["variant"] is None:
        return f"**Recommendation: none**: {rec['reason']}.{why_not}"
    excluded = f"; not considered (failed their int8 gate): {', '.join(rec['rejected'])}" if rec["rejected"] else ""
    within = "" if rec["max_drop"] is None else f", within {100 * rec['max_drop']:.2f} points of the original"
    return (
        f"**Recommendation: `{rec['variant']}`**, the fastest variant passing every gate: {rec['speedup']:.2f}× the "
        f"original at batch {rec['batch']}, {rec['seq_len']} tokens, test accuracy {_pct(rec['accuracy'])}%"
        f"{within}{excluded}.{why_not}"
    )


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
        f"| parameters | {o.parameters:,} | {p.parameters:,} |",
        f"| encoder FLOPs / example | {o.encoder_flops_per_example:,} | {p.encoder_flops_per_example:,} |",
        "",
        f"FLOP ratio original/pruned: {p.flop_ratio:.3f}. Masked vs physically pruned max |Δlogit|: "
        f"{p.masked_vs_pruned_max_abs_diff:.2e}. Saved model: `{p.model_dir}`.",
        *_units_lines(p.dump()),
    ]
    if report.budget is not None:
        lines += ["", "## Budget", "", *_budget_lines(report.budget.dump())]
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
        lines += ["", "## ONNX export", "", *_export_table(report.export)]
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
