"""A model family: one run, several targets (`prune.budget.values`), one model saved at each.

The pruning loop passes through every target in order (`Budget.closing` marks the step that reaches each one) and
`StepCheckpoints` keeps that step's weights. After the loop, each member runs the single-run stages that make a
shippable model (surgery + save, layer-drop baseline at its FLOPs, ONNX export with the int8 gate, model card)
under `<output_dir>/members/<label>/`, and `member.json` is written last: a resumed run keeps every member that has
one and redoes only the rest. Then one benchmark times every member and runtime beside the original, the original's
own ONNX exports (the "just quantize" alternative) and each layer-drop baseline, on the same interleaved rounds, and
`compressor.bench.frontier` turns it into the speed/quality frontier the report, `report.json` and `compressor pick`
share.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from compressor import bench
from compressor.bench.baseline import Baseline
from compressor.bench.candidates import as_sdpa
from compressor.bench.frontier import Point, frontier, pick, relative_to_run
from compressor.core import atomic
from compressor.core.candidates import ORIGINAL_NAME, CandidateName, name_of
from compressor.core.runtimes import for_variant
from compressor.pipeline.stages import (
    STAGES,
    RunState,
    bench_spec_for,
    export_original,
    measured_speedup,
    run_stages,
    with_quantize_only,
)
from compressor.pruning.selection import mask_to_plan
from compressor.recipe import BudgetSpec
from compressor.recovery.loop import Member, PruneResult
from compressor.sources.batches import sample_batches
from compressor.surgery.checkpoint import load_pruned, save_pruned

log = logging.getLogger("compressor")
MEMBER_FILE = "member.json"  # written last in a member's directory: its presence means the member is complete
MEMBERS_DIR = "members"
MEMBER_STAGES = ("pruned", "baseline", "export", "model_card")  # what makes one member shippable
BASELINE_DIR = "layer_drop"  # the member's layer-drop baseline, saved so a resumed run can still benchmark it


def member_label(budget: BudgetSpec, target: float) -> str:
    """A member's directory name: '2x', '1.5x' (speed-up), '50pct' (a fraction of heads or FLOPs)."""
    if budget.kind == "speedup":
        return f"{target:g}x"
    return f"{100 * target:g}pct"


def member_state(run: RunState, member: Member) -> RunState:
    """The run state one member's stages see: the member's masks, its step's weights and step log, its own
    directory and report (the original's figures copied in, as the stages read them)."""
    result = run.result
    sub = PruneResult(
        model=result.member_model(member),
        masks=member.masks,
        plan=mask_to_plan(member.masks.heads),
        records=result.records[: member.step],
    )
    label = member_label(run.recipe.prune.resolved_budget, member.target)
    return dataclasses.replace(
        run,
        out=run.out / MEMBERS_DIR / label,
        result=sub,
        report={"original": copy.deepcopy(run.report["original"])},
        pruned=None,
        model_dir=None,
        exported={},
        baseline=None,
        timings={},
    )


def completed(member_dir: Path) -> dict | None:
    """The member's saved section when it finished in an earlier try of this run (else None)."""
    path = member_dir / MEMBER_FILE
    return json.loads(path.read_text()) if path.exists() else None


def saved_baseline(section: dict) -> Baseline | None:
    """A finished member's layer-drop baseline, loaded back so the next member's baseline continues from it."""
    base = section.get("baseline")
    if base is None:
        return None
    model = load_pruned(base["model_dir"], attn_implementation="eager").eval()
    return Baseline(model, base["layers_dropped"], {k: v for k, v in base.items() if k != "model_dir"})


def run_member(state: RunState, member: Member, make_baseline: Callable[[RunState], Baseline] | None) -> dict:
    """Make one member shippable in `state.out` (a fresh directory) and return its report section; `member.json` is
    written last. Every process takes part in the baseline's fine-tune; only the main one writes."""
    if make_baseline is not None:
        with state.timed("layer-drop baseline: fine-tune"):
            state.baseline = make_baseline(state)
    if not state.main:
        return {}
    shutil.rmtree(state.out, ignore_errors=True)  # an earlier try's unfinished member: redone whole
    state.out.mkdir(parents=True)
    stages = tuple(s for s in STAGES if s.name in MEMBER_STAGES)
    run_stages(state, stages)
    section = {
        "target": member.target,
        "label": state.out.name,
        "step": member.step,
        **{name: state.report[name] for name in MEMBER_STAGES if name in state.report},
    }
    if state.baseline is not None:
        section["baseline"]["model_dir"] = str(save_pruned(state.baseline.model, state.out / BASELINE_DIR))
    atomic.write_text(state.out / MEMBER_FILE, json.dumps(section, indent=2, default=str))
    log.info("member %s: test acc %.4f, saved in %s", section["label"], section["pruned"]["test"]["accuracy"],
             state.out)  # fmt: skip
    return section


def family_bench(run: RunState, members: list[dict]) -> tuple[dict, list[Point]]:
    """One benchmark of the original (PyTorch and each exported variant), every member on every runtime, and each
    member's layer-drop baseline; returns the bench result and the frontier's point descriptions."""
    spec = bench_spec_for(run.recipe)
    seq = spec.seq_lens
    original = bench.runtime_candidate(ORIGINAL_NAME, "pytorch", as_sdpa(run.original), seq)
    candidates, points = [original], [Point.of(CandidateName.original(), None)]
    variants = with_quantize_only(run.recipe, run.recipe.export.variants if run.recipe.export.enabled else [])
    for variant, info in export_original(run, variants).items():
        cid = CandidateName.original(for_variant(variant).name)
        candidates.append(bench.runtime_candidate(cid.name, cid.runtime, info["dir"], seq, spec.threads, original))
        points.append(Point.of(cid, None))
    for m in members:
        candidates += _member_candidates(m, spec, points)
    test = run.splits["test"]
    batches = sample_batches(test, run.tokenizer, spec.eval_examples or len(test), 32, seed=0)
    result = bench.bench(candidates, batches, spec, run.out / "bench", reference=ORIGINAL_NAME)
    return {**result, "max_drop": spec.max_drop}, points


def _member_candidates(member: dict, spec, points: list[Point]) -> list:
    """A member's candidates (PyTorch, each ONNX variant, its layer-drop baseline) and their frontier points."""
    label, model_dir = member["label"], Path(member["pruned"]["model_dir"])
    cid = CandidateName(label, "member")
    pruned = bench.runtime_candidate(cid.name, cid.runtime, model_dir, spec.seq_lens)
    out = [pruned]
    points.append(Point.of(cid, str(model_dir)))
    for variant, info in member.get("export", {}).items():
        cid = CandidateName(label, "member", for_variant(variant).name)
        out.append(bench.runtime_candidate(cid.name, cid.runtime, info["dir"], spec.seq_lens, spec.threads, pruned))
        points.append(Point.of(cid, info["dir"], rejected=info.get("status") == "rejected"))
    if "baseline" in member:
        cid = CandidateName(label, "baseline")
        base_dir = Path(member["baseline"]["model_dir"])
        out.append(bench.runtime_candidate(cid.name, cid.runtime, base_dir, spec.seq_lens))
        points.append(Point.of(cid, str(base_dir)))
    return out


def member_budget(budget: BudgetSpec, member: dict, speedups: dict) -> dict:
    """The member's target beside the speed-up this run's bench measured at the budget's batch size and length,
    against the original on the budget's runtime (speed-up budgets; other kinds report FLOPs and heads)."""
    out = {"target": member["target"], "flop_ratio": member["pruned"]["flop_ratio"]}
    if budget.kind != "speedup":
        return out
    name = name_of(member["label"], "member", budget.runtime)
    return out | measured_speedup(speedups, name, budget, member["target"])


def family_report(run: RunState, members: list[dict]) -> dict:
    """The family's bench, each member's budget check, the frontier and the pick at `bench.max_drop`."""
    budget = run.recipe.prune.resolved_budget
    result, points = family_bench(run, members) if run.recipe.bench.enabled else ({}, [])
    for m in members:
        m["budget"] = member_budget(budget, m, result.get("speedups", {}))
    section = {"targets": budget.targets, "kind": budget.kind, "runtime": budget.runtime, "members": members}
    if result:
        batch = budget.batch_size if budget.kind == "speedup" else None
        table = frontier(result["summary"], points, batch, run.recipe.prune.resolved_recovery)
        max_drop = result["max_drop"]
        relative_to_run(table, run.out)
        section["frontier"] = table
        section["pick"] = pick(table, None if max_drop is None else 100 * max_drop, batch)
    return {"bench": result, "family": section} if result else {"family": section}
