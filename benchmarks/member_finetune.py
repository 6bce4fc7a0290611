"""What the deepest member's last fine-tune could buy: variants of `prune.member_finetune` on one finished step.

A family run checkpoints every step (`state/step_NNN`); the step that closes a member holds that member's weights
and masks before its last fine-tune. This script loads that checkpoint, runs the run's own last fine-tune
(`train_kept`, the run's teacher targets, its precision) under each variant (lr, epochs, hidden-state distillation
weight), and reports validation and test accuracy, with the test McNemar p against the run's reference (MiniLM-L6,
its saved model). Choose on validation; test is reported, not chosen on.

One run moves a member by a few test examples (bf16 fine-tunes are not bit-reproducible, and the seed decides the
order and dropout), so `seed=K` in a variant shifts the member's seed by K, and `--reference-variants` fine-tunes the
run's reference itself afresh (its `bench.reference_finetune` settings, changed by the same `key=value` syntax over
lr, epochs, seed, and distill=1: learn from the run's teacher targets as the members do). The summary gives, per
setting of each side, the mean and spread over its seeds, and every member/reference pair's test gap, so a claim of
"ahead by a point" can be read against the spread of the two fine-tunes.

Usage (machine to itself):
    .venv/bin/python benchmarks/member_finetune.py --run runs/mpnet_rt_family --step 7 \
        --variants base lr=1e-4 epochs=2 --else-running "nothing"
    .venv/bin/python benchmarks/member_finetune.py --run runs/mpnet_rt_family --step 7 --variants seed=1 seed=2 \
        --reference-variants seed=1 seed=2 epochs=2,seed=1 --else-running "nothing" --out .../seed_gap.json
  → prints a line per variant and writes benchmarks/results/member_finetune.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import set_seed
from safetensors.torch import load_file
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor.bench.quality import mcnemar_exact  # noqa: E402
from compressor.core.outdir import RESOLVED_FILE  # noqa: E402
from compressor.pipeline.runner import make_accelerator  # noqa: E402
from compressor.pruning.units import Masks  # noqa: E402
from compressor.recipe import ModelSpec, Recipe, load_recipe  # noqa: E402
from compressor.recovery.distill import load_or_compute  # noqa: E402
from compressor.recovery.draws import member_seed  # noqa: E402
from compressor.recovery.evaluate import predict  # noqa: E402
from compressor.recovery.train import train, train_kept  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import tokenize_splits  # noqa: E402
from compressor.surgery.checkpoint import load_pruned  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "member_finetune.json"


def parse_variant(text: str) -> dict:
    """`base` (the recipe's own), or `key=value[,key=value]` over lr, epochs, max_examples, hidden_weight, alpha,
    seed (an offset to the run's seed), distill (1: a reference learns from the run's teacher targets)."""
    if text == "base":
        return {}
    out = {}
    for part in text.split(","):
        key, value = part.split("=")
        out[key] = float(value)
    return out


def step_masks(step_dir: Path) -> Masks:
    """The masks the checkpointed step left (heads from its records, neurons when the run prunes them)."""
    records = load_file(str(step_dir / "records.safetensors"))
    neurons = records["neurons"][-1] if "neurons" in records else None
    return Masks(records["heads"][-1].bool(), None if neurons is None else neurons.bool())


def step_model(recipe: Recipe, labels: list[str], step_dir: Path) -> tuple[torch.nn.Module, Masks]:
    """The run's model with a checkpointed step's weights (eager attention, every slot still present) and that
    step's masks."""
    model = load_model(recipe.model, labels, attention="eager")
    model.load_state_dict(load_file(str(step_dir / "model.safetensors")))
    return model, step_masks(step_dir)


def correct(model: torch.nn.Module, split, tokenizer, masks: Masks | None = None) -> torch.Tensor:
    """Per example of `split`: whether the model (or the units `masks` keep) predicts its label."""
    net = masks.pruned_copy(model) if masks is not None else model
    logits, labels = predict(net.eval(), split, tokenizer)
    return (logits.argmax(-1) == labels).numpy()


def train_spec(spec, change: dict):
    """`spec` with the variant's lr, epochs and max_examples (a quick check of the script itself) applied."""
    update = {k: change[k] for k in ("lr", "epochs") if k in change}
    if "max_examples" in change:
        update["max_examples"] = int(change["max_examples"])
    return spec.model_copy(update=update)


def scored(text: str, change: dict, info: dict, seconds: float, val, test, reference) -> dict:
    """One variant's row: its accuracies and its test gap (points, McNemar p) to the run's saved reference."""
    row = {"variant": text, "change": change, "seconds": round(seconds, 1), "train_loss": info["train_loss"],
           "val_accuracy": float(val.mean()), "test_accuracy": float(test.mean()),
           "test_minus_reference_points": round(100 * float(test.mean() - reference.mean()), 2),
           "p_vs_reference": mcnemar_exact(test, reference)["p_value"]}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def reference_rows(args, recipe, task, accelerator, reference, teacher) -> tuple[list[dict], list]:
    """The run's reference fine-tuned afresh under each of `--reference-variants` (its own tokenizer, the recipe's
    `bench.reference_finetune`, seed = the run's + the variant's `seed`); with `distill=1`, distilled from the run's
    teacher targets as the members are (logits per train example: any tokenizer reads the same examples in the same
    order), the alternative of distilling the original into the small model. Its rows and per-example test hits."""
    spec = ModelSpec(source=recipe.bench.references[0])
    tokenizer = load_tokenizer(spec)
    splits = tokenize_splits(task, tokenizer, recipe.data.max_length)
    rows, hits = [], []
    for text in args.reference_variants:
        change = parse_variant(text)
        seed = recipe.seed + int(change.get("seed", 0))
        set_seed(seed)
        model = load_model(spec, task.label_names, attention="eager")
        started = time.perf_counter()
        settings = train_spec(recipe.bench.reference_finetune or recipe.base_finetune, change)
        info = train(model, splits["train"], tokenizer, settings, accelerator, seed=seed, desc=f"reference {text}",
                     teacher=teacher if change.get("distill") else None)  # fmt: skip
        model = accelerator.unwrap_model(model).cpu().eval()
        val, test = (correct(model, splits[name], tokenizer) for name in ("validation", "test"))
        rows.append(scored(f"reference {text}", change, info, time.perf_counter() - started, val, test, reference))
        hits.append(test)
    return rows, hits


def setting(change: dict) -> str:
    """A variant's settings without its seed: the rows one mean and spread are taken over."""
    return ",".join(f"{k}={v:g}" for k, v in sorted(change.items()) if k != "seed") or "base"


def spread(rows: list[dict], member_hits: list, ref_rows: list[dict], reference_hits: list) -> dict:
    """Per setting of each side (its variants' settings without the seed): the mean and standard deviation of
    validation and test accuracy (points) over its seeds; and every member/reference pair's test gap (points,
    McNemar p): what one draw of each is worth against the other."""
    groups: dict[str, list[dict]] = {}
    for side, side_rows in (("member", rows), ("reference", ref_rows)):
        for row in side_rows:
            groups.setdefault(f"{side} {setting(row['change'])}", []).append(row)
    out: dict = {"settings": {}}
    for name, group in groups.items():
        stats = {"seeds": len(group)}
        for split in ("val", "test"):
            values = [100 * r[f"{split}_accuracy"] for r in group]
            stats[f"{split}_mean"] = round(float(np.mean(values)), 2)
            stats[f"{split}_sd"] = round(float(np.std(values, ddof=1)), 2) if len(values) > 1 else 0.0
        out["settings"][name] = stats
    pairs = [{"member": i, "reference": j, "gap_points": round(100 * float(m.mean() - r.mean()), 2),
              "p": mcnemar_exact(m, r)["p_value"]}
             for i, m in enumerate(member_hits) for j, r in enumerate(reference_hits)]  # fmt: skip
    return out | ({"pairs": pairs} if pairs else {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished family run directory")
    parser.add_argument("--step", type=int, required=True, help="the checkpointed step that closes the member")
    parser.add_argument("--member-index", type=int, default=-1, help="the member's index (its seed); -1: the last")
    parser.add_argument("--variants", nargs="*", default=["base"], help="member variants (none: references only)")
    parser.add_argument("--reference-variants", nargs="*", default=[], help="fine-tune the run's reference afresh")
    parser.add_argument("--base-model", type=Path, help="the task-tuned original (hidden-state distillation)")
    parser.add_argument("--else-running", required=True, help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    recipe = load_recipe(args.run / RESOLVED_FILE)
    p = recipe.prune
    index = len(p.resolved_budget.targets) - 1 if args.member_index < 0 else args.member_index
    task, tokenizer = load_task_data(recipe.data), load_tokenizer(recipe.model)
    splits = tokenize_splits(task, tokenizer, recipe.data.max_length)
    accelerator = make_accelerator(recipe.accelerate.mixed_precision)  # "auto" resolved there
    precision = accelerator.mixed_precision
    model, masks = step_model(recipe, task.label_names, args.run / "state" / f"step_{args.step:03d}")
    ref_dir = next((args.run / "references").iterdir()) / "model"
    ref_tokenizer = AutoTokenizer.from_pretrained(ref_dir)  # a reference is tokenised on its own
    ref_test = tokenize_splits(task, ref_tokenizer, recipe.data.max_length)["test"]
    reference = correct(load_pruned(ref_dir), ref_test, ref_tokenizer)
    teacher_model = load_pruned(args.base_model, attn_implementation="eager") if args.base_model else None
    rows, member_hits = [], []
    for text in args.variants:
        change = parse_variant(text)
        spec = train_spec(p.member_spec(index), change)  # the member's own epochs (`prune.member_epochs`)
        distill = p.recovery_finetune.distill.model_copy(
            update={k: change[k] for k in ("hidden_weight", "alpha") if k in change}
        )
        if distill.hidden_weight > 0 and teacher_model is None:
            raise SystemExit("--base-model: hidden_weight > 0 needs the task-tuned original")
        teacher = load_or_compute(args.run / "state" / "teacher", teacher_model or model, splits["train"], tokenizer,
                                  accelerator, distill)  # fmt: skip
        student = copy.deepcopy(model)
        started = time.perf_counter()
        seed = member_seed(recipe.seed + int(change.get("seed", 0)), index)
        info = train_kept(student, masks, splits["train"], tokenizer, spec, accelerator, seed=seed,
                          desc=f"member fine-tune {text}", teacher=teacher)  # fmt: skip
        seconds = time.perf_counter() - started
        student = accelerator.unwrap_model(student).cpu().eval()
        val = correct(student, splits["validation"], tokenizer, masks)
        test = correct(student, splits["test"], tokenizer, masks)
        rows.append(scored(text, change, info, seconds, val, test, reference))
        member_hits.append(test)
    teacher = None
    if any(parse_variant(text).get("distill") for text in args.reference_variants):
        teacher = load_or_compute(args.run / "state" / "teacher", teacher_model or model, splits["train"], tokenizer,
                                  accelerator, p.recovery_finetune.distill)  # fmt: skip
    ref_rows, ref_hits = reference_rows(args, recipe, task, accelerator, reference, teacher)
    out = {
        "what": "variants of the last member's final fine-tune from its step's checkpoint, and of its reference's",
        "run": str(args.run), "step": args.step, **measured_on(args.else_running), "precision": precision,
        "reference_test_accuracy": float(reference.mean()), "heads_left": int(masks.heads.sum()),
        "neurons_left": None if masks.neurons is None else int(masks.neurons.sum()),
        "threads": torch.get_num_threads(),
        "rows": rows, "reference_rows": ref_rows, "spread": spread(rows, member_hits, ref_rows, ref_hits),
    }  # fmt: skip
    write_result(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
