"""The report of a family run (`prune.budget.values`): the speed/quality frontier first, then the members.

Rendered from the typed report (`report.schema.RunReport`) that `report.json` is written from; the recommendation
is `bench.frontier.pick` at the recipe's `bench.max_drop`, the same call `compressor pick` makes.
"""

from __future__ import annotations

from compressor.bench.frontier import not_a_member
from compressor.bench.render import cpu_line, int8_mark
from compressor.recipe.recovery import name_trains
from compressor.report.references import references_section, training_lines
from compressor.report.schema import MemberSection, RunReport
from compressor.report.summary import (
    _pct,
    _steps_table,
    _x,
    _x_spread,
    final_finetune_lines,
    recovery_lines,
    relative_budget_text,
    time_lines,
)

FRONTIER_PNG = "frontier.png"


def _frontier_table(rows: list[dict]) -> list[str]:
    """Every point, fastest first: model, runtime, speed-up, test accuracy and drop, McNemar p, the validation drop
    (what the recommendation reads; "–" in reports from before the bench scored validation), Pareto mark."""
    lines = [
        "| model | runtime | speed-up | test accuracy (%) | Δ vs original (points) | McNemar p | validation Δ "
        "(points) | Pareto | where |",
        "|---|---|---:|---:|---:|---:|---:|:---:|---|",
    ]
    for r in rows:
        model = {"baseline": f"layer-drop at {r['model']}", "reference": f"reference {r['model']}"}.get(
            r["role"], r["model"]
        )
        if r.get("recovery") not in (None, "finetune"):
            untrained = not name_trains(r["recovery"])
            model += f" ({r['recovery']}, no training)" if untrained else f" ({r['recovery']})"
        drop = "–" if r["drop_points"] is None else f"{-r['drop_points']:+.2f}"
        val_drop = "–" if r.get("val_drop_points") is None else f"{-r['val_drop_points']:+.2f}"
        p = "–" if r["mcnemar_p"] is None else f"{r['mcnemar_p']:.3g}"
        status = " (int8 gate failed: never picked)" if r["rejected"] else ""
        where = f"`{r['path']}`" if r["path"] else "–"
        runtime = f"{r['runtime']}{int8_mark(r)}{status}"
        lines.append(
            f"| {model} | {runtime} | {_x(r['speedup'])} | {_pct(r['accuracy'])} | {drop} | {p} | {val_drop} | "
            f"{'✓' if r['pareto'] else ''} | {where} |"
        )
    return lines


def _pick_line(chosen: dict | None, max_drop: float | None) -> str:
    """The recommendation (the family's pick): the fastest shippable member (or reference, or exported original)
    within `bench.max_drop` of the original on validation (test reported)."""
    within = "any accuracy" if max_drop is None else f"within {100 * max_drop:.2f} validation points of the original"
    if chosen is None:
        return f"**Recommendation: none**: no model on any runtime is {within} (bench.max_drop)."
    words = not_a_member(chosen)
    what = f"model (**{words}**: no member is as fast)" if words else "member"
    return (
        f"**Recommendation: `{chosen['name']}`**, the fastest {what} {within}: {chosen['speedup']:.2f}× the PyTorch "
        f"original at batch {chosen['batch']}, {chosen['seq_len']} tokens, test accuracy {_pct(chosen['accuracy'])}% "
        f"({-chosen['drop_points']:+.2f}; chosen on validation, test reported). Same choice from the command line: "
        f"`compressor pick <run dir> --max-drop "
        f"{'none' if max_drop is None else f'{100 * max_drop:g}'} --out DIR`."
    )


def _members_table(members: list[MemberSection], steps: list[dict]) -> list[str]:
    """One row per member: target, speed-up by its budget check and by its step's own timing, step, units, FLOP
    ratio, layer-drop comparison."""
    at_step = {s.get("step"): s.get("measured_speedup") for s in steps}
    widths = any("hidden_size" in s for s in steps)  # units 'hidden': each member's residual width, after its heads
    lines = [
        "| member | target | measured (IQR) | within 10% | at its step | after step | heads | "
        f"{'width | ' if widths else ''}FFN neurons | FLOP ratio | test acc (%) | layer-drop acc (%) | "
        "member − layer-drop (p) |",
        f"|---|---:|---:|:---:|---:|---:|---:|{'---:|' if widths else ''}---:|---:|---:|---:|---:|",
    ]
    for m in members:
        p, base = m.pruned, m.baseline
        measured = _x_spread(m.budget.measured_speedup, m.budget.measured_iqr) if m.budget else "–"
        within = {True: "✓", False: "✗"}.get(m.budget.within_10pct if m.budget else None, "–")
        compare = "–"
        if base:
            compare = f"{100 * base['pruned_minus_baseline']:+.2f} ({base['mcnemar_p']:.3g})"
        neurons = "–" if p.ffn_neurons is None else p.ffn_neurons
        lines.append(
            f"| {m.label} | {m.target:g} | {measured} | {within} | {_x(at_step.get(m.step))} | {m.step} | "
            f"{p.heads_left} | {f'{p.hidden_size} | ' if widths else ''}{neurons} | {p.flop_ratio:.2f} | "
            f"{_pct(p.test.accuracy)} "
            f"| {_pct(base['baseline_accuracy']) if base else '–'} | {compare} |"
        )
    return [
        *lines,
        "",
        "Measured: the budget check after the bench, each member timed alone against the original on the budget's "
        'runtime (median over its rounds, interquartile range), which decides "within 10%"; at its step: the paired '
        "timing the budget took when the step that closes the member was pruned. The frontier's speed-ups come from "
        "the bench, which times every candidate in each round.",
    ]


def _finetune_lines(members: list[MemberSection]) -> list[str]:
    """What each member's final fine-tune (`prune.member_finetune`) did to its validation accuracy; none without.
    The baselines are said to have had the same only where the members have layer-drop baselines."""
    done = [m for m in members if m.member_finetune is not None]
    return final_finetune_lines([(m.label, m.member_finetune) for m in done], any(m.baseline for m in done))


def render_family(report: RunReport) -> str:
    """report.md of a family run, from its typed report."""
    section, o = report.family, report.original
    max_drop = (report.bench or {}).get("max_drop")
    rows = [row.dump() for row in section.frontier or []]
    pick = section.pick.dump() if section.pick is not None else None
    lines = [
        f"# compressor run: {report.name} (a family of {len(section.members)} models)",
        "",
        f"Model `{report.model_source}` on `{report.data_source}` (labels: {', '.join(report.labels)}); "
        f"original test accuracy {_pct(o.test.accuracy)}%. Targets: "
        f"{', '.join(f'{t:g}' for t in section.targets)} ({section.kind}"
        f"{' on ' + section.runtime if section.kind == 'speedup' else ''})."
        + relative_budget_text(report.relative_budget),
        "",
    ]
    if section.frontier is not None:
        lines += [
            _pick_line(pick, max_drop),
            "",
            "## Frontier",
            "",
            "Every member on every runtime beside the original, the original's own ONNX exports (int8 of the "
            "unpruned model: the alternative that needs no pruning), each member's layer-drop baseline and each "
            "reference (another model fine-tuned on the task, `bench.references`), timed in the same interleaved "
            "rounds. Speed-ups are against the PyTorch original; McNemar's exact test is "
            "against the original on the same test examples. The recommendation reads the validation Δ (chosen on "
            "validation); the test figures are reported, never used to choose.",
            "",
            *cpu_line(report.bench or {}),
            *_frontier_table(rows),
            "",
            f"![speed/quality frontier]({FRONTIER_PNG})",
            "",
            "Full benchmark (all batch sizes, spread, memory): [bench/report.md](bench/report.md).",
        ]
    if section.versus_references:
        lines += references_section(section.versus_references, report.references)
        members = [(m.label, m.step, m.member_finetune) for m in section.members]
        lines += training_lines(members, report.steps, report.references)
        lines += ["", "Each reference's fine-tuned model and ONNX variants are under `references/<reference>/`."]
    lines += ["", "## Members", "", *_members_table(section.members, report.steps), *_finetune_lines(section.members)]
    lines += [
        "",
        "Each member's model, ONNX variants, model card and layer-drop baseline are under `members/<member>/`.",
        "",
        "## Pruning steps",
        "",
        f"Recovery distillation: {'on' if report.distillation else 'off'}. Members are taken after the step marked "
        "in the members table.",
        "",
        *_steps_table(report.steps),
        "",
        *([*recovery_lines(report.recovery), ""] if report.recovery else []),
        *time_lines(report),
    ]
    return "\n".join(lines)
