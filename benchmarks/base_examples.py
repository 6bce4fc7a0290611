"""How much the original gains from a base fine-tune on more of the train split: the recipe's `base_finetune` run
with each `--max-examples` (a number, or `all`), in the run's precision, the same seed, and the model's validation and
test accuracy.

A family recipe caps its base fine-tune to save time (`mpnet_rt_family.yaml`: 3,000 of 10,201 examples). The
original is then both the baseline every member is compared with and the teacher every member (and a distilled
reference) learns from; if the cap leaves it under-trained, a member "ahead of the original" is partly ahead of the
cap, and the teacher is weaker than a user's would be. Run it with the machine to yourself.

Usage:
    .venv/bin/python benchmarks/base_examples.py --recipe recipes/mpnet_rt_family.yaml --max-examples 3000 all \
        --else-running "nothing" → benchmarks/results/base_examples.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from accelerate.utils import set_seed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor.pipeline.runner import make_accelerator  # noqa: E402
from compressor.recipe import load_recipe  # noqa: E402
from compressor.recovery.evaluate import evaluate  # noqa: E402
from compressor.recovery.train import train  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import tokenize_splits  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "base_examples.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, required=True)
    parser.add_argument("--max-examples", nargs="+", default=["all"], help="examples per epoch: numbers or 'all'")
    parser.add_argument("--save", type=Path, help="save the last cap's fine-tuned model there (a teacher to try)")
    parser.add_argument("--else-running", default="not stated", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    accelerator = make_accelerator(recipe.accelerate.mixed_precision)  # "auto" resolved there
    task, tokenizer = load_task_data(recipe.data), load_tokenizer(recipe.model)
    splits = tokenize_splits(task, tokenizer, recipe.data.max_length)
    rows = []
    for cap in args.max_examples:
        examples = None if cap == "all" else int(cap)
        spec = recipe.base_finetune.model_copy(update={"max_examples": examples})
        set_seed(recipe.seed)
        model = load_model(recipe.model, task.label_names)
        started = time.perf_counter()
        train(model, splits["train"], tokenizer, spec, accelerator, seed=recipe.seed, desc=f"base ({cap})")
        seconds = time.perf_counter() - started
        model = accelerator.unwrap_model(model).cpu()
        if args.save and cap == args.max_examples[-1]:
            model.save_pretrained(args.save)
            tokenizer.save_pretrained(args.save)
        acc = {name: evaluate(model, splits[name], tokenizer)["accuracy"] for name in ("validation", "test")}
        rows.append({"max_examples": cap, "seconds": round(seconds, 1), **acc})
        print(rows[-1], flush=True)
        write_result({
            "figure": "the original's accuracy after the recipe's base fine-tune on each number of examples",
            "recipe": args.recipe.name, "seed": recipe.seed, "precision": accelerator.mixed_precision,
            **measured_on(args.else_running), "train_examples": len(splits["train"]), "rows": rows,
        }, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
