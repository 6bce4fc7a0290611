"""`compressor run`: sequencing and resume, the only module that knows the whole order of stages.

preflight → sources → base fine-tune (cached) → `recovery.loop.prune` (loop {score → select → mask → fine-tune},
each step checkpointed by `StepCheckpoints` under `<output_dir>/state/`) → for each member (`members`: one for a
one-target run) `stages.run_stages` (surgery + save → layer-drop baseline → export → model card) → one bench of
every member → budget check and frontier → analysis → report. A killed run resumes from its last
finished step and ends exactly where an uninterrupted run would (CPU, seeded). Only the main process writes; under
`accelerate launch` the others train, score and wait.
"""

from __future__ import annotations

import copy
import logging
import time
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from compressor.core import outdir
from compressor.core.errors import UserError
from compressor.core.machine import cpu_has_bf16
from compressor.pipeline import runlog
from compressor.pipeline.finetune import cached_finetune
from compressor.pipeline.members import make_members
from compressor.pipeline.preflight import Checked, preflight
from compressor.pipeline.references import prepare_references
from compressor.pipeline.stages import RunState
from compressor.pruning.budget import max_steps
from compressor.recipe import Recipe, dump_recipe
from compressor.recovery.checkpoints import StepCheckpoints
from compressor.recovery.distill import TeacherTargets, load_or_compute
from compressor.recovery.draws import teacher_examples
from compressor.recovery.evaluate import evaluate
from compressor.recovery.loop import prune
from compressor.recovery.rescale import post_training_sample, recovery_summary
from compressor.report.schema import SCHEMA_VERSION
from compressor.report.writer import write_report
from compressor.sources import load_model, load_tokenizer
from compressor.sources.batches import tokenize_splits
from compressor.surgery.cost import size_stats

log = logging.getLogger("compressor")
DONE_FILE = outdir.DONE_FILE  # written last and atomically: its presence means the run finished


def native_precision() -> tuple[str, str]:
    """What `mixed_precision: auto` resolves to here, and why: bf16 on a CUDA GPU that supports it or on a CPU that
    multiplies bf16 natively (AMX-BF16, AVX512-BF16), else "no" (fp32): emulated bf16 is slower than fp32."""
    if torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return "bf16", "this GPU supports bf16"
        return "no", "this GPU has no bf16"
    if cpu_has_bf16():
        return "bf16", "this CPU multiplies bf16 natively (AMX-BF16 or AVX512-BF16)"
    return "no", "this CPU has neither AMX-BF16 nor AVX512-BF16 (bf16 would be emulated, slower than fp32)"


def precision_words(asked: str, running: str) -> str:
    """The fine-tunes' precision in the run's log: what runs, and for `auto` why."""
    words = "fp32" if running == "no" else f"{running} autocast"
    return f"{words} (mixed_precision auto: {native_precision()[1]})" if asked == "auto" else words


def finetune_device(accelerator: Accelerator) -> str:
    """Where the run's fine-tunes, scoring and evaluation run, as the log and report name it: "cpu", or a CUDA
    device with its name ("cuda:0 (NVIDIA H100 80GB HBM3)"). Timing (latency tables, budget checks, the bench) and
    export stay on the CPU whatever this is: the runtimes are CPU runtimes."""
    device = accelerator.device
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def make_accelerator(mixed_precision: str = "no") -> Accelerator:
    """The run's Accelerator. Under several processes the others wait at a barrier while the main process exports,
    benchmarks and analyses alone; gloo's default 30-minute timeout would kill a long run there, so allow 12 h.

    `mixed_precision` is the recipe's `accelerate.mixed_precision`; "no" leaves Accelerate's own choice (fp32, or
    what `accelerate launch --mixed_precision` set); "auto" takes `native_precision()`. A precision this machine
    cannot run is one line (exit 2)."""
    if mixed_precision == "auto":
        mixed_precision = native_precision()[0]
    handlers = [InitProcessGroupKwargs(timeout=timedelta(hours=12))]
    try:
        return Accelerator(
            mixed_precision=None if mixed_precision == "no" else mixed_precision, kwargs_handlers=handlers
        )
    except ValueError as err:
        raise UserError(f"accelerate.mixed_precision: {mixed_precision} is not available here ({err})") from None


def base_model(run: RunState) -> tuple[torch.nn.Module, dict]:
    """The task-tuned starting point: the recipe's model as is, or a cached fine-tune of it (`finetune`)."""
    r = run.recipe
    if r.model.task_tuned:
        return load_model(r.model, run.data.label_names, attention="eager"), {"cached": None}
    return cached_finetune(run, r.model, run.tokenizer, run.splits["train"], seed=r.base_finetune_seed)


def _base_phase(base_info: dict) -> str:
    """The stage-time table's name for what `base_model` did."""
    if "seconds" in base_info:
        return "base fine-tune"
    return "base model: load" if base_info["cached"] is None else "base model: load cached fine-tune"


def prepare(
    recipe: Recipe, accelerator: Accelerator | None = None, force: bool = False, checked: Checked | None = None
) -> RunState:
    """Load the tokenizer on what the preflight checked (run here when not given); only then take the output
    directory (`outdir.claim`), log, tokenise."""
    accelerator = accelerator or make_accelerator(recipe.accelerate.mixed_precision)
    checked = checked or preflight(recipe, force)
    target, data = checked.target, checked.data
    out = target.path
    tokenizer = load_tokenizer(recipe.model)
    accelerator.wait_for_everyone()  # every process has checked the directory before the main one locks it
    if accelerator.is_main_process:
        outdir.claim(target, dump_recipe(recipe))  # lock; with --force the earlier run moves aside only now
    accelerator.wait_for_everyone()
    runlog.open_run_log(out, accelerator.is_main_process)
    run = RunState(checked.recipe, out, accelerator, data, tokenizer)  # a relative budget's targets measured
    if checked.reference_speedup is not None:
        asked, measured = recipe.prune.resolved_budget, checked.recipe.prune.resolved_budget
        run.relative_budget = {"reference": asked.relative_to, "multiples": asked.targets,
                               "reference_speedup": checked.reference_speedup, "targets": measured.targets}  # fmt: skip
        log.info("budget: %s measured %.2fx the model on %s: targets %s", asked.relative_to,
                 checked.reference_speedup, asked.runtime, ", ".join(f"{t:g}x" for t in measured.targets))  # fmt: skip
    run.splits.update(tokenize_splits(data, tokenizer, recipe.data.max_length))
    words = precision_words(recipe.accelerate.mixed_precision, accelerator.mixed_precision)
    log.info("fine-tunes on %s in %s", finetune_device(accelerator), words)
    log.info(
        "data: %s train / %s validation / %s test, labels %s",
        len(data.train),
        len(data.validation),
        len(data.test),
        data.label_names,
    )
    return run


def run_recipe(recipe: Recipe, force: bool = False, accelerator: Accelerator | None = None) -> dict:
    """Execute the whole recipe; returns the report dict (also written to `<output_dir>/report.json`).

    The order: preflight → sources → base model → `recovery.loop.prune` (checkpointed by `StepCheckpoints`) →
    each member's stages (surgery + save, layer-drop baseline, export, model card) → bench → budget → analysis → report;
    the wall time of each phase goes into the report (`timings`).
    """
    t0 = time.perf_counter()
    checked = preflight(recipe, force)
    run = prepare(recipe, accelerator or make_accelerator(recipe.accelerate.mixed_precision), force, checked)
    recipe, out = run.recipe, run.out  # the recipe as run (a budget relative to a reference: measured speed-ups)
    run.timings["data + tokenise"] = round(time.perf_counter() - t0, 1)
    accelerator = run.accelerator
    sample = post_training_sample(run.splits["train"], recipe.prune, recipe.seed)  # a too-large sample fails here
    started = time.perf_counter()
    model, base_info = base_model(run)
    run.timings[_base_phase(base_info)] = round(time.perf_counter() - started, 1)
    run.splits["train"] = sample  # from here on a post-training run reads its sample only
    model = model.to(accelerator.device)
    with run.timed("original: evaluate"):
        original = {
            "validation": evaluate(model, run.splits["validation"], run.tokenizer, accelerator),
            "test": evaluate(model, run.splits["test"], run.tokenizer, accelerator),
        }
    log.info("original: val acc %.4f, test acc %.4f", original["validation"]["accuracy"], original["test"]["accuracy"])
    start = copy.deepcopy(accelerator.unwrap_model(model)).cpu()
    run.original = start if run.main else None
    hook = StepCheckpoints(out / "state", run.main)
    validation = run.splits["validation"]
    with run.timed("teacher targets"):
        teacher = _teacher(run, model)
    with run.timed("pruning steps"):
        run.result = prune(
            model, run.tokenizer, run.splits["train"], recipe.prune, validation=validation, seed=recipe.seed,
            accelerator=accelerator, hook=hook, teacher=teacher,
        )  # fmt: skip
    run.result.model.cpu()
    return _finish(run, start, teacher, base_info, original, t0)


def _finish(
    run: RunState, start: torch.nn.Module, teacher: TeacherTargets | None, base_info: dict, original: dict, t0: float
) -> dict:
    """After the loop: make each member shippable (`members.make_members`; one member for a one-target run), then one
    bench of them all, the budget check and frontier (`measure.run_report`), the analysis, the report and, last and
    atomically, the done marker; release the run directory. Returns the report."""
    from compressor.pipeline import measure
    from compressor.pipeline.stages import analysis_stage

    run.report = _report_head(run, base_info, original)
    sections = make_members(run, start, teacher)
    taught = teacher if run.recipe.bench.reference_distill else None
    references = prepare_references(run, taught)  # every process fine-tunes; the main one saves and exports
    if not run.main:
        run.accelerator.wait_for_everyone()
        return {}
    run.report |= {"references": references} if references else {}
    run.report |= measure.run_report(run, sections)
    if run.recipe.analysis.enabled:
        with run.timed("analysis"):
            run.report["analysis"] = analysis_stage(run)
    run.report["seconds"] = time.perf_counter() - t0
    run.report["timings"] = run.timings
    report = write_report(run.report, run.out)
    report.write(run.out / DONE_FILE)  # last: its presence marks the run finished
    outdir.finish(run.out)  # the run it replaced (with --force) goes only now; the lock is released
    log.info("done in %.0fs: %s", report.seconds, run.out / "report.md")
    run.accelerator.wait_for_everyone()
    return report.dump()


def _teacher(run: RunState, model: torch.nn.Module) -> TeacherTargets | None:
    """With distillation on, the teacher targets of the task-tuned `model` (before any step), cached under
    `state/teacher` so a resumed run reuses exactly the same ones."""
    finetune = run.recipe.prune.recovery_finetune
    if finetune is None or finetune.distill is None:
        return None
    recipe, train_ds = run.recipe, run.splits["train"]
    reference = (recipe.bench.reference_finetune or recipe.base_finetune) if recipe.bench.reference_distill else None
    examples = teacher_examples(len(train_ds), recipe.prune, reference, recipe.seed, max_steps(recipe.prune))
    return load_or_compute(
        run.out / "state" / "teacher", model, train_ds, run.tokenizer, run.accelerator, finetune.distill, examples
    )


def _report_head(run: RunState, base_info: dict, original: dict) -> dict:
    """The report's sections known before the members are made (they add `pruned`, `export`, `bench`, ...); on the
    main process the original's size and FLOPs too (`size_stats`, at the bench's length as each member's are)."""
    recipe = run.recipe
    if run.original is not None:
        original = {**original, **size_stats(run.original, recipe.bench.seq_len)}
    return {
        "schema_version": SCHEMA_VERSION,
        "name": recipe.name,
        "status": "complete",
        "model_source": recipe.model.source,
        "data_source": recipe.data.source,
        "labels": run.data.label_names,
        "base_finetune": base_info,
        "mixed_precision": str(run.accelerator.mixed_precision),  # what the fine-tunes ran in ("no": fp32)
        "device": finetune_device(run.accelerator),  # and where
        "original": original,
        "steps": run.result.steps,
        "recovery": recovery_summary(recipe.prune, run.result.steps),
    } | ({"relative_budget": run.relative_budget} if run.relative_budget else {})
