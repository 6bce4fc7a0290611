"""What training a masked model's pruned copy saves: `recovery.train.train_kept` against `train` under the masks.

Every recovery fine-tune of a run (each step's, each member's last one) used to train the masked model at full
width, the dead units gated to zero; `train_kept` trains the physically pruned copy and writes its weights back (the
same updates, dropout draws aside: tests/test_distill.py). This script measures the difference per member of a
finished run: the member's units (its saved model's plan) as masks over the run's model (pretrained weights, eager
attention as the pruning loop uses: timing does not depend on the weights, so no base fine-tune is needed), the
run's `prune.finetune` capped at `--examples`, timed both ways, alternated `--repeats` times after one warm-up each
(medians; `train_kept`'s time includes its copy and write-back). Without distillation: its teacher logits are
cached, so it adds a loss term to either way, not a pass. Its seconds per example and ratio are what the
member's steps and last fine-tune cost; the first steps of a run, at larger widths, save less.

Usage (machine to itself):
    .venv/bin/python benchmarks/kept_training.py --run runs/cpu_tables/native_run --else-running "nothing"
    .venv/bin/python benchmarks/kept_training.py --run runs/mpnet_rt_2x_last --examples 160 \
        --out benchmarks/results/kept_training_mpnet.json --else-running "nothing"
  → prints a line per member and writes benchmarks/results/kept_training.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml
from accelerate import Accelerator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor.pruning.units import Masks  # noqa: E402
from compressor.recipe import Recipe, parse_recipe  # noqa: E402
from compressor.recovery.train import train, train_kept  # noqa: E402
from compressor.report.schema import RunReport  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import tokenize  # noqa: E402
from compressor.surgery.checkpoint import read_unit_plan  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "kept_training.json"


def masks_of(model: torch.nn.Module, model_dir: Path, units: list[str]) -> Masks:
    """The member's units as masks over the unpruned `model` (its removed layers: every head and neuron)."""
    plan = read_unit_plan(model_dir)
    masks = Masks.full(model, units).without({k: plan[k] for k in ("heads", "neurons") if k in units and plan[k]})
    for layer in plan["layers"]:  # a removed layer: none of its units is left
        masks.heads[layer] = False
        if masks.neurons is not None:
            masks.neurons[layer] = False
    return masks


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(recipe: Recipe, model, tokenizer, train_ds, masks: Masks, repeats: int) -> dict:
    """Median seconds of the same fine-tune under the masks and as the pruned copy (alternated, warmed up)."""
    spec, acc = recipe.prune.finetune, Accelerator(cpu=True)
    ways = {
        "masked": lambda m: train(m, train_ds, tokenizer, spec, acc, masks.head_gates(), neurons=masks.neuron_gates()),
        "pruned copy": lambda m: train_kept(m, masks, train_ds, tokenizer, spec, acc),
    }
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    for round_ in range(repeats + 1):
        for way, fn in ways.items():
            took = timed(lambda fn=fn: fn(copy.deepcopy(model)))
            if round_:  # the first round warms up
                seconds[way].append(took)
    return timing_row(seconds, masks, "speedup", ("masked", "pruned copy"), digits=2)


def timing_row(
    seconds: dict[str, list[float]], masks: Masks, ratio_key: str, ratio: tuple[str, str], digits: int
) -> dict:
    """Medians of alternated timings per way, every round, the ratio of `ratio`'s two ways' medians (slower
    first), and the units the masks keep."""
    medians = {way: statistics.median(values) for way, values in seconds.items()}
    return {
        "seconds": {way: round(value, digits) for way, value in medians.items()},
        "rounds": {way: [round(v, digits) for v in values] for way, values in seconds.items()},
        ratio_key: round(medians[ratio[0]] / medians[ratio[1]], 2),
        "heads_left": int(masks.heads.sum()),
        "neurons_left": None if masks.neurons is None else int(masks.neurons.sum()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished run directory")
    parser.add_argument("--examples", type=int, default=320, help="examples per timed fine-tune")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--else-running", required=True, help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    data = yaml.safe_load((args.run / "recipe.resolved.yaml").read_text())
    data["prune"]["finetune"] = {**data["prune"]["finetune"], "max_examples": args.examples, "distill": None}
    recipe = parse_recipe(data)
    task = load_task_data(recipe.data)
    tokenizer = load_tokenizer(recipe.model)
    model = load_model(recipe.model, task.label_names, attention="eager").eval()
    train_ds = tokenize(task.train, tokenizer, task.text_fields, recipe.data.max_length)
    rows = {}
    for member, model_dir in RunReport.read(args.run / "report.json").member_models(args.run):
        masks = masks_of(model, model_dir, recipe.prune.units)
        row = rows[member.label] = measure(recipe, model, tokenizer, train_ds, masks, args.repeats)
        seconds = row["seconds"]
        print(f"{member.label:>7}: heads {row['heads_left']}, neurons {row['neurons_left']}: masked {seconds['masked']}"
              f" s, pruned copy {seconds['pruned copy']} s, {row['speedup']}x", flush=True)  # fmt: skip
    out = {
        "what": "one recovery fine-tune of each member's units: masked at full width vs its pruned copy",
        "run": args.run.name if args.run.is_absolute() else str(args.run),
        **measured_on(args.else_running),
        "model": recipe.model.source,
        "examples": args.examples,
        "batch_size": recipe.prune.finetune.batch_size,
        "max_length": recipe.data.max_length,
        "threads": torch.get_num_threads(),
        "members": rows,
    }
    write_result(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
