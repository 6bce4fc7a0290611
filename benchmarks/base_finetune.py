"""Length-grouped batches in the base fine-tune: wall time and accuracy of the task-tuned original, over seeds.

The demo's base fine-tune (recipe `base_finetune`, the default built-ins) is run with `group_by_length` on and off
for each seed, and the fine-tuned model is evaluated on the validation and test splits. Grouping cuts the padded
tokens (~1.9x fewer on Rotten Tomatoes); this says what it costs in accuracy, as paired differences per seed.
Run it with the machine to yourself. No cache is read or written.
Usage: python benchmarks/base_finetune.py [--recipe R] [--seeds 0 1 2]  → benchmarks/results/base_finetune.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402

from compressor.core.machine import cpu_summary  # noqa: E402
from compressor.recipe import load_recipe  # noqa: E402
from compressor.recovery.evaluate import evaluate  # noqa: E402
from compressor.recovery.train import train  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import tokenize  # noqa: E402


def one_run(recipe, splits: dict, tokenizer, labels: list[str], seed: int, grouped: bool) -> dict:
    """Fine-tune the recipe's base model once; its time and validation/test accuracy."""
    set_seed(seed)
    model = load_model(recipe.model, labels, attention="eager")
    spec = recipe.base_finetune.model_copy(update={"group_by_length": grouped})
    accelerator = Accelerator()
    start = time.perf_counter()
    train(model, splits["train"], tokenizer, spec, accelerator, seed=seed, desc="base")
    seconds = time.perf_counter() - start
    acc = {name: evaluate(model, splits[name], tokenizer)["accuracy"] for name in ("validation", "test")}
    return {"seed": seed, "group_by_length": grouped, "seconds": round(seconds, 1), **acc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "minilm_rt_50pct.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    data, tokenizer = load_task_data(recipe.data), load_tokenizer(recipe.model)
    splits = {n: tokenize(getattr(data, n), tokenizer, data.text_fields, recipe.data.max_length) for n in
              ("train", "validation", "test")}  # fmt: skip
    runs = []
    for seed in args.seeds:
        for grouped in (True, False):
            runs.append(one_run(recipe, splits, tokenizer, data.label_names, seed, grouped))
            print(json.dumps(runs[-1]), flush=True)
    paired = {}
    for key in ("seconds", "validation", "test"):
        diffs = [g[key] - r[key] for g, r in zip(runs[::2], runs[1::2], strict=True)]
        paired[key] = {"mean": statistics.mean(diffs), "sd": statistics.stdev(diffs) if len(diffs) > 1 else None}
    result = {"recipe": Path(args.recipe).name, "cpu": cpu_summary(), "runs": runs, "grouped_minus_random": paired}
    print(json.dumps(paired, indent=2))
    out = ROOT / "benchmarks" / "results" / "base_finetune.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
