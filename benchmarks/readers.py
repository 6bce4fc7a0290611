"""What a product output says, as result rows: one reader per kind of output, registered by name (an experiment
names its reader; its `reader_args` must be the reader's keyword parameters). A reader takes the experiment and the
directory its last step wrote, and returns `schema.Row`s. The row builders below them are also what converted the
retired scripts' results (their files held the same report sections)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.schema import Row
from compressor.core.errors import UserError

if TYPE_CHECKING:
    from benchmarks.suite import Experiment

READERS: dict[str, Callable[..., list[Row]]] = {}


def reader(fn: Callable[..., list[Row]]) -> Callable[..., list[Row]]:
    READERS[fn.__name__] = fn
    return fn


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: cannot read the experiment's output: {err}") from None


def test_examples(report: Mapping) -> int | None:
    return ((report.get("original") or {}).get("test") or {}).get("n")


def at_least(value: float, floor: float | None, low: float | None = None, high: float | None = None) -> bool | None:
    """Whether a gap meets `gap >= floor`: with an interval, true only when all of it does, false when none of it
    does, else None (undecided); without one, the value decides. None without a goal."""
    if floor is None:
        return None
    if low is None or high is None:
        return value >= floor
    return True if low >= floor else (False if high < floor else None)


def at_most(value: float, ceiling: float | None) -> bool | None:
    return None if ceiling is None else value <= ceiling


def _is_original(row: Mapping) -> bool:
    return row.get("role") == "original" and row["runtime"] == "pytorch"


def frontier_rows(rows: Sequence[Mapping], runtimes: Sequence[str], n: int | None, seed: int,
                  max_drop: float | None = None) -> list[Row]:  # fmt: skip
    """One row per frontier point on `runtimes` (all when empty) and the PyTorch original: its speed-up, its test
    accuracy beside it; with `max_drop`, whether that accuracy is within `max_drop` points of the original's."""
    original = next((r.get("accuracy") for r in rows if _is_original(r)), None)
    goal = None if max_drop is None else f"test within {max_drop:g} points of the original"
    out = []
    for row in rows:
        keep = not runtimes or row["runtime"] in runtimes or _is_original(row)
        if not keep or row.get("speedup") is None or row.get("rejected"):
            continue
        accuracy = row.get("accuracy")
        test = f"test {100 * accuracy:.2f}" if accuracy is not None else None
        judged = goal is not None and not _is_original(row) and None not in (accuracy, original)
        met = 100 * (original - accuracy) <= max_drop + 1e-9 if judged else None
        out.append(Row(label=row["name"], value=round(row["speedup"], 2), seeds=[seed], n=n, unit="x", detail=test,
                       goal=goal if judged else None, met=met))  # fmt: skip
    return out


def versus_row(entries: Sequence[Mapping], reference: str, runtime: str, n: int | None, seed: int) -> Row:
    """The most accurate member as fast as `reference` on its own `runtime`, against it (points of test accuracy),
    with McNemar's p and the speed ratio beside it."""
    entry = next((e for e in entries if e["name"] == f"reference/{reference}/{runtime}"), None)
    best = (entry or {}).get("best_same_runtime")
    if not best:
        raise UserError(f"versus_references: no member as fast as reference/{reference}/{runtime} in the run")
    p = "not paired" if best.get("mcnemar_p") is None else f"{best['mcnemar_p']:.2g}"
    words = f", {best['verdict']}" if best.get("verdict") else ""
    detail = f"{best['name']}, McNemar p {p}{words}, {best['speed_ratio']:.2f}x the reference's speed"
    label = f"{best['name']} minus {reference} on {runtime}"
    return Row(label=label, value=round(best["points"], 2), seeds=[seed], n=n, unit="points", detail=detail)


def peers_rows(section: Mapping) -> list[Row]:
    """Each peer's model against ours (points of test accuracy): recovered by our recovery, with McNemar's p and
    both speed-ups, then as the peer left it (no recovery)."""
    ours = section["ours"][0]
    n = section.get("test_examples")
    out, bare = [], []
    for peer in section["peers"]:
        which = f"{peer['peer']} ({peer['match']} matched"
        if peer.get("accuracy") is not None:
            value = round(100 * (peer["accuracy"] - ours["accuracy"]), 2)
            bare.append(Row(label=f"{which}, no recovery) minus ours", value=value, seeds=[0], n=n, unit="points"))
        recovered = peer.get("recovered") or {}
        if recovered.get("test") is None:
            continue
        p = (recovered.get("vs_member") or {}).get("p_value")
        value = round(100 * (recovered["test"] - ours["accuracy"]), 2)
        detail = f"McNemar p {'not paired' if p is None else f'{p:.2g}'}"
        detail += f", {peer['speedup']:.2f}x against our {ours['speedup']:.2f}x"
        out.append(Row(label=f"{which}, our recovery) minus ours", value=value, seeds=[0], n=n, unit="points",
                       detail=detail))  # fmt: skip
    return out + bare


def _family(report: Mapping) -> Mapping:
    return report.get("family") or report


def bench_against_pruning(timings: Mapping[str, float], seed: int) -> Row:
    """The bench's time as a share of the pruning steps' (goal: at most all of it)."""
    share = 100 * timings["bench"] / timings["pruning steps"]
    detail = f"bench {timings['bench']:.0f} s, pruning {timings['pruning steps']:.0f} s"
    return Row(label="bench time / pruning time", value=round(share, 1), seeds=[seed], unit="%", goal="<= 100 %",
               met=share <= 100, detail=detail)  # fmt: skip


@reader
def run(exp: Experiment, out: Path, max_seconds: float | None = None, max_bench_share: float | None = None,
        max_drop: float | None = None, bench_within_pruning: bool = False) -> list[Row]:  # fmt: skip
    """A one-target run's report: its wall time, its bench's share of it (or of its pruning), the recommended
    model's gap to the original and its speed-up."""
    report = _json(out / "report.json")
    n, seed = test_examples(report), exp.seeds[0]
    seconds = float(report.get("seconds") or 0.0)
    timings = report.get("timings") or {}
    share = 100 * float(timings.get("bench", 0.0)) / seconds if seconds else 0.0
    rows = [
        wall_row(report, seed, max_seconds),
        Row(label="bench share of the run", value=round(share, 1), seeds=[seed], unit="%",
            goal=_goal("<=", max_bench_share, "%"), met=at_most(share, max_bench_share),
            detail=bench_detail(timings, seconds)),
    ]  # fmt: skip
    if bench_within_pruning:
        rows.append(bench_against_pruning(timings, seed))
    chosen = report.get("recommendation") or {}
    if chosen.get("variant"):
        gap = -float(chosen["drop_points"])
        rows.append(Row(label=f"recommended ({chosen['variant']}) vs original, test", value=round(gap, 2),
                        seeds=[seed], n=n, unit="points", goal=_goal(">=", -max_drop if max_drop else None, "points"),
                        met=at_least(gap, -max_drop if max_drop else None)))  # fmt: skip
        rows.append(Row(label=f"recommended ({chosen['variant']}) speed-up", value=round(chosen["speedup"], 2),
                        seeds=[seed], unit="x"))  # fmt: skip
    return rows


def bench_detail(timings: Mapping[str, float], seconds: float) -> str | None:
    """The bench's seconds, and the original's export beside them where the run timed it as its own phase (the
    original's ONNX variants the bench times, built before it or read from the export cache)."""
    if "bench" not in timings:
        return None
    text = f"bench {timings['bench']:.0f} s"
    if (export := timings.get("original: export")) is not None and seconds:
        text += f"; the original's export before it {export:.0f} s ({100 * export / seconds:.1f}% of the run)"
    return text


def largest_phases(timings: dict[str, float], count: int = 3) -> str | None:
    """The `count` phases that took longest (report.json `timings`), e.g. "bench 120 s, base fine-tune 90 s"."""
    top = sorted(timings.items(), key=lambda kv: -kv[1])[:count]
    return ", ".join(f"{name} {seconds:.0f} s" for name, seconds in top) or None


def _goal(op: str, bound: float | None, unit: str) -> str | None:
    return None if bound is None else f"{op} {bound:g} {unit}"


def seed_wall_rows(out: Path, seeds: Sequence[int], max_seconds: float | None) -> list[Row]:
    """Each repeat's wall seconds (its `seed-K/report.json`; the first repeat's include the shared base fine-tune
    unless the cache held it), with its three longest phases."""
    return [wall_row(_json(out / f"seed-{seed}" / "report.json"), seed, max_seconds, f"seed {seed}: run, wall")
            for seed in seeds]  # fmt: skip


def wall_row(report: Mapping, seed: int, max_seconds: float | None, label: str = "run, wall") -> Row:
    """A run's wall seconds (its report's `seconds`) against `max_seconds`, with its three longest phases."""
    seconds = float(report.get("seconds") or 0.0)
    return Row(label=label, value=round(seconds), seeds=[seed], unit="s", goal=_goal("<=", max_seconds, "s"),
               met=at_most(seconds, max_seconds), detail=largest_phases(report.get("timings") or {}))  # fmt: skip


def landing_rows(out: Path, seeds: Sequence[int]) -> list[Row]:
    """Per repeat, how a speed-up budget's steps landed: each timed step's measured speed-up over the one its latency
    table predicted for the same masks (1.0: the table was right), with the step's width and goal."""
    rows = []
    for seed in seeds:
        for step in _json(out / f"seed-{seed}" / "report.json").get("steps") or []:
            predicted, measured = step.get("predicted_speedup"), step.get("measured_speedup")
            if not predicted or not measured:
                continue
            width = f", width {step['hidden_size']}" if step.get("hidden_size") else ""
            member = f"; member {step['members']}" if step.get("members") else ""
            detail = f"goal {step.get('goal', 0):.2f}x, predicted {predicted:.2f}x, measured {measured:.2f}x{member}"
            rows.append(Row(label=f"seed {seed} step {step['step']}{width}: measured / predicted speed-up",
                            value=round(measured / predicted, 3), seeds=[seed], unit="x", detail=detail))  # fmt: skip
    return rows


@reader
def seeds(exp: Experiment, out: Path, min_gap: dict[str, float] | None = None,
          max_seconds_per_seed: float | None = None, landings: bool = False) -> list[Row]:  # fmt: skip
    """A run repeated over seeds (`seeds.json`): each gap's mean over the seeds with its bootstrap interval, on the
    experiment's runtimes; `min_gap` {candidate model, or "chosen" for the member each seed chose on validation
    against a reference: floor in points} sets the goals (a member's, not its layer-drop baseline's). With
    `max_seconds_per_seed`, each repeat's wall time against it; with `landings`, each timed step's measured speed-up
    over its table's prediction (`landing_rows`)."""
    summary = _json(out / "seeds.json")
    floors = min_gap or {}
    rows = []
    for gap in summary["gaps"]:
        if exp.runtimes and gap.get("runtime") not in exp.runtimes:
            continue
        role = gap.get("role", "member")  # a target's floor is its member's: its layer-drop baseline gets none
        key = {"chosen": "chosen", "member": gap["candidate"].split("/")[0]}.get(role)
        floor = floors.get(key) if key else None
        low, high = (round(end, 2) for end in gap["ci95"])
        value = round(gap["mean"], 2)
        spread = f"sd {gap['sd']:.2f} over seeds; " if gap.get("sd") is not None else ""
        rows.append(
            Row(
                label=f"{gap['candidate']} minus {gap['versus']}",
                value=value,
                low=low,
                high=high,
                seeds=summary["seeds"],
                unit="points",
                n=summary.get("test_examples"),
                goal=_goal(">=", floor, "points"),
                met=at_least(value, floor, low, high),
                detail=spread + gap["verdict"],
            )
        )
    if max_seconds_per_seed is not None:
        rows += seed_wall_rows(out, summary["seeds"], max_seconds_per_seed)
    return rows + (landing_rows(out, summary["seeds"]) if landings else [])


@reader
def frontier(exp: Experiment, out: Path, max_drop: float | None = None) -> list[Row]:
    """A run's frontier on the experiment's runtimes: each point's speed-up, its test accuracy beside it (and with
    `max_drop`, whether it is within that many points of the original's)."""
    report = _json(out / "report.json")
    rows = _family(report).get("frontier") or []
    return frontier_rows(rows, exp.runtimes, test_examples(report), exp.seeds[0], max_drop)


@reader
def versus_reference(exp: Experiment, out: Path, reference: str = "", runtime: str = "pytorch") -> list[Row]:
    """The run's member-vs-reference comparison on `runtime` (`versus_references`, best as fast on that runtime)."""
    report = _json(out / "report.json")
    entries = _family(report).get("versus_references") or []
    return [versus_row(entries, reference, runtime, test_examples(report), exp.seeds[0])]


@reader
def peers(exp: Experiment, out: Path, model: str = "mpnet", file: str = "peers.json") -> list[Row]:
    """benchmarks/peers.py's output: each peer's recovered model against ours."""
    data: dict[str, Any] = _json(out / file)
    return peers_rows(data["models"][model])


@reader
def export_paths(exp: Experiment, out: Path, file: str = "export_paths.json") -> list[Row]:
    """benchmarks/export_paths.py's output: per exporter, the median seconds and peak memory of an export (every
    run's value in the detail), the fusions of its optimised graph, and torch.export's time as a ratio of TorchScript's
    (runs paired by repeat)."""
    data: dict[str, Any] = _json(out / file)
    by: dict[str, list[Mapping]] = {}
    for entry in data["runs"]:
        by.setdefault(entry["asked"], []).append(entry)
    rows = []
    for name, runs in by.items():
        fusion = f"attention fusion {runs[0]['attention_fusion']}; wrote {runs[0]['exporter']}"
        for key, unit, what in (("seconds", "s", "export, wall"), ("peak_mb", "MB", "export, peak memory")):
            values = [r[key] for r in runs]
            rows.append(Row(label=f"{name}: {what}", value=float(np.median(values)), n=len(values), unit=unit,
                            seeds=list(exp.seeds), detail=f"runs: {values}; {fusion}"))  # fmt: skip
    if {"torch.export", "torchscript"} <= set(by):
        ratios = [a["seconds"] / b["seconds"] for a, b in zip(by["torch.export"], by["torchscript"], strict=False)]
        rows.append(Row(label="torch.export / TorchScript, export seconds", value=round(float(np.median(ratios)), 2),
                        n=len(ratios), unit="x", seeds=list(exp.seeds),
                        detail=f"per repeat: {[round(r, 2) for r in ratios]}"))  # fmt: skip
    return rows


@reader
def bench_pair(exp: Experiment, out: Path, min_speedup: float | None = 1.0) -> list[Row]:
    """`compressor bench --reference R --candidate C`'s report: each candidate's paired speed-up over the reference
    at the headline shape, the median over rounds with a 95% t-interval of the per-round ratios (on their logs, as
    ratios multiply), against `min_speedup` (met only where the whole interval clears it)."""
    from compressor.core.timing import log_ratio_interval

    report = _json(out / "report.json")
    rows = []
    for name, summary in report["summary"].items():
        if name == report["reference"]:
            continue
        seq, batch = str(summary["headline_seq_len"]), str(summary["headline_batch"])
        ratios = report["speedups"][name][seq][batch]["per_round"]
        mean, half = log_ratio_interval(ratios)
        low, high = (round(math.exp(mean + d), 3) for d in (-half, half))
        value = round(float(summary["headline_speedup"]), 3)
        rows.append(Row(label=f"{name} over {report['reference']}, batch {batch} x {seq} tokens", value=value, low=low,
                        high=high, n=len(ratios), unit="x", seeds=list(exp.seeds),
                        goal=_goal(">=", min_speedup, "x"), met=at_least(value, min_speedup, low, high),
                        detail=f"per round: {[round(r, 3) for r in ratios]}"))  # fmt: skip
    return rows


@reader
def reference_speed(exp: Experiment, out: Path, within: float | None = None) -> list[Row]:
    """benchmarks/reference_speed.py's output: per runtime, the reference's speed-up over the model timed from the
    two configs (what a budget `relative_to` it aims at) over the one the run's bench measured for the real models;
    with `within`, whether that ratio is within that fraction of 1."""
    data: dict[str, Any] = _json(out / "reference_speed.json")
    rows = []
    for runtime, entry in data["runtimes"].items():
        timed, bench = entry["from_configs"], entry["bench"]
        if bench is None:
            raise UserError(f"{out}: the run's bench has no {data['reference']} and original on {runtime}")
        ratio = timed / bench
        goal = None if within is None else f"within {within:.0%} of 1"
        rows.append(Row(label=f"{data['reference']} over the model, {runtime}: from configs / in the bench",
                        value=round(ratio, 3), unit="x", seeds=list(exp.seeds), goal=goal,
                        met=None if within is None else abs(ratio - 1) <= within,
                        detail=f"from configs {timed:.2f}x; bench {bench:.2f}x"))  # fmt: skip
    return rows
