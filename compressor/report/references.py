"""The report's comparison with the reference models (`bench.references`), shared by the family and one-target
reports: per reference point, the member most accurate on validation at equal or higher measured speed, and its test
gap: ahead, level or behind by McNemar's test (`bench.frontier.versus_references`)."""

from __future__ import annotations

from compressor.bench.frontier import verdict as gap_verdict
from compressor.bench.frontier import versus_references


def references_lines(entries: list[dict]) -> list[str]:
    """Per reference point: the member most accurate on validation at equal or higher measured speed, on any runtime
    and on the reference's own, its test gap to the reference with McNemar's p and the verdict (ahead, level, behind);
    when none is as fast on its own runtime, the fastest member there and how far short of its speed it falls."""
    lines = [
        "Each reference is another model fine-tuned on the same split (with `bench.reference_finetune`, else the "
        "recipe's base fine-tune settings), exported and benchmarked like a member. Per reference and runtime: the "
        "member most accurate on validation at equal or higher measured speed (chosen on validation; test is only "
        "reported), Δ = member − reference in test accuracy points, McNemar's exact p between the two on the same "
        "test examples; ahead or behind only where p < 0.05, else level. Where no member is as fast on the reference's "
        "runtime, the nearest is the fastest member there, at its fraction of the reference's speed.",
        "",
        "| reference | runtime | speed-up | test acc (%) | best member as fast (any runtime) | Δ (p) "
        "| best member as fast (same runtime) | Δ (p) |",
        "|---|---|---:|---:|---|---:|---|---:|",
    ]
    for e in entries:
        cells = []
        for best in (e["best"], e["best_same_runtime"]):
            if best is None:
                cells += ["none as fast", "–"]
                continue
            verdict = best.get("verdict") or gap_verdict(best["points"], best["mcnemar_p"])  # reports before verdicts
            cells += [f"`{best['name']}` ({best['speedup']:.2f}×, {verdict})", _delta(best)]
        if (near := e.get("nearest_same_runtime")) is not None:  # reports from before it have no such key
            nearest = f"none as fast; nearest `{near['name']}` at {near['speed_ratio']:.2f}× its speed"
            cells[-2:] = [nearest, _delta(near)]
        rejected = " (int8 gate failed)" if e["rejected"] else ""
        lines.append(
            f"| {e['model']} | {e['runtime']}{rejected} | {e['speedup']:.2f}× | {100 * e['accuracy']:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def _delta(member: dict) -> str:
    """A member's accuracy difference to a reference in points, with McNemar's p ("–" when not paired)."""
    p = "–" if member["mcnemar_p"] is None else f"{member['mcnemar_p']:.3g}"
    return f"{member['points']:+.2f} ({p})"


def references_section(entries: list[dict] | None, sections: list[dict] | None = None) -> list[str]:
    """The report's "Against the references" section (empty without references); `sections` (the report's
    `references`) say which references were distilled from the run's teacher rather than only fine-tuned."""
    if not entries:
        return []
    taught = [r["label"] for r in sections or [] if r.get("distilled")]
    names = ", ".join(taught)
    how = f"Distilled from the run's teacher targets as the members are (`bench.reference_distill`): {names}."
    return ["", "## Against the references", "", *references_lines(entries), *(["", how] if taught else [])]


def training_lines(
    members: list[tuple[str, int, dict | None]], steps: list[dict], sections: list[dict] | None
) -> list[str]:
    """How much training each member and each reference had after the base model, in example passes: a member's
    steps up to the one that closes it (their recovery fine-tunes) plus its last fine-tune (`members`: label, step,
    `member_finetune` info); a reference's own fine-tune. Said so that a comparison is read with its training
    budgets beside it (empty without references, or where a fine-tune did not record its passes)."""
    refs = [(r["label"], (r.get("finetune") or {}).get("examples")) for r in sections or []]
    if not refs or any(n is None for _, n in refs):
        return []
    rows = []
    for label, step, last in members:
        recovery = [(s.get("finetune") or {}).get("examples") for s in steps if s.get("step", 0) <= step]
        if any(n is None for n in recovery) or (last is not None and last.get("examples") is None):
            return []
        rows.append((label, sum(recovery) + (last or {}).get("examples", 0)))
    text = "; ".join(f"member {label}: {n:,}" for label, n in rows)
    ratios = "; ".join(f"{label} {n:,} ({_ratio(rows, n)})" for label, n in refs)
    return ["", f"Training after the base model, in example passes (the steps' recovery fine-tunes up to the member, "
            f"plus its last fine-tune): {text}. References (their own fine-tune): {ratios}."]  # fmt: skip


def _ratio(rows: list[tuple[str, int]], reference: int) -> str:
    """How many times fewer (or more) passes a reference had than the members, as a range over them."""
    factors = sorted(n / max(reference, 1) for _, n in rows)
    span = f"{factors[0]:.2f}×" if factors[0] == factors[-1] else f"{factors[0]:.2f}–{factors[-1]:.2f}×"
    return f"the members had {span} its passes"


def reference_comparison(rows: list[dict], bench: dict) -> dict:
    """`{"versus_references": ...}` when the frontier `rows` hold references, from the rows and the `bench` result's
    member-vs-reference pairs; empty otherwise."""
    if not any(row["role"] == "reference" for row in rows):
        return {}
    return {"versus_references": versus_references(rows, bench["quality"]["pairs"])}
