"""The recommendation of a one-target run: the fastest shipped variant of its pruned model that passes every gate,
chosen on validation, its test accuracy reported (`recommendation`), and its line in report.md."""

from __future__ import annotations

from dataclasses import dataclass

from compressor.bench.frontier import slower_than_source
from compressor.bench.render import _pct
from compressor.core.candidates import ORIGINAL_NAME, SINGLE, CandidateName, name_of
from compressor.core.runtimes import for_variant, runtime

DEFAULT_MAX_DROP = 0.01  # `bench.max_drop`'s default, for reports written before the field existed


def recommendation(report: dict) -> dict | None:
    """The fastest benchmarked variant of the pruned model that passes every gate, at the benchmark's headline batch
    and sequence length: fp32 and optimised graphs passed their parity gate (or the export would have failed), int8
    variants must not be `rejected`, an optimised graph must not be slower than the graph it was built from
    (`bench.frontier.slower_than_source`, said in `not_recommended`), and every variant's validation accuracy must be
    within `bench.max_drop` of the original's (test accuracy for reports benchmarked before the bench scored validation;
    null disables it); test accuracy is reported for the choice, never read to make it. When no variant is accurate
    enough the answer is `{"variant": None, "reason": ...}`: a collapsed model is never recommended for its speed. None
    without a benchmark."""
    bench = report.get("bench", {})
    summary, exported = bench.get("summary", {}), report.get("export", {})
    rejected = {_shipped_name(n) for n, e in exported.items() if e.get("status") == "rejected"}
    shipped = {name_of(SINGLE, "member")} | {_shipped_name(n) for n in exported}  # not the original or baseline
    speeds = {
        name: row["headline_speedup"]
        for name, row in summary.items()
        if name in shipped and name not in rejected and row.get("headline_speedup") is not None
    }
    slower = slower_than_source([_row(name, speed) for name, speed in speeds.items()])
    speeds = {name: speed for name, speed in speeds.items() if name not in slower}
    if not speeds:
        return None
    gate = _accuracy_gate(report, bench.get("max_drop", DEFAULT_MAX_DROP))
    passing = {name: speed for name, speed in speeds.items() if gate.passes(summary[name].get(gate.field))}
    best = max(passing, key=passing.get) if passing else None
    passed_over = _passed_over(summary, exported, shipped, rejected, gate, passing.get(best, 0.0))
    passed_over += [{"variant": name, "speedup": summary[name]["headline_speedup"], "reason": why}
                    for name, why in slower.items()]  # fmt: skip
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
        "val_accuracy": row.get("val_accuracy"),
        "chosen_on": gate.split,
        "max_drop": gate.max_drop,
        "rejected": sorted(rejected),
        "not_recommended": passed_over,
    }


def _row(name: str, speed: float) -> dict:
    """The frontier row `bench.frontier.slower_than_source` reads, of the bench candidate `name` at `speed`."""
    cid = CandidateName.parse(name)
    return {"name": name, "model": cid.model, "role": cid.kind, "runtime": cid.runtime, "speedup": speed}


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
            why = gate.shortfall(summary[name].get(gate.field))
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
    """The recommendation's quality gate: accuracy on `split` (read from the summary's `field`) at most `max_drop`
    below the original's."""

    original: float | None
    max_drop: float | None
    split: str = "validation"

    @property
    def field(self) -> str:
        return "val_accuracy" if self.split == "validation" else "accuracy"

    def passes(self, accuracy: float | None) -> bool:
        if self.max_drop is None or self.original is None:
            return True
        return accuracy is not None and self.original - accuracy <= self.max_drop + 1e-12

    def shortfall(self, accuracy: float | None) -> str:
        """Why `accuracy` fails the gate, in words: how far below the original it is and what the gate allows."""
        if accuracy is None:
            return f"its {self.split} accuracy was not measured"
        return (
            f"{100 * (self.original - accuracy):.2f} points below the original on {self.split}; the gate allows "
            f"{100 * self.max_drop:.2f} (bench.max_drop)"
        )

    def failure(self, summary: dict, candidates: dict) -> str:
        """One line: the gate and the best accuracy any candidate reached."""
        scored = {n: summary[n][self.field] for n in candidates if summary[n].get(self.field) is not None}
        best = max(scored, key=scored.get) if scored else None
        reached = f"the best is {best} at {_pct(scored[best])}%" if best else "no variant's accuracy was measured"
        return (
            f"no shipped variant's {self.split} accuracy is within {100 * self.max_drop:.2f} points of the original's "
            f"{_pct(self.original)}% (bench.max_drop {self.max_drop}); {reached}"
        )


def _accuracy_gate(report: dict, max_drop: float | None) -> _Gate:
    """The gate against the original's accuracy on the benchmark's validation examples; for a report benchmarked
    before the bench scored validation, on its test examples (else its test-split accuracy), as it then was."""
    row = report.get("bench", {}).get("summary", {}).get(ORIGINAL_NAME, {})
    if row.get("val_accuracy") is not None:
        return _Gate(row["val_accuracy"], max_drop, "validation")
    original = row.get("accuracy", report.get("original", {}).get("test", {}).get("accuracy"))
    return _Gate(original, max_drop, "test")


def _recommendation_line(rec: dict | None) -> str:
    """The one-target run's recommendation (`recommendation`) as a line of report.md."""
    if rec is None:
        return "Recommendation: none (no benchmarked variant passed every gate)."
    why_not = "".join(f"\n- not recommended: {r['reason']}." for r in rec.get("not_recommended", []))
    if rec["variant"] is None:
        return f"**Recommendation: none**: {rec['reason']}.{why_not}"
    excluded = f"; not considered (failed their int8 gate): {', '.join(rec['rejected'])}" if rec["rejected"] else ""
    split = rec.get("chosen_on", "test")
    within = "" if rec["max_drop"] is None else f", within {100 * rec['max_drop']:.2f} {split} points of the original"
    return (
        f"**Recommendation: `{rec['variant']}`**, the fastest variant passing every gate: {rec['speedup']:.2f}× the "
        f"original at batch {rec['batch']}, {rec['seq_len']} tokens, test accuracy {_pct(rec['accuracy'])}%"
        f"{within} (chosen on {split}; test reported){excluded}.{why_not}"
    )
