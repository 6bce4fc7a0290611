"""What the deepest member's last fine-tune could buy: variants of `prune.member_finetune` on one finished step.

A family run checkpoints every step (`state/step_NNN`); the step that closes a member holds that member's weights
and masks before its last fine-tune. This script loads that checkpoint, runs the run's own last fine-tune
(`train_kept`, the run's teacher targets, its precision) under each variant (lr, epochs, hidden-state distillation
weight), and reports validation and test accuracy, with the test McNemar p against the run's reference (MiniLM-L6,
its saved model). Choose on validation; test is reported, not chosen on.

Usage (machine to itself):
    .venv/bin/python benchmarks/member_finetune.py --run runs/mpnet_rt_family --step 7 \
        --variants base lr=1e-4 epochs=2 --else-running "nothing"
  → prints a line per variant and writes benchmarks/results/member_finetune.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from family import write_result  # noqa: E402
from mpnet_family import commit  # noqa: E402

from compressor.bench.quality import mcnemar_exact  # noqa: E402
from compressor.core.machine import cpu_summary  # noqa: E402
from compressor.pipeline.runner import make_accelerator, native_precision  # noqa: E402
from compressor.pruning.units import Masks  # noqa: E402
from compressor.recipe import parse_recipe  # noqa: E402
from compressor.recovery.distill import load_or_compute  # noqa: E402
from compressor.recovery.draws import member_seed  # noqa: E402
from compressor.recovery.evaluate import predict  # noqa: E402
from compressor.recovery.train import train_kept  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import tokenize_splits  # noqa: E402
from compressor.surgery.checkpoint import load_pruned  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "member_finetune.json"


def parse_variant(text: str) -> dict:
    """`base` (the recipe's own), or `key=value[,key=value]` over lr, epochs, max_examples, hidden_weight, alpha."""
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


def correct(model: torch.nn.Module, split, tokenizer, masks: Masks | None = None) -> torch.Tensor:
    """Per example of `split`: whether the model (or the units `masks` keep) predicts its label."""
    net = masks.pruned_copy(model) if masks is not None else model
    logits, labels = predict(net.eval(), split, tokenizer)
    return (logits.argmax(-1) == labels).numpy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished family run directory")
    parser.add_argument("--step", type=int, required=True, help="the checkpointed step that closes the member")
    parser.add_argument("--member-index", type=int, default=-1, help="the member's index (its seed); -1: the last")
    parser.add_argument("--variants", nargs="+", default=["base"])
    parser.add_argument("--base-model", type=Path, help="the task-tuned original (hidden-state distillation)")
    parser.add_argument("--else-running", required=True, help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    recipe = parse_recipe(yaml.safe_load((args.run / "recipe.resolved.yaml").read_text()))
    p = recipe.prune
    index = len(p.resolved_budget.targets) - 1 if args.member_index < 0 else args.member_index
    task, tokenizer = load_task_data(recipe.data), load_tokenizer(recipe.model)
    splits = tokenize_splits(task, tokenizer, recipe.data.max_length)
    asked = recipe.accelerate.mixed_precision
    precision = native_precision()[0] if asked == "auto" else asked
    accelerator = make_accelerator(precision)
    step_dir = args.run / "state" / f"step_{args.step:03d}"
    model = load_model(recipe.model, task.label_names, attention="eager")
    model.load_state_dict(load_file(str(step_dir / "model.safetensors")))
    masks = step_masks(step_dir)
    ref_dir = next((args.run / "references").iterdir()) / "model"
    ref_tokenizer = AutoTokenizer.from_pretrained(ref_dir)  # a reference is tokenised on its own
    ref_test = tokenize_splits(task, ref_tokenizer, recipe.data.max_length)["test"]
    reference = correct(load_pruned(ref_dir), ref_test, ref_tokenizer)
    teacher_model = load_pruned(args.base_model, attn_implementation="eager") if args.base_model else None
    rows = []
    for text in args.variants:
        change = parse_variant(text)
        spec = p.member_finetune.model_copy(update={k: change[k] for k in ("lr", "epochs") if k in change})
        if "max_examples" in change:  # a quick check of the script itself
            spec = spec.model_copy(update={"max_examples": int(change["max_examples"])})
        distill = p.recovery_finetune.distill.model_copy(
            update={k: change[k] for k in ("hidden_weight", "alpha") if k in change}
        )
        if distill.hidden_weight > 0 and teacher_model is None:
            raise SystemExit("--base-model: hidden_weight > 0 needs the task-tuned original")
        teacher = load_or_compute(args.run / "state" / "teacher", teacher_model or model, splits["train"], tokenizer,
                                  accelerator, distill)  # fmt: skip
        student = copy.deepcopy(model)
        started = time.perf_counter()
        seed = member_seed(recipe.seed, index)
        info = train_kept(student, masks, splits["train"], tokenizer, spec, accelerator, seed=seed,
                          desc=f"member fine-tune {text}", teacher=teacher)  # fmt: skip
        seconds = time.perf_counter() - started
        student = accelerator.unwrap_model(student).cpu().eval()
        val = correct(student, splits["validation"], tokenizer, masks)
        test = correct(student, splits["test"], tokenizer, masks)
        row = {"variant": text, "change": change, "seconds": round(seconds, 1), "train_loss": info["train_loss"],
               "val_accuracy": float(val.mean()), "test_accuracy": float(test.mean()),
               "test_minus_reference_points": round(100 * float(test.mean() - reference.mean()), 2),
               "p_vs_reference": mcnemar_exact(test, reference)["p_value"]}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {
        "what": "variants of the last member's final fine-tune from its step's checkpoint",
        "run": str(args.run), "step": args.step, "commit": commit(), "precision": precision,
        "reference_test_accuracy": float(reference.mean()), "heads_left": int(masks.heads.sum()),
        "neurons_left": None if masks.neurons is None else int(masks.neurons.sum()),
        "cpu": cpu_summary(), "threads": torch.get_num_threads(), "else_running": args.else_running, "rows": rows,
    }  # fmt: skip
    write_result(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
