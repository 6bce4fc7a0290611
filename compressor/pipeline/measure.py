"""A run's members measured together: one benchmark times every member and runtime beside the original (and the
original's ONNX exports: every exported variant for a family, the budget's runtime for one target), each layer-drop
baseline and each reference, on the same interleaved rounds; `compressor.bench.frontier` turns it into the
speed/quality frontier the report, `report.json` and `compressor pick` share. A speed-up budget's verdict comes
after: each member timed alone against the original on the budget's runtime (`budget_checks`). The members
themselves are made by `members`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from compressor import bench
from compressor.bench.frontier import Point, frontier, pick, reference_points, relative_to_run
from compressor.bench.references import reference_candidates
from compressor.core.candidates import ORIGINAL, ORIGINAL_NAME, CandidateName, name_of
from compressor.core.runtimes import NAMES, cannot_pay, for_variant, runtime
from compressor.pipeline.members import MEMBER_STAGES
from compressor.pipeline.stages import (
    RunState,
    bench_spec_for,
    export_original,
    with_quantize_only,
)
from compressor.pruning.budget import within_target
from compressor.pruning.deployed import as_deployed
from compressor.recipe import BudgetSpec
from compressor.report.references import reference_comparison
from compressor.sources.batches import sorted_batches

log = logging.getLogger("compressor")


def original_variants(run: RunState) -> list[str]:
    """The export variants of the original the bench times: for a family every exported variant (the "just
    quantize" alternative beside every member); for one target, that of a speed-up budget's exported runtime only
    (its speed-up is measured against the original on that runtime)."""
    recipe = run.recipe
    budget = recipe.prune.resolved_budget
    if not recipe.export.enabled:
        return []
    if budget.is_family:
        return list(recipe.export.variants)
    variant = runtime(budget.runtime).variant if budget.kind == "speedup" else None
    return [variant] if variant is not None else []


def bench_originals(run: RunState) -> dict[str, dict]:
    """The original's exports the bench times (`original_variants` and the quantize-only ones), built or taken from
    the export cache: `{variant: manifest}`. Runtimes that cannot pay on this CPU (`unpaid_runtimes`) get none. Its
    own phase of the run ("original: export", as a reference's export is), not the bench's."""
    skipped = unpaid_runtimes(run)
    variants = with_quantize_only(run.recipe, original_variants(run))
    return export_original(run, [v for v in variants if for_variant(v).name not in skipped])


def run_bench(run: RunState, sections: list[dict], originals: dict[str, dict]) -> tuple[dict, list[Point], list]:
    """One benchmark of the original (PyTorch and its exports `originals`, from `bench_originals`), every member on
    every runtime, and each member's layer-drop baseline; returns the bench result, the frontier's point
    descriptions and the candidates (the budget checks time some of them again). Runtimes that cannot pay on this CPU
    (`unpaid_runtimes`) are left out, and the result's `skipped` says why."""
    spec = bench_spec_for(run.recipe)
    seq = spec.seq_lens
    skipped = unpaid_runtimes(run)
    original = bench.runtime_candidate(ORIGINAL_NAME, "pytorch", as_deployed(run.original), seq)
    candidates, points = [original], [Point.of(CandidateName.original(), None)]
    for m in sections:
        candidates += _member_candidates(m, spec, points)
    for variant, info in originals.items():
        cid = CandidateName.original(for_variant(variant).name)
        candidates.append(bench.runtime_candidate(cid.name, cid.runtime, info["dir"], seq, spec.threads, original))
        points.append(Point.of(cid, info["dir"], rejected=info.get("status") == "rejected"))
    for section in run.report.get("references", []):
        candidates += reference_candidates(section, run.data, run.recipe.data.max_length, spec)
        points += reference_points(section)
    kept = [(c, p) for c, p in zip(candidates, points, strict=True) if p.runtime not in skipped]
    candidates, points = [c for c, _ in kept], [p for _, p in kept]
    for line in skipped.values():
        log.info("bench: %s", line)
    test = run.splits["test"]
    batches = sorted_batches(test, run.tokenizer, spec.eval_examples or len(test), 32, seed=0)
    validation = sorted_batches(run.splits["validation"], run.tokenizer, len(run.splits["validation"]), 32, seed=0)
    compare = [(m.name, r.name) for m in points if m.role == "member" for r in points if r.role == "reference"]
    result = bench.bench(
        candidates, batches, spec, run.out / "bench", ORIGINAL_NAME, compare, list(skipped.values()), validation
    )
    return {**result, "max_drop": spec.max_drop}, points, candidates


def unpaid_runtimes(run: RunState) -> dict[str, str]:
    """{runtime: why} for the runtimes whose int8 cannot pay on this CPU (`core.runtimes.cannot_pay`), except the
    runtime a speed-up budget is measured on: the user asked for that one."""
    budget = run.recipe.prune.resolved_budget
    asked = budget.runtime if budget.kind == "speedup" else None
    return {name: why for name in NAMES if name != asked and (why := cannot_pay(name)) is not None}


def _member_candidates(member: dict, spec, points: list[Point]) -> list:
    """A member's candidates (PyTorch, its layer-drop baseline, each ONNX variant) and their frontier points."""
    label, model_dir = member["label"], Path(member["pruned"]["model_dir"])
    cid = CandidateName(label, "member")
    pruned = bench.runtime_candidate(cid.name, cid.runtime, model_dir, spec.seq_lens)
    out = [pruned]
    points.append(Point.of(cid, str(model_dir)))
    if "baseline" in member:
        cid = CandidateName(label, "baseline")
        base_dir = Path(member["baseline"]["model_dir"])
        out.append(bench.runtime_candidate(cid.name, cid.runtime, base_dir, spec.seq_lens))
        points.append(Point.of(cid, str(base_dir)))
    for variant, info in member.get("export", {}).items():
        cid = CandidateName(label, "member", for_variant(variant).name)
        out.append(bench.runtime_candidate(cid.name, cid.runtime, info["dir"], spec.seq_lens, spec.threads, pruned))
        points.append(Point.of(cid, info["dir"], rejected=info.get("status") == "rejected"))
    return out


def member_budget(member: dict, check: dict | None) -> dict:
    """The member's target beside its budget check (`budget_checks`, speed-up budgets only): the check's median, its
    interquartile range and rounds, and whether the median is within 10% of the target; other kinds report FLOPs
    and heads."""
    out = {"target": (target := member["target"]), "flop_ratio": member["pruned"]["flop_ratio"]}
    if check is None:
        return out
    return out | {
        "measured_speedup": check["median"],
        "measured_vs": check["vs"],
        "measured_iqr": [check["q1"], check["q3"]],
        "measured_rounds": len(check["per_round"]),
        "within_10pct": within_target(check["median"], target),
    }


def budget_checks(run: RunState, sections: list[dict], candidates: list) -> dict[str, dict]:
    """Each member's budget check under a speed-up budget, keyed by label: `bench.paired_check` of the member on the
    budget's runtime against the original on that runtime, at the budget's batch size and length, with
    `prune.budget.check_rounds` rounds of `bench.min_time_s` visits. The bench's own rounds time every candidate
    between the two, so on a shared machine its ratio drifts; the verdict is this. A member or original the bench
    did not build (that runtime not exported) has none."""
    budget, spec = run.recipe.prune.resolved_budget, run.recipe.bench
    by_name = {c.name: c for c in candidates}
    original = by_name.get(name_of(ORIGINAL, "original", budget.runtime))
    if original is None:
        return {}
    checks = {}
    for m in sections:
        member = by_name.get(name_of(m["label"], "member", budget.runtime))
        if member is not None:
            log.info("budget check: %s against %s, %d rounds", member.name, original.name, budget.check_rounds)
            shape = (budget.batch_size, budget.seq_len, budget.check_rounds)
            checks[m["label"]] = bench.paired_check(member, original, *shape, spec.min_time_s, spec.threads)
    return checks


def run_budget(run: RunState, member: dict) -> dict:
    """A one-target run's budget section: the budget asked, what the run reached (heads, steps) and, for a speed-up
    budget, the latency table's prediction and the last step's own check beside the member's budget check
    (`member_budget`: the member alone against the original on the same runtime)."""
    budget, steps = run.recipe.prune.resolved_budget, run.result.steps
    out = {**budget.model_dump(mode="json"), "heads_left": member["pruned"]["heads_left"], "steps_run": len(steps)}
    if budget.kind == "speedup":
        out["predicted_speedup"] = steps[-1].get("predicted_speedup") if steps else None
        out["measured_in_run"] = steps[-1].get("measured_speedup") if steps else None  # the last step's own check
    return out | member["budget"]


def run_report(run: RunState, sections: list[dict]) -> dict:
    """The report sections after the members: one bench of them all, each member's budget check, the frontier
    and (a family) the pick at `bench.max_drop`. A family's go under `family`; a one-target run's member sections
    stay at the top (`pruned`, `baseline`, `export`, `model_card`, `budget`, `frontier`), as its report always had
    them."""
    budget = run.recipe.prune.resolved_budget
    result, points, candidates = {}, [], []
    if run.recipe.bench.enabled:
        with run.timed("original: export"):
            originals = bench_originals(run)
        with run.timed("family bench" if budget.is_family else "bench"):
            result, points, candidates = run_bench(run, sections, originals)
    checks = {}
    if budget.kind == "speedup" and candidates:
        with run.timed("budget check"):
            checks = budget_checks(run, sections, candidates)
    for m in sections:
        m["budget"] = member_budget(m, checks.get(m["label"]))
    recovery = run.recipe.prune.resolved_recovery
    rows = relative_to_run(frontier(result["summary"], points, _batch(budget), recovery), run.out) if result else None
    if budget.is_family:
        section = {"targets": budget.targets, "kind": budget.kind, "runtime": budget.runtime, "members": sections}
        if result:
            max_drop = result["max_drop"]
            section["frontier"] = rows
            section["pick"] = pick(rows, None if max_drop is None else 100 * max_drop, _batch(budget))
            section |= reference_comparison(rows, result)
        return {"bench": result, "family": section} if result else {"family": section}
    (member,) = sections
    out = {name: member[name] for name in (*MEMBER_STAGES, "member_finetune") if name in member}
    out |= {"bench": result} if result else {}
    out["budget"] = run_budget(run, member)
    return out | ({"frontier": rows} | reference_comparison(rows, result) if result else {})


def _batch(budget: BudgetSpec) -> int | None:
    """The batch size the frontier compares speed at: a speed-up budget's, else each candidate's headline."""
    return budget.batch_size if budget.kind == "speedup" else None
