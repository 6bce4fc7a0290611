"""What running the measured allocation's loss passes on the kept width saves (`pruning.allocation.kept_loss`).

A step of `allocation: measured` runs up to 25 loss passes over the scoring batches (one per slice and unit kind,
one per layer offered with `layers`). They used to run on the masked original, so each cost the full model however
much was gone; `kept_loss` builds one pruned copy of the step's units per step and gates that. For each member of a
finished run, its units as masks over the run's model (pretrained weights, eager attention as the pruning loop
uses: timing does not depend on the weights), this script times one pass both ways on the loop's scoring batches
(`prune.score_examples`, `prune.score_batch_size`, length-grouped), alternated `--repeats` times after a warm-up,
and the copy's build once per repeat; it checks that both ways give the same loss. Medians are printed per member
with the per-step estimate (passes x pass, plus the build).

Usage (machine to itself):
    .venv/bin/python benchmarks/allocation_passes.py --run runs/mpnet_rt_family --else-running "nothing"
  → prints a line per member and writes benchmarks/results/allocation_passes.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from family import write_result  # noqa: E402
from kept_training import masks_of, timing_row  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor.core.outdir import RESOLVED_FILE  # noqa: E402
from compressor.pruning.allocation import kept_loss, masked_loss  # noqa: E402
from compressor.pruning.units import Masks  # noqa: E402
from compressor.recipe import Recipe, load_recipe  # noqa: E402
from compressor.report.schema import RunReport  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import sample_batches, tokenize  # noqa: E402
from compressor.surgery.arch import num_layers  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "allocation_passes.json"


def passes_per_step(units: list[str], layers: int, parts: int) -> int:
    """The loss passes of one measured-allocation step, as `recovery.loop._select` counts them."""
    kinds = len([u for u in units if u != "layers"])
    with_layers = "layers" in units
    return 1 + parts * (kinds + with_layers) + (layers if with_layers else 0)


def measure(model: torch.nn.Module, batches: list[dict], masks: Masks, repeats: int) -> dict:
    """Median seconds of one loss pass on the masked original and on the kept copy, and of building the copy."""
    seconds: dict[str, list[float]] = {"masked original": [], "kept copy": [], "build copy": []}
    losses = {}
    for round_ in range(repeats + 1):
        started = time.perf_counter()
        losses["masked"] = masked_loss(model, batches, masks)
        built = time.perf_counter()
        loss = kept_loss(model, batches, masks)
        passed = time.perf_counter()
        losses["kept"] = loss(masks)
        done = time.perf_counter()
        if round_:  # the first round warms up
            seconds["masked original"].append(built - started)
            seconds["build copy"].append(passed - built)
            seconds["kept copy"].append(done - passed)
    if abs(losses["masked"] - losses["kept"]) > 1e-4:
        raise RuntimeError(f"the kept copy's loss {losses['kept']} differs from the masked one {losses['masked']}")
    return timing_row(seconds, masks, "pass_speedup", ("masked original", "kept copy"), digits=3)


def allocation_setup(run: Path) -> tuple[Recipe, torch.nn.Module, list[dict]]:
    """A finished run's recipe, its model (pretrained weights, eager attention as the pruning loop uses) and the
    batches the loop's allocation passes read: its scoring batches, the first `allocation_examples` worth
    (`recovery.loop._allocation_batches`)."""
    recipe = load_recipe(run / RESOLVED_FILE)
    p = recipe.prune
    task, tokenizer = load_task_data(recipe.data), load_tokenizer(recipe.model)
    model = load_model(recipe.model, task.label_names, attention="eager").eval()
    train_ds = tokenize(task.train, tokenizer, task.text_fields, recipe.data.max_length)
    batches = sample_batches(train_ds, tokenizer, p.scoring_examples, p.score_batch_size, recipe.seed, by_length=True)
    if p.allocation_examples is not None:
        batches = batches[: max(1, -(-p.allocation_examples // p.score_batch_size))]
    return recipe, model, batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished run directory")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--else-running", required=True, help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    recipe, model, batches = allocation_setup(args.run)
    p = recipe.prune
    passes = passes_per_step(list(p.units), num_layers(model), p.allocation_parts)
    rows = {}
    for member, model_dir in RunReport.read(args.run / "report.json").member_models(args.run):
        row = rows[member.label] = measure(model, batches, masks_of(model, model_dir, list(p.units)), args.repeats)
        s = row["seconds"]
        row["step_estimate_s"] = {
            "masked original": round(passes * s["masked original"], 1),
            "kept copy": round(passes * s["kept copy"] + s["build copy"], 1),
        }
        print(f"{member.label:>7}: heads {row['heads_left']}, neurons {row['neurons_left']}: one pass masked "
              f"{s['masked original']} s, kept copy {s['kept copy']} s ({row['pass_speedup']}x; build "
              f"{s['build copy']} s); a step's {passes} passes: {row['step_estimate_s']['masked original']} s vs "
              f"{row['step_estimate_s']['kept copy']} s", flush=True)  # fmt: skip
    out = {
        "what": "one measured-allocation loss pass per member's units: masked original vs kept copy (kept_loss)",
        "run": args.run.name,
        **measured_on(args.else_running),
        "model": recipe.model.source,
        "pass_examples": sum(len(b["labels"]) for b in batches),
        "batch_size": p.score_batch_size,
        "passes_per_step": passes,
        "threads": torch.get_num_threads(),
        "members": rows,
    }
    write_result(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
