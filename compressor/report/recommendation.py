"""The recommendation of a one-target run and its line in report.md.

There is one choice in the product, `bench.frontier.pick`: the family report's recommendation, `compressor pick`
and this one-target recommendation all call it on the run's frontier, so they cannot disagree. It reads validation
accuracy and reports test. What this module adds is the explanation around the choice: which faster choices were
passed over, and why (the int8 gate, an optimised graph slower than its source, or the validation drop).
"""

from __future__ import annotations

from compressor.bench.frontier import CHOICES, CHOSEN_ON, not_a_member, pick, slower_than_source
from compressor.bench.render import _pct
from compressor.core.candidates import ORIGINAL_NAME
from compressor.core.runtimes import runtime

DEFAULT_MAX_DROP = 0.01  # `bench.max_drop`'s default, for reports written before the field existed


def recommendation(report: dict) -> dict | None:
    """The one-target run's recommendation: `bench.frontier.pick` on its `frontier` at `bench.max_drop` (a fraction,
    in points for `pick`), the call the family report and `compressor pick` make. The pick's frontier row, with
    `variant` (its name, the key this recommendation always had), `max_drop`, `rejected` (choices that failed their
    int8 gate) and `not_recommended` (each faster choice passed over, and each optimised graph slower than its
    source, with one line saying why). When nothing is accurate enough: `{"variant": None, "reason": ...}`, a
    collapsed model is never recommended for its speed. None without a benchmarked choice."""
    rows = [r for r in report.get("frontier") or [] if _choosable(r)]
    if not any(r.get("speedup") is not None for r in rows):
        return None
    max_drop = report.get("bench", {}).get("max_drop", DEFAULT_MAX_DROP)
    points = None if max_drop is None else 100 * max_drop
    chosen = pick(report["frontier"], points)
    rejected = sorted(r["name"] for r in rows if r["rejected"])
    floor = chosen["speedup"] if chosen is not None else 0.0
    passed_over = _passed_over(rows, report.get("export") or {}, points, floor, chosen)
    if chosen is None:
        reason = _failure(report["frontier"], rows, points)
        return {"variant": None, "reason": reason, "rejected": rejected, "not_recommended": passed_over}
    return {**chosen, "variant": chosen["name"], "max_drop": max_drop, "rejected": rejected,
            "not_recommended": passed_over}  # fmt: skip


def _choosable(row: dict) -> bool:
    """Whether `pick` could ever return the frontier row `row` by its kind: a member, a reference or an exported
    original (the PyTorch original has no path to copy; a baseline is never a choice)."""
    return row["role"] in CHOICES and row.get("path") is not None


def _passed_over(rows: list[dict], exported: dict, points: float | None, floor: float, chosen: dict | None) -> list:
    """Every choosable row faster than the recommendation (`floor`) that was not picked, fastest first, and every
    optimised graph slower than its source, each with one line a user understands: which rule or gate it failed,
    by how much, and what the gate allows."""
    slower = slower_than_source(rows)
    out = []
    for row in sorted(rows, key=lambda r: -(r.get("speedup") or 0.0)):
        speed = row.get("speedup")
        if speed is None or (chosen is not None and row["name"] == chosen["name"]):
            continue
        if row["name"] in slower:
            out.append({"variant": row["name"], "speedup": speed, "reason": slower[row["name"]]})
        elif speed > floor and (why := _why_not(row, exported, points)) is not None:
            out.append({"variant": row["name"], "speedup": speed, "reason": f"{row['name']}: {speed:.2f}× but {why}"})
    return out


def _why_not(row: dict, exported: dict, points: float | None) -> str | None:
    """Why the choosable `row` was not picked: its failed int8 gate (the member's own gate from `exported`, the
    run's export section), or how far below the original it is on validation against what `bench.max_drop`
    allows; None when it passes both."""
    if row["rejected"]:
        variant = runtime(row["runtime"]).variant
        gate = exported.get(variant, {}).get("gate") if row["role"] == "member" else None
        return _int8_gate_reason(gate or {})
    if points is None:
        return None
    drop = row.get("val_drop_points")
    if drop is None:
        return f"its {CHOSEN_ON} accuracy was not measured"
    if drop <= points + 1e-9:
        return None
    return f"{drop:.2f} points below the original on {CHOSEN_ON}; the gate allows {points:.2f} (bench.max_drop)"


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


def _failure(frontier: list[dict], rows: list[dict], points: float | None) -> str:
    """One line: nothing is within the gate on validation, the original's validation accuracy and the best any
    choice reached (or that none was measured); without a gate (`points` None), that every choice was ruled out."""
    if points is None:
        return "every member, reference and exported original failed its int8 gate or is slower than its source"
    original = next((r.get("val_accuracy") for r in frontier if r["name"] == ORIGINAL_NAME), None)
    scored = [r for r in rows if r.get("val_accuracy") is not None and not r["rejected"]]
    best = max(scored, key=lambda r: r["val_accuracy"], default=None)
    reached = f"the best is {best['name']} at {_pct(best['val_accuracy'])}%" if best else (
        f"no {CHOSEN_ON} accuracy was measured (rerun the bench)"
    )  # fmt: skip
    return (
        f"no member, reference or exported original is within {points:.2f} {CHOSEN_ON} points of the original's "
        f"{_pct(original)}% (bench.max_drop {points / 100:g}); {reached}"
    )


def _recommendation_line(rec: dict | None) -> str:
    """The one-target run's recommendation (`recommendation`) as a line of report.md; a recommendation stored by an
    older compressor (no `chosen_on`: it was chosen on test) is rendered as what it was."""
    if rec is None:
        return "Recommendation: none (no benchmarked variant passed every gate)."
    why_not = "".join(f"\n- not recommended: {r['reason']}." for r in rec.get("not_recommended", []))
    if rec["variant"] is None:
        return f"**Recommendation: none**: {rec['reason']}.{why_not}"
    excluded = f"; not considered (failed their int8 gate): {', '.join(rec['rejected'])}" if rec["rejected"] else ""
    split = rec.get("chosen_on", "test")
    within = "" if rec["max_drop"] is None else f", within {100 * rec['max_drop']:.2f} {split} points of the original"
    words = not_a_member(rec) if "role" in rec else None
    what = f"choice (**{words}**: no pruned variant is as fast)" if words else "variant"
    drop = "none" if rec["max_drop"] is None else f"{100 * rec['max_drop']:g}"
    return (
        f"**Recommendation: `{rec['variant']}`**, the fastest {what} passing every gate: {rec['speedup']:.2f}× the "
        f"original at batch {rec['batch']}, {rec['seq_len']} tokens, test accuracy {_pct(rec['accuracy'])}%"
        f"{within} (chosen on {split}; test reported){excluded}. Same choice from the command line: "
        f"`compressor pick <run dir> --max-drop {drop}`."
        f"{why_not}"
    )
