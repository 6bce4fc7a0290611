"""The speed/quality frontier of a run, and the pick a user makes from it.

A *point* is one benchmarked candidate seen as a choice: which model (a family member, the original, a layer-drop
baseline, or a reference: another model fine-tuned on the task, `bench.references`), on which runtime (PyTorch or
an ONNX variant), where it lies on disk, and whether it may be shipped (an int8 variant that failed its gate may
not). `frontier` joins the points with the benchmark's summary (speed-up over
the PyTorch original at one batch size, test accuracy, McNemar's exact test against the original) and marks the
Pareto-optimal ones: no other point is at least as fast and at least as accurate, and better in one. `pick` is the
fastest shippable member, reference or exported original within an accuracy drop; the report's recommendation,
`report.json` and `compressor pick` all call it, so they cannot disagree. `versus_references` says, per reference
point, which member is most accurate at equal or higher measured speed, and whether it is ahead, level or behind.

Choices are made on validation, never on test: `pick`'s accuracy drop and `versus_references`' "most accurate" read
each row's validation accuracy (`val_accuracy`, `val_drop_points`), and the test figures are reported for what was
chosen. A gap is called "ahead" or "behind" only when McNemar's exact test on the test examples gives p < `ALPHA`;
otherwise it is "level", whatever its sign.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from compressor.core.candidates import KINDS, ORIGINAL_NAME, CandidateName
from compressor.core.runtimes import for_variant

ROLES = KINDS  # a point's role is its candidate's kind (`compressor.core.candidates`)
ALPHA = 0.05  # the significance a gap needs before it is called ahead or behind
CHOSEN_ON = "validation"  # the split every choice here reads; test is reported, never used to choose
CHOICES = ("member", "reference", "original")  # the roles `pick` may return (the original: an exported variant only)


@dataclass(frozen=True)
class Point:
    """One candidate as a choice. `name`: its bench name (`compressor.core.candidates`); `model`: the member's
    or reference's label, "original" or, for a baseline, the member it is compared with; `role`: its candidate's
    kind, one of `ROLES`; `runtime`: a declared runtime's name (`compressor.core.runtimes`); `path`: what
    `compressor pick` copies (a model directory or an exported variant's directory), None for the PyTorch original."""

    name: str
    model: str
    role: str
    runtime: str
    path: str | None
    rejected: bool = False

    @classmethod
    def of(cls, candidate: CandidateName, path: str | None, rejected: bool = False) -> Point:
        """The point of a named candidate: for a baseline, `model` is the member it is compared with."""
        return cls(candidate.name, candidate.model, candidate.kind, candidate.runtime, path, rejected)


def frontier(summary: dict, points: list[Point], batch: int | None = None, recovery: str | None = None) -> list[dict]:
    """One row per point the benchmark measured: its speed-up at `batch` (default: each candidate's headline batch)
    and the headline length, per batch size too, test accuracy, the drop from the original in points, McNemar's p
    against the original, and whether it is Pareto-optimal. Rows are sorted fastest first. A member's row says how
    it was repaired (`recovery`: the run's `prune.recovery` mode, e.g. "rescale" for members made without
    training); other rows have None."""
    original = summary.get(ORIGINAL_NAME, {}).get("accuracy")
    original_val = summary.get(ORIGINAL_NAME, {}).get("val_accuracy")
    rows = []
    for point in points:
        if point.name not in summary:
            continue
        s = summary[point.name]
        by_batch = s["speedup"][str(s["headline_seq_len"])]
        speed = by_batch.get(str(batch)) if batch is not None else s["headline_speedup"]
        accuracy = s.get("accuracy")
        rows.append(
            {
                **asdict(point),
                "speedup": speed,
                "speedup_by_batch": by_batch,
                "batch": batch if batch is not None else s["headline_batch"],
                "seq_len": s["headline_seq_len"],
                "accuracy": accuracy,
                "drop_points": _points(original, accuracy),
                "val_accuracy": s.get("val_accuracy"),
                "val_drop_points": _points(original_val, s.get("val_accuracy")),
                "mcnemar_p": s.get("mcnemar_p"),
                "size_bytes": s.get("size_bytes"),
                "recovery": recovery if point.role == "member" else None,
                "cpu_int8_features": s.get("cpu_int8_features"),  # set on int8 runtimes: what their speed rests on
            }
        )
    for row in rows:
        row["pareto"] = _pareto(row, rows)
    return sorted(rows, key=lambda r: -(r["speedup"] or 0.0))


def _points(original: float | None, accuracy: float | None) -> float | None:
    """How many accuracy points `accuracy` is below `original` (None when either is unknown)."""
    return None if accuracy is None or original is None else 100 * (original - accuracy)


def _pareto(row: dict, rows: list[dict]) -> bool:
    """Whether no other row is at least as fast and as accurate, and strictly better in one of the two."""
    if row["speedup"] is None or row["accuracy"] is None:
        return False
    for other in rows:
        if other is row or other["speedup"] is None or other["accuracy"] is None:
            continue
        if other["speedup"] >= row["speedup"] and other["accuracy"] >= row["accuracy"]:
            if other["speedup"] > row["speedup"] or other["accuracy"] > row["accuracy"]:
                return False
    return True


def pick(rows: list[dict], max_drop: float | None, batch: int | None = None, runtime: str | None = None) -> dict | None:
    """The fastest shippable choice (not a rejected int8 variant, nor a variant slower than the graph it was built
    from: `slower_than_source`) whose validation accuracy is at most `max_drop` points below the original's (None:
    any), at `batch` (default: the batch the rows were made at), on `runtime` when given: a member, a reference, or
    the original exported to a runtime (quantize-only: what a user would do instead of pruning). None when none
    qualifies. The row it returns says `chosen_on` ("validation"); its test accuracy is reported, never read here.
    A reference or an exported original wins only when it is faster than every member that qualifies: its row's
    `role` says so, and every reader says it is not a pruned member."""
    slower = slower_than_source(rows, batch)
    best, best_speed = None, 0.0
    for row in rows:
        if row["role"] not in CHOICES or row["rejected"] or row["path"] is None or row["name"] in slower:
            continue
        if runtime is not None and row["runtime"] != runtime:
            continue
        if max_drop is not None and (row.get("val_drop_points") is None or row["val_drop_points"] > max_drop + 1e-9):
            continue
        speed = _speed(row, batch)
        if speed is not None and speed > best_speed:
            best, best_speed = row, speed
    if best is None:
        return None
    return {**best, "speedup": best_speed, "batch": batch or best["batch"], "chosen_on": CHOSEN_ON}


def _speed(row: dict, batch: int | None) -> float | None:
    """The row's speed-up at `batch` (None: the batch its speed-up was taken at)."""
    return row["speedup_by_batch"].get(str(batch)) if batch is not None else row["speedup"]


def slower_than_source(rows: list[dict], batch: int | None = None) -> dict[str, str]:
    """{name: why} for each row slower than the graph of the same model it was optimised from (its runtime's
    declared `optimizes`): it is reported as such and never picked or recommended."""
    from compressor.core.runtimes import declared

    by_key = {(r["model"], r["role"], r["runtime"]): r for r in rows}
    out = {}
    for derived, source in ((r.name, r.optimizes) for r in declared() if r.optimizes):
        for row in rows:
            base = by_key.get((row["model"], row["role"], source)) if row["runtime"] == derived else None
            mine, theirs = (None, None) if base is None else (_speed(row, batch), _speed(base, batch))
            if mine is not None and theirs is not None and mine < theirs:
                out[row["name"]] = (
                    f"{row['name']}: {mine:.2f}x, slower than {base['name']} ({theirs:.2f}x) it was built from"
                )
    return out


def verdict(points: float | None, p_value: float | None) -> str:
    """ "ahead" or "behind" by the sign of the gap `points` when McNemar's p on the test examples is below `ALPHA`,
    else "level" (also when either is unknown)."""
    if points is None or p_value is None or p_value >= ALPHA or points == 0:
        return "level"
    return "ahead" if points > 0 else "behind"


def not_a_member(row: dict) -> str | None:
    """What a picked row that is not a pruned member is, in words every reader prints ("reference, not a pruned
    member"; "the original on <runtime>, not pruned"), or None for a member."""
    if row["role"] == "reference":
        return "reference, not a pruned member"
    return f"the original on {row['runtime']}, not pruned" if row["role"] == "original" else None


def versus_references(rows: list[dict], pairs: list[dict]) -> list[dict]:
    """Per reference point of the frontier `rows`: the shippable member with the best validation accuracy at equal or
    higher measured speed (on any runtime, and on the reference's own runtime), with the test accuracy difference in
    points, McNemar's exact p between the two on the same test examples (`pairs`: the bench's member-vs-reference
    comparisons) and the verdict (`verdict`: ahead, level or behind; `beats` only when ahead). `best` is None when no
    member is as fast. When none is as fast on the reference's own runtime, `nearest_same_runtime` is the fastest member
    there (how far short of the reference's speed it falls, `speed_ratio` < 1, and its accuracy against it), so "none as
    fast" says by how much.
    """
    paired = {(p["candidate"], p["versus"]): p for p in pairs}
    shippable = [r for r in rows if r["role"] == "member" and not r["rejected"]]
    members = [m for m in shippable if m["accuracy"] is not None and m["speedup"] is not None]
    out = []
    for ref in rows:
        if ref["role"] != "reference" or ref["speedup"] is None or ref["accuracy"] is None:
            continue
        fast = [m for m in members if m["speedup"] >= ref["speedup"]]
        same = [m for m in fast if m["runtime"] == ref["runtime"]]
        entry = {k: ref[k] for k in ("name", "model", "runtime", "speedup", "accuracy", "rejected")}
        entry["best"] = _best_against(ref, fast, paired)
        entry["best_same_runtime"] = _best_against(ref, same, paired)
        own = [m for m in members if m["runtime"] == ref["runtime"]]
        nearest = max(own, key=lambda m: m["speedup"]) if own and not same else None
        entry["nearest_same_runtime"] = None if nearest is None else _against(ref, nearest, paired)
        out.append(entry)
    return out


def _best_against(ref: dict, members: list[dict], paired: dict) -> dict | None:
    """The member of `members` with the best validation accuracy (ties: the fastest) against the reference row
    `ref`; None when there are none."""
    if not members:
        return None
    return _against(ref, max(members, key=lambda m: (m.get("val_accuracy") or 0.0, m["speedup"])), paired)


def _against(ref: dict, member: dict, paired: dict) -> dict:
    """The member row `member` against the reference row `ref`: its speed relative to the reference's, the accuracy
    difference in points and McNemar's p of the pair (None when the bench did not pair them)."""
    pair = paired.get((member["name"], ref["name"]), {})
    points, p_value = 100 * (member["accuracy"] - ref["accuracy"]), pair.get("mcnemar", {}).get("p_value")
    return {
        "name": member["name"],
        "model": member["model"],
        "runtime": member["runtime"],
        "speedup": member["speedup"],
        "speed_ratio": member["speedup"] / ref["speedup"],
        "accuracy": member["accuracy"],
        "val_accuracy": member.get("val_accuracy"),
        "points": points,
        "mcnemar_p": p_value,
        "verdict": verdict(points, p_value),
        "beats": verdict(points, p_value) == "ahead",
        "chosen_on": CHOSEN_ON,
    }


def reference_points(section: dict) -> list[Point]:
    """The points of a reference (its report section, `pipeline.references`): PyTorch from its saved model, and
    each ONNX variant it was exported to (a rejected int8 marked)."""
    points = [Point.of(CandidateName(section["label"], "reference"), section["model_dir"])]
    for variant, info in section.get("export", {}).items():
        cid = CandidateName(section["label"], "reference", for_variant(variant).name)
        points.append(Point.of(cid, info["dir"], rejected=info.get("status") == "rejected"))
    return points


def relative_to_run(rows: list[dict], root: str | Path) -> list[dict]:
    """The rows with each path made relative to the run directory `root` (paths outside it stay as they are), so
    `report.json` names no path of the machine it ran on and `compressor pick` finds them wherever the run is."""
    base = Path(root).resolve()
    for row in rows:
        if row.get("path"):
            path = Path(row["path"]).resolve()
            row["path"] = str(path.relative_to(base)) if path.is_relative_to(base) else row["path"]
    return rows
