"""A run's members, made: the model saved at each target (`prune.budget.values`), one for a one-target run.

Every run is a family: a one-target run is a family of one member, labelled `SINGLE` ("pruned"), made in the run
directory itself (`model/`, `onnx/`) so its layout and report keys stay as they always were; a family's members
live under `<output_dir>/members/<label>/`. The pruning loop passes through every target in order
(`Budget.closing` marks the step that reaches each one) and `StepCheckpoints` keeps that step's weights. After the
loop, each member gets its last fine-tune (`prune.member_finetune`) and its layer-drop baseline (each continuing the
previous member's), then runs the stages that make a shippable model (surgery + save, export with the int8 gate,
model card), and `member.json` is written last: a resumed run keeps every member that has one and redoes only the
rest. What comes after, one bench of them all and the frontier, is `measure`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from compressor.core.candidates import SINGLE
from compressor.pipeline.stages import STAGES, RunState, run_stages
from compressor.pruning.selection import mask_to_plan
from compressor.recipe import BudgetSpec
from compressor.recovery.distill import TeacherTargets
from compressor.recovery.draws import member_seed
from compressor.recovery.evaluate import evaluate_kept
from compressor.recovery.layer_drop import LayerDropBaseline, layer_drop_baseline
from compressor.recovery.loop import Member, PruneResult
from compressor.recovery.train import train, train_kept
from compressor.report.schema import MemberSection
from compressor.surgery.checkpoint import load_pruned, save_pruned

log = logging.getLogger("compressor")
MEMBER_FILE = "member.json"  # written last in a member's directory: its presence means the member is complete
MEMBERS_DIR = "members"
MEMBER_STAGES = tuple(stage.name for stage in STAGES)  # what makes one member shippable
BASELINE_DIR = "layer_drop"  # the member's layer-drop baseline, saved so a resumed run can still benchmark it
MEMBER_OUTPUTS = ("model", "onnx", BASELINE_DIR, MEMBER_FILE)  # everything a member writes in its directory


def members(run: RunState) -> list[Member]:
    """The run's members: each target's step for a family; for one target, the model the loop ended with (after
    any top-up step), so a one-target run ships what it always shipped."""
    result, budget = run.result, run.recipe.prune.resolved_budget
    if budget.is_family:
        return result.members
    return [Member(budget.value, len(result.records), result.masks)]


def member_label(budget: BudgetSpec, target: float) -> str:
    """A member's name: '2x', '1.5x' (speed-up), '50pct' (a fraction of heads or FLOPs); `SINGLE` ("pruned") for
    the one member of a one-target run."""
    if not budget.is_family:
        return SINGLE
    if budget.kind == "speedup":
        return f"{target:g}x"
    return f"{100 * target:g}pct"


def member_dir(run: RunState, label: str) -> Path:
    """Where a member is made: the run directory itself for a one-target run, else `members/<label>/`."""
    return run.out if label == SINGLE else run.out / MEMBERS_DIR / label


def member_state(run: RunState, member: Member) -> RunState:
    """The run state one member's stages see: the member's masks, its step's weights and step log, its own
    directory and report (the original's figures copied in, as the stages read them)."""
    result = run.result
    sub = result
    if member.step != len(result.records) or member.masks is not result.masks:
        sub = PruneResult(
            model=result.member_model(member),
            masks=member.masks,
            plan=mask_to_plan(member.masks.heads),
            records=result.records[: member.step],
        )
    label = member_label(run.recipe.prune.resolved_budget, member.target)
    return dataclasses.replace(
        run,
        out=member_dir(run, label),
        result=sub,
        report={"original": copy.deepcopy(run.report["original"])},
        pruned=None,
        model_dir=None,
        exported={},
        baseline=None,
        timings={},
    )


def completed(member_dir: Path) -> dict | None:
    """The member's saved section when it finished in an earlier try of this run (else None), read through its
    typed model (`report.schema.MemberSection`)."""
    path = member_dir / MEMBER_FILE
    return MemberSection.read(path).dump() if path.exists() else None


def saved_baseline(section: dict) -> LayerDropBaseline | None:
    """A finished member's layer-drop baseline, loaded back so the next member's baseline continues from it."""
    base = section.get("baseline")
    if base is None:
        return None
    model = load_pruned(base["model_dir"], attn_implementation="eager").eval()
    return LayerDropBaseline(model, base["layers_dropped"], {k: v for k, v in base.items() if k != "model_dir"})


def _clear(out: Path) -> None:
    """Remove what an earlier, unfinished try of a member wrote (`MEMBER_OUTPUTS`), so it is redone whole; the rest
    of the directory stays (a one-target run's member is made in the run directory itself)."""
    for name in MEMBER_OUTPUTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    out.mkdir(parents=True, exist_ok=True)


def run_member(
    state: RunState,
    member: Member,
    make_baseline: Callable[[RunState], LayerDropBaseline] | None,
    finish: Callable[[RunState], dict] | None = None,
) -> dict:
    """Make one member shippable in `state.out` and return its report section; `member.json` is written last.
    `finish`: the member's final fine-tune (`prune.member_finetune`), before its surgery. Every process takes part
    in the fine-tunes; only the main one writes."""
    finetuned = None
    if finish is not None:
        with state.timed("final fine-tune"):
            finetuned = finish(state)
    if make_baseline is not None:
        with state.timed("layer-drop baseline: fine-tune"):
            state.baseline = make_baseline(state)
    if not state.main:
        return {}
    _clear(state.out)
    run_stages(state, STAGES)
    section = {
        "target": member.target,
        "label": member_label(state.recipe.prune.resolved_budget, member.target),
        "step": member.step,
        **{name: state.report[name] for name in MEMBER_STAGES if name in state.report},
    }
    if finetuned is not None:
        section["member_finetune"] = finetuned
    if state.baseline is not None:
        section["baseline"]["model_dir"] = str(save_pruned(state.baseline.model, state.out / BASELINE_DIR))
    typed = MemberSection.of(section)
    typed.write(state.out / MEMBER_FILE)
    section = typed.dump()
    log.info("member %s: test acc %.4f, saved in %s", section["label"], section["pruned"]["test"]["accuracy"],
             state.out)  # fmt: skip
    return section


def make_members(run: RunState, start: torch.nn.Module, teacher: TeacherTargets | None) -> list[dict]:
    """Each member's report section, ascending: kept from an earlier try when it finished (`member.json`), else
    made now (`run_member`; its stage times join the run's, prefixed with the member's label in a family).
    Empty on processes other than the main one."""
    sections, previous, steps_before = [], None, 0
    for index, member in enumerate(members(run)):
        label = member_label(run.recipe.prune.resolved_budget, member.target)
        if (done := completed(member_dir(run, label))) is not None:
            log.info("member %s: kept from an earlier try (%s)", label, member_dir(run, label))
            sections.append(done)
            previous, steps_before = saved_baseline(done), member.step
            continue
        state = member_state(run, member)
        make_baseline, finish = None, None
        if run.recipe.prune.baseline:  # the family's baselines are one layer-dropped model trained on, like its members
            make_baseline = partial(_baseline, original=start, teacher=teacher, previous=previous,
                                    steps_before=steps_before, index=index)  # fmt: skip
        if run.recipe.prune.member_finetune is not None:
            finish = partial(_member_finetune, teacher=teacher, index=index)
        section = run_member(state, member, make_baseline, finish)
        sections += [section] if run.main else []
        prefix = "" if label == SINGLE else f"member {label}: "
        run.timings |= {f"{prefix}{k}": v for k, v in state.timings.items()}
        previous, steps_before = state.baseline, member.step
        run.accelerator.wait_for_everyone()
    return sections


def _baseline(
    run: RunState,
    original: torch.nn.Module,
    teacher: TeacherTargets | None,
    previous: LayerDropBaseline | None = None,
    steps_before: int = 0,
    index: int = 0,
) -> LayerDropBaseline:
    """The layer-dropping baseline at the pruned model's FLOPs, fine-tuned on every process like the steps were
    (with the same teacher targets when distillation is on). In a family, member `index`'s baseline continues the
    previous member's (`previous`, after `steps_before` steps): it loses the further top layers this member's FLOPs
    need and trains for the steps pruning took since (`layer_drop_baseline(start=...)`), on its own seeded draw."""
    recipe, result = run.recipe, run.result
    seq = recipe.prune.resolved_budget.seq_len
    log.info("baseline: dropping top layers to the pruned model's FLOPs and fine-tuning alike")
    baseline = layer_drop_baseline(
        original, result.masks.flops(result.model, seq), seq, run.splits["train"], run.tokenizer,
        recipe.prune.recovery_finetune, len(result.steps) - steps_before, run.accelerator, seed=recipe.seed + index,
        teacher=teacher, start=previous,
    )  # fmt: skip
    if recipe.prune.member_finetune is not None:  # the member's final fine-tune too; the next baseline goes on from
        model = baseline.model.to(run.accelerator.device)  # it, which if anything favours the baseline
        baseline.info["member_finetune"] = train(
            model, run.splits["train"], run.tokenizer, recipe.prune.member_spec(index), run.accelerator,
            seed=member_seed(recipe.seed, index), desc="baseline: final fine-tune", teacher=teacher,
        )  # fmt: skip
        baseline.model = run.accelerator.unwrap_model(model).cpu().eval()
    return baseline


def _member_finetune(state: RunState, teacher: TeacherTargets | None, index: int) -> dict:
    """Member `index`'s final fine-tune (`prune.member_finetune`), on every process, in place on the member's own
    model (a copy of its step's weights; the last member's is the loop's final model, whose steps are over), its
    kept units trained as the pruned copy they make (`train_kept`), distilled as the steps were; with the member's
    validation accuracy before it (its step's) and after it, so the report shows what the longer schedule bought."""
    result, spec, accelerator = state.result, state.recipe.prune.member_spec(index), state.accelerator
    masks = result.masks
    log.info("member: final fine-tune (%s epochs, %s examples per epoch)", spec.epochs, spec.max_examples or "all")
    info = train_kept(
        result.model, masks, state.splits["train"], state.tokenizer, spec, accelerator,
        seed=member_seed(state.recipe.seed, index), desc="member: final fine-tune", teacher=teacher,
    )  # fmt: skip
    result.model = result.model.cpu().eval()
    before = result.records[-1].entry.get("val_after_finetune") if result.records else None
    after = evaluate_kept(result.model, masks, state.splits["validation"], state.tokenizer, accelerator)
    log.info("member: validation accuracy %s -> %.4f after the final fine-tune",
             f"{before['accuracy']:.4f}" if before else "?", after["accuracy"])  # fmt: skip
    return {**info, "val_before": before, "val_after": after}
