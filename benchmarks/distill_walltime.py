"""Wall-time cost of distillation in the demo recipe, without a full run (issue 14: "same wall time within 1.3×").

Measured, on the default model and task (builtin:minilm-l6 with a fresh 2-label head on builtin:rotten_tomatoes;
timing does not depend on the weights, so the cached base fine-tune is not needed), with compressor's own
functions:
  (a) the teacher pass (`distill.load_or_compute`) over the examples the demo recipe's steps draw
      (`distill.step_examples`: the union over its steps), or over `--teacher-examples` of them, scaled;
  (b) one recovery fine-tune (`train.train`, the recipe's `prune.finetune` with `max_examples = --examples`), with
      and without distillation, alternated `--repeats` times (medians), after one warm-up fine-tune.
Projected: the demo's recovery = `prune.steps` × `max_examples` examples at the measured seconds per example; the
whole-run ratio adds the teacher pass and the fine-tunes' difference to `--run-seconds`, the wall time of a demo
run without distillation (default: `run_seconds` of benchmarks/results/demo.json, a quiet-machine run). Scoring,
evaluation, export and bench are the same with and without distillation, so they only enter through that figure.

Usage: python benchmarks/distill_walltime.py [--examples 300] [--teacher-examples 0 (= all drawn)] [--repeats 2]
       [--threads N] [--run-seconds S] → prints and writes benchmarks/results/distill_walltime.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from accelerate import Accelerator

from compressor.recipe import Recipe, load_recipe
from compressor.recovery import distill
from compressor.recovery.draws import drawn_examples
from compressor.recovery.train import train
from compressor.sources import load_model, load_task_data, load_tokenizer
from compressor.sources.batches import tokenize

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "minilm_rt_50pct.yaml"
DEMO = ROOT / "benchmarks" / "results" / "demo.json"
RESULTS = ROOT / "benchmarks" / "results" / "distill_walltime.json"


def setup(recipe: Recipe) -> tuple[torch.nn.Module, object, object]:
    """(pretrained model with a 2-label head, eager attention as the pruning loop uses; tokenizer; tokenised
    train split)."""
    data = load_task_data(recipe.data)
    tokenizer = load_tokenizer(recipe.model)
    model = load_model(recipe.model, data.label_names, attention="eager").eval()
    return model, tokenizer, tokenize(data.train, tokenizer, data.text_fields, recipe.data.max_length)


def time_teacher(model, tokenizer, train_ds, recipe: Recipe, limit: int) -> dict:
    """(a) The teacher pass over the examples the recipe's steps draw (the first `limit` of them when > 0)."""
    finetune = recipe.prune.finetune
    drawn = distill.step_examples(len(train_ds), finetune, recipe.seed, recipe.prune.steps)
    drawn = list(range(len(train_ds))) if drawn is None else drawn
    timed = drawn[:limit] if limit > 0 else drawn
    acc = Accelerator(cpu=not torch.cuda.is_available())
    distill.load_or_compute(None, model, train_ds, tokenizer, acc, finetune.distill, timed[:32])  # warm-up
    start = time.perf_counter()
    distill.load_or_compute(None, model, train_ds, tokenizer, acc, finetune.distill, timed)
    seconds = time.perf_counter() - start
    return {
        "train_examples": len(train_ds),
        "drawn_examples": len(drawn),
        "timed_examples": len(timed),
        "seconds_measured": seconds,
        "seconds_projected": seconds * len(drawn) / len(timed),
    }


def time_finetunes(model, tokenizer, train_ds, recipe: Recipe, examples: int, repeats: int) -> dict:
    """(b) One recovery fine-tune of `examples` examples, plain and distilled, alternated; compressor's own loop
    timing (`train(...)["seconds"]`), medians over `repeats`."""
    spec = recipe.prune.finetune.model_copy(update={"max_examples": examples})
    acc = Accelerator(cpu=not torch.cuda.is_available())
    seed = recipe.seed
    targets = distill.load_or_compute(
        None, model, train_ds, tokenizer, acc, spec.distill, drawn_examples(len(train_ds), examples, seed)
    )
    warm = spec.model_copy(update={"max_examples": min(examples, 2 * spec.batch_size)})
    train(copy.deepcopy(model), train_ds, tokenizer, warm, acc, seed=seed, desc="warm-up")
    runs: dict[str, list[float]] = {"plain": [], "distill": []}
    for _ in range(repeats):
        for name, teacher in (("plain", None), ("distill", targets)):
            stats = train(copy.deepcopy(model), train_ds, tokenizer, spec, acc, seed=seed, desc=name, teacher=teacher)
            runs[name].append(stats["seconds"])
    return {
        "examples": examples,
        "seconds": runs,
        "seconds_per_example": {name: statistics.median(s) / examples for name, s in runs.items()},
    }


def project(recipe: Recipe, teacher: dict, finetune: dict, run_seconds: float | None) -> dict:
    """The demo's recovery with and without distillation, and (with `run_seconds`) the whole run's ratio."""
    per_step = recipe.prune.finetune.max_examples
    per_example = finetune["seconds_per_example"]
    plain = recipe.prune.steps * per_step * per_example["plain"]
    distilled = teacher["seconds_projected"] + recipe.prune.steps * per_step * per_example["distill"]
    out = {
        "recovery_seconds_plain": plain,
        "recovery_seconds_distill": distilled,
        "recovery_ratio": distilled / plain,
        "run_seconds_plain": run_seconds,
    }
    if run_seconds is not None:
        out["run_seconds_distill"] = run_seconds + distilled - plain
        out["run_ratio"] = out["run_seconds_distill"] / run_seconds
        # A recovery longer than the whole recorded run means this machine (or its load) is not the one that
        # recorded run_seconds: the run ratio is then not meaningful, the recovery ratio still is.
        out["run_seconds_consistent"] = plain < run_seconds
    return out


def default_run_seconds() -> float | None:
    """`run_seconds` of the last quiet-machine demo run (distillation off), when recorded."""
    return json.loads(DEMO.read_text()).get("run_seconds") if DEMO.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=300, help="examples per timed fine-tune")
    parser.add_argument("--teacher-examples", type=int, default=0, help="teacher pass over this many (0: all drawn)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--run-seconds", type=float, default=None, help="demo run without distillation (s)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = load_recipe(RECIPE)
    model, tokenizer, train_ds = setup(recipe)
    teacher = time_teacher(model, tokenizer, train_ds, recipe, args.teacher_examples)
    finetune = time_finetunes(model, tokenizer, train_ds, recipe, args.examples, args.repeats)
    run_seconds = args.run_seconds if args.run_seconds is not None else default_run_seconds()
    result = {
        "recipe": str(RECIPE.relative_to(ROOT)),
        "model": f"{recipe.model.source} (pretrained, fresh 2-label head)",
        "threads": torch.get_num_threads(),
        "steps": recipe.prune.steps,
        "max_examples_per_step": recipe.prune.finetune.max_examples,
        "measured": {"teacher_pass": teacher, "finetune": finetune},
        "projected": project(recipe, teacher, finetune, run_seconds),
        "note": "teacher_pass.seconds_projected scales the timed examples to all drawn ones; recovery_* scale the "
        "measured seconds per fine-tuned example to steps x max_examples; run_* add the difference to run_seconds_"
        "plain (a demo run without distillation, from demo.json unless --run-seconds is given)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["projected"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
