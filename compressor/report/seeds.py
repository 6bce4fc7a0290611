"""What a run repeated over seeds says: each accuracy gap per seed, its mean, spread and 95% interval.

`compressor run RECIPE --seeds 0,1,2` (`compressor.pipeline.seeds`) makes one complete run per seed, the base
fine-tune shared and everything after it redrawn; this module reads their `report.json`s and writes `seeds.json` /
`seeds.md`. A gap is compared for every frontier point present in all repeats (same name) against the PyTorch
original, and for every member-vs-reference comparison a repeat's report makes (`versus_references`: the best
member as fast, the best on the reference's runtime, the nearest on it), in accuracy points on the test split.

The interval is a paired bootstrap over seeds and test examples (`bootstrap_interval`): each resample draws the
seeds with replacement and, within each drawn seed, the test examples with replacement, the same examples for both
sides of the gap; the gap's 2.5th and 97.5th percentiles over the resamples bound it. It needs each candidate's
per-example correctness, which the bench keeps (`bench.quality.hits_string`). With few seeds the seed draw sees
few distinct sets, so the interval leans on the examples: a seed-to-seed spread wider than the examples explain
shows as a standard deviation larger than the interval's width suggests. A gap is "ahead" only when the whole
interval is above 0, "behind" when it is below, else "level".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from compressor.bench.quality import read_hits
from compressor.core.candidates import ORIGINAL_NAME

RESAMPLES = 10_000  # bootstrap resamples: the interval's ends move by well under 0.1 point between draws
BOOTSTRAP_SEED = 0  # the resampling is seeded, so seeds.json comes out the same from the same runs
INTERVAL = (
    "paired bootstrap over seeds and test examples: each of {n} resamples draws the seeds with replacement and, "
    "within each, the test examples with replacement (the same examples for both sides); 2.5th-97.5th percentile "
    "of the mean gap"
)
SLOTS = ("best", "best_same_runtime", "nearest_same_runtime")  # the member-vs-reference comparisons a report makes


def verdict(interval: Sequence[float]) -> str:
    """ "ahead" when the 95% interval is wholly above 0, "behind" when wholly below, else "level"."""
    low, high = interval
    if low > 0:
        return "ahead"
    return "behind" if high < 0 else "level"


def bootstrap_interval(
    a: Sequence[np.ndarray], b: Sequence[np.ndarray], resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """95% interval (in points) of the mean over seeds of accuracy(a) - accuracy(b), `a[k]`/`b[k]` seed k's
    per-example correctness on the same test examples. Seeds are drawn with replacement, then each drawn seed's
    examples with replacement; a resample of n per-example differences (each -1, 0 or +1) is drawn as multinomial
    counts of the three values, which is the same distribution at a fraction of the cost."""
    rng = np.random.default_rng(seed)
    diffs = [np.asarray(x, dtype=np.int8) - np.asarray(y, dtype=np.int8) for x, y in zip(a, b, strict=True)]
    chosen = rng.integers(len(diffs), size=(resamples, len(diffs)))
    gaps = np.zeros(chosen.shape)
    for k, d in enumerate(diffs):
        where = chosen == k
        probs = [np.mean(d == 1), np.mean(d == -1)]
        counts = rng.multinomial(len(d), [*probs, max(0.0, 1.0 - sum(probs))], size=int(where.sum()))
        gaps[where] = (counts[:, 0] - counts[:, 1]) / len(d)
    low, high = np.percentile(gaps.mean(axis=1), [2.5, 97.5])
    return 100 * float(low), 100 * float(high)


def gap_summary(
    seeds: Sequence[int], a: Sequence[np.ndarray], b: Sequence[np.ndarray], resamples: int = RESAMPLES
) -> dict:
    """One gap over the repeats: per seed (points), mean, standard deviation over seeds (None for one seed), the
    bootstrap interval and the verdict."""
    per_seed = [100 * (float(np.mean(x)) - float(np.mean(y))) for x, y in zip(a, b, strict=True)]
    interval = bootstrap_interval(a, b, resamples)
    return {
        "per_seed": {str(k): v for k, v in zip(seeds, per_seed, strict=True)},
        "mean": float(np.mean(per_seed)),
        "sd": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else None,
        "ci95": list(interval),
        "verdict": verdict(interval),
    }


def _rows(report: Mapping) -> list[dict]:
    """The frontier rows of a report (a family's or a one-target run's; empty without a bench)."""
    return list((report.get("family") or {}).get("frontier") or report.get("frontier") or [])


def _hits(report: Mapping) -> dict[str, np.ndarray]:
    """{candidate: per-example correctness on the test split} of a report's bench (those it kept hits of)."""
    results = ((report.get("bench") or {}).get("quality") or {}).get("results") or {}
    return {name: read_hits(row["hits"]) for name, row in results.items() if row.get("hits") is not None}


def _pairs(report: Mapping) -> list[tuple[str, str]]:
    """The (member, reference) comparisons a report makes in `versus_references`, in its order."""
    entries = (report.get("family") or {}).get("versus_references") or report.get("versus_references") or []
    return [(e[slot]["name"], e["name"]) for e in entries for slot in SLOTS if e.get(slot)]


def _in_order(lists: Sequence[Sequence]) -> list:
    """Every item of `lists`, once, in first-seen order."""
    return list(dict.fromkeys(item for items in lists for item in items))


def summarize_seeds(reports: Mapping[int, Mapping], resamples: int = RESAMPLES) -> dict:
    """`seeds.json`: for each frontier point in every repeat, its gap to the PyTorch original; for each
    member-vs-reference comparison any repeat reports (with both sides in every repeat), the member's gap to the
    reference. `left_out` names what could not be compared in all repeats, and why."""
    seeds = sorted(reports)
    hits = {k: _hits(reports[k]) for k in seeds}
    rows = {k: {r["name"]: r for r in _rows(reports[k])} for k in seeds}
    sizes = sorted({len(h) for k in seeds for h in hits[k].values()})
    out: dict = {"seeds": seeds, "test_examples": sizes[0] if len(sizes) == 1 else None}
    out |= {"interval": INTERVAL.format(n=resamples), "words": "ahead/behind: the 95% interval excludes 0; else level"}
    gaps, left_out = [], []
    if len(sizes) > 1:  # the repeats were not scored on the same test examples: nothing pairs
        return out | {"gaps": [], "left_out": [f"the repeats' benches scored different numbers of examples {sizes}"]}
    names = _in_order([list(rows[k]) for k in seeds])
    versus = [(name, ORIGINAL_NAME, "vs original") for name in names if name != ORIGINAL_NAME]
    versus += [(m, r, "member vs reference") for m, r in _in_order([_pairs(reports[k]) for k in seeds])]
    for name, other, kind in versus:
        missing = [k for k in seeds if name not in hits[k] or other not in hits[k]]
        if missing:
            left_out.append(f"{name} vs {other}: not in the bench (or without per-example hits) of seed {missing}")
            continue
        row = next((rows[k][name] for k in seeds if name in rows[k]), {})
        entry = {"comparison": kind, "candidate": name, "versus": other}
        entry |= {"role": row.get("role"), "runtime": row.get("runtime")}
        a, b = [hits[k][name] for k in seeds], [hits[k][other] for k in seeds]
        gaps.append(entry | gap_summary(seeds, a, b, resamples))
    gaps += _chosen_gaps(reports, seeds, hits, rows, left_out, resamples)
    return out | {"gaps": gaps, "left_out": left_out, "cpus": {str(k): cpu_of(reports[k]) for k in seeds}}


def cpu_of(report: Mapping) -> str | None:
    """The CPU a repeat's bench timed on, with its int8 features (`bench.cpu`), or None for a run without a bench.
    Repeats stored and resumed on another machine (`--seeds` keeps a finished repeat) each chose their members
    against the reference on their own CPU."""
    cpu = (report.get("bench") or {}).get("cpu") or {}
    return f"{cpu['model']} ({cpu.get('int8_features', 'int8 features unknown')})" if cpu.get("model") else None


def _chosen(report: Mapping) -> dict[tuple[str, str], str]:
    """{(reference point, slot): the member the report chose on validation for it} (`versus_references`)."""
    entries = (report.get("family") or {}).get("versus_references") or report.get("versus_references") or []
    return {(e["name"], slot): e[slot]["name"] for e in entries for slot in SLOTS[:2] if e.get(slot)}


def _chosen_gaps(reports, seeds, hits, rows, left_out: list, resamples: int) -> list[dict]:
    """Per reference point and slot (`best`: as fast on any runtime; `best_same_runtime`), the gap of whichever
    member each repeat chose on validation to the reference: the claim a user reads, whose member may differ from
    seed to seed (a repeat that chose none, or lacks per-example hits, leaves it out)."""
    chosen = {k: _chosen(reports[k]) for k in seeds}
    out = []
    for reference, slot in _in_order([list(chosen[k]) for k in seeds]):
        names = [chosen[k].get((reference, slot)) for k in seeds]
        missing = [k for k, n in zip(seeds, names, strict=True) if n is None or n not in hits[k] or reference
                   not in hits[k]]  # fmt: skip
        if missing:
            left_out.append(f"chosen ({slot}) vs {reference}: no member chosen, or no hits, in seed {missing}")
            continue
        a, b = [hits[k][n] for k, n in zip(seeds, names, strict=True)], [hits[k][reference] for k in seeds]
        runtime = next(rows[k][reference].get("runtime") for k in seeds if reference in rows[k])
        entry = {"comparison": f"chosen on validation ({slot}) vs reference", "candidate": ", ".join(names),
                 "versus": reference, "role": "chosen", "runtime": runtime,
                 "chosen": {str(k): n for k, n in zip(seeds, names, strict=True)}}  # fmt: skip
        out.append(entry | gap_summary(seeds, a, b, resamples))
    return out


def _points(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def _cpu_lines(cpus: Mapping[str, str | None]) -> list[str]:
    """Where the repeats were timed: one CPU, or each repeat's when they differ (each made its base fine-tune and
    chose its members on its own machine, so the base was made once per machine, with the same seed)."""
    named = set(cpus.values()) - {None}
    if len(named) <= 1:
        return [f"- timed on: {next(iter(named))}"] if named else []
    each = "; ".join(f"seed {k}: {cpu or 'no bench'}" for k, cpu in cpus.items())
    return [f"- timed on {len(named)} CPUs ({each}): each repeat chose its members on its own CPU, and the base "
            "fine-tune was made once per machine with the same seed"]  # fmt: skip


def render_seeds(summary: Mapping) -> str:
    """`seeds.md`: one table row per gap (points of test accuracy), then how the interval was made."""
    seeds = summary["seeds"]
    lines = [
        f"# Repeats over seeds {', '.join(map(str, seeds))}",
        "",
        f"Accuracy gaps in points on the same {summary['test_examples']} test examples; the base fine-tune is shared, "
        "everything after it is redrawn per seed. Interval: " + summary["interval"] + ". " + summary["words"] + ".",
        "",
        "| comparison | candidate | versus | "
        + " | ".join(f"seed {k}" for k in seeds)
        + " | mean | sd | 95% interval | verdict |",
        "|---|---|---|" + "---:|" * len(seeds) + "---:|---:|---|---|",
    ]
    for g in summary["gaps"]:
        per_seed = " | ".join(_points(g["per_seed"][str(k)]) for k in seeds)
        low, high = g["ci95"]
        sd = "–" if g["sd"] is None else f"{g['sd']:.2f}"
        lines.append(
            f"| {g['comparison']} | {g['candidate']} | {g['versus']} | {per_seed} | {_points(g['mean'])} | {sd} | "
            f"{low:+.2f} to {high:+.2f} | {g['verdict']} |"
        )
    lines += ["", *(f"- left out: {why}" for why in summary["left_out"]), *_cpu_lines(summary.get("cpus") or {})]
    return "\n".join(lines).rstrip() + "\n"
