"""Head roles of the fine-tuned MiniLM-L6 on Rotten Tomatoes, and which roles survive taylor pruning.

    .venv/bin/python benchmarks/analysis.py [--model DIR] [--examples 256] [--out benchmarks/results/analysis]

1. `analyze_heads` on `--examples` test sentences (roles, relation table, sieve tests, JS clustering).
2. Michel's iterative pruning with the `taylor` criterion and head gates only (no fine-tuning): remove 9 heads
   (12.5%) per step, rescoring on the gated model each time, up to 75% removed; validation accuracy of the gated
   model after each step.
3. Per step, the share of role-carrying heads among the kept vs the removed heads (Voita Fig. 8).
Writes analysis.json/md + PNGs and summary.json into `--out`, and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / ".cache" / "finetuned" / "minilm-rt"
ROLES = ("positional", "rare_word", "syntactic", "delimiter", "any")


def load(model_dir: Path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from compressor.surgery.checkpoint import PLAN_FILE, load_pruned

    if (model_dir / PLAN_FILE).exists():
        model = load_pruned(model_dir, attn_implementation="eager")
    else:
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager")
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


def prune_iteratively(model, tokenizer, task, score_examples: int, per_step: int, steps: int, eval_n: int):
    """Taylor scores → remove `per_step` lowest → rescore on the gated model (`compressor.prune`, no fine-tuning);
    returns (first scores, step log)."""
    import compressor
    from compressor.recipe import PruneSpec
    from compressor.recovery.evaluate import evaluate
    from compressor.sources.batches import tokenize

    train = tokenize(task.train, tokenizer, task.text_fields, 128)
    val = tokenize(task.validation.select(range(min(eval_n, len(task.validation)))), tokenizer, task.text_fields, 128)
    total = model.config.num_hidden_layers * model.config.num_attention_heads
    spec = PruneSpec(target=per_step * steps / total, steps=steps, finetune=None, score_examples=score_examples)
    full = torch.ones(model.config.num_hidden_layers, model.config.num_attention_heads, dtype=torch.bool)
    log = [{"removed": 0, "alive": full, "val_accuracy": evaluate(model, val, tokenizer)["accuracy"]}]
    result = compressor.prune(model, tokenizer, train, spec, validation=val, seed=0)
    for entry, masks in zip(result.steps, result.step_masks, strict=True):
        acc = entry["val_after_prune"]["accuracy"]
        log.append({"removed": int((~masks.heads).sum()), "alive": masks.heads, "val_accuracy": acc})
        print(f"  removed {log[-1]['removed']:2d} heads: val acc (gated, no fine-tune) {acc:.4f}", flush=True)
    return result.scores[0], log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--score-examples", type=int, default=256)
    parser.add_argument("--eval-examples", type=int, default=600)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "analysis")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    from compressor.analysis import analyze_heads, kept_vs_removed, write_analysis
    from compressor.recipe import DataSpec
    from compressor.sources import load_task_data

    if not (args.model / "config.json").is_file():
        raise SystemExit(f"model: '{args.model}' is not a model directory (fine-tuned MiniLM not there yet?)")
    t0 = time.perf_counter()
    model, tokenizer = load(args.model)
    task = load_task_data(DataSpec())
    total = model.config.num_hidden_layers * model.config.num_attention_heads
    per_step = total // 8  # 12.5% of the heads per step; steps 4 and 6 are 50% and 75%
    print(f"pruning {args.model.name} with taylor, {per_step} heads per step (gates only)", flush=True)
    first_scores, log = prune_iteratively(model, tokenizer, task, args.score_examples, per_step, 6, args.eval_examples)
    t1 = time.perf_counter()
    texts = task.test["text"][: args.examples]
    result = analyze_heads(model, tokenizer, texts, task.train["text"], max_length=128, scores={"taylor": first_scores})
    t2 = time.perf_counter()
    steps = []
    for entry in log[1:]:
        share = entry["removed"] / total
        steps.append(
            {"label": f"{share:.0%}", "val_accuracy": entry["val_accuracy"], **kept_vs_removed(result, entry["alive"])}
        )
    result["pruning_steps"] = steps
    paths = write_analysis(result, args.out)
    summary = {
        "model": str(args.model),
        "examples": result["examples"],
        "counts": result["counts"],
        "positional_heads": result["positional_heads"],
        "relations": [{k: v for k, v in r.items() if k != "syntactic_heads"} for r in result["relations"]],
        "val_accuracy_full": log[0]["val_accuracy"],
        "pruning": {
            s["label"]: {
                "val_accuracy": s["val_accuracy"],
                "heads_kept": s["heads_kept"],
                **{r: s["roles"][r] for r in ROLES},
            }
            for s in steps
        },
        "seconds": {
            "pruning": round(t1 - t0, 1),
            "analysis": round(t2 - t1, 1),
            "total": round(time.perf_counter() - t0, 1),
        },
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({"counts": summary["counts"], "seconds": summary["seconds"]}, indent=1))
    print("relation | dir | n | baseline | best head | acc")
    for r in result["relations"]:
        print(
            f"{r['relation']} | {r['direction']} | {r['count']} | {r['baseline']:.3f} | {r['best_head']} | "
            f"{r['best_accuracy']:.3f}"
        )
    for label in ("50%", "75%"):
        s = summary["pruning"].get(label)
        if s:
            cells = ", ".join(f"{r} {s[r]['kept_share']:.2f}/{s[r]['removed_share']:.2f}" for r in ROLES)
            print(f"{label} removed (val acc {s['val_accuracy']:.4f}) kept/removed share: {cells}")
    print("wrote", ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
