"""Pruning curves without fine-tuning: accuracy vs fraction of heads removed, one curve per criterion.

On the default task (fine-tuned MiniLM-L6 on Rotten Tomatoes, `.cache/finetuned/minilm-rt`): remove 10% of all
heads at a time (0 → 90%), re-scoring the surviving heads at every step (heads are gated off, not cut out), and
measure validation accuracy after each step. `random` is averaged over several seeds. Also records each
criterion's scoring cost in seconds per 100 scoring examples (wall time on a shared CPU: noisy).

    .venv/bin/python benchmarks/criteria.py                      # every criterion, ~15 min on 1 CPU thread
    .venv/bin/python benchmarks/criteria.py --criteria taylor random --eval-examples 200
    .venv/bin/python benchmarks/criteria.py --criteria attribution:steps=10   # a variant, stored under that name

Writes benchmarks/results/criteria.json (merged per criterion, so runs can be split) and criteria.png. A run whose
settings (model, eval/score/train examples, max length, threads) differ from those of the results already in the
file refuses to merge into it (use another --out, or --fresh to start the file over).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import compressor  # noqa: E402
from compressor.recipe import DataSpec, PruneSpec  # noqa: E402
from compressor.recovery.evaluate import evaluate
from compressor.recovery.loop import TRAIN_SCORE_EXAMPLES  # noqa: E402
from compressor.sources import load_task_data  # noqa: E402
from compressor.sources.batches import tokenize  # noqa: E402
from compressor.surgery.checkpoint import load_pruned  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FRACTIONS = [round(0.1 * k, 1) for k in range(10)]
# Per-criterion settings for the curve: the recipe defaults, except where a default would blow the time budget.
SETTINGS: dict[str, dict] = {
    "taylor": {},
    "attribution": {"examples": 16, "batch_size": 4},
    "confidence": {},
    "entropy": {},
    "magnitude": {},
    "ablation": {"examples": 32},
    "l0": {"steps": 150},
    "random": {},
}


SCORE_BATCH = 32


def portable(path: Path) -> str:
    """`path` relative to the repository when inside it: results must not name a path of the machine."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path.name


def parse_value(value: str) -> bool | int | float | str:
    """An override's value: true/false → bool, then int, then float, else the string itself."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse_spec(spec: str) -> tuple[str, dict]:
    """`name` or `name:key=value,...` → (criterion name, its benchmark settings with the overrides applied)."""
    name, _, overrides = spec.partition(":")
    if name not in SETTINGS:
        raise SystemExit(f"--criteria: unknown criterion {name!r}; expected one of {', '.join(SETTINGS)}")
    params = dict(SETTINGS[name])
    for item in filter(None, overrides.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--criteria: {item!r} in {spec!r} is not key=value")
        params[key] = parse_value(value)
    return name, params


def examples_used(name: str, params: dict, score_examples: int, train_batch: int) -> int:
    """How many examples one scoring call processes (for cost per 100 examples)."""
    if name == "attribution":
        return min(params.get("examples", 200), score_examples)
    if name == "ablation":
        return min(params.get("examples", 128), score_examples)
    if name == "l0":
        return params.get("steps", 300) * train_batch
    return score_examples


def curve(model, name: str, params: dict, data: dict, seed: int = 0) -> dict:
    """Accuracy after removing each 10% of heads (scores recomputed each step, heads gated, no fine-tuning), plus
    scoring seconds per step: `compressor.prune` with one step per 10% and the validation sample as its check."""
    spec = PruneSpec(
        criterion={"name": name, "params": params},
        target=FRACTIONS[-1],
        steps=len(FRACTIONS) - 1,
        finetune=None,
        score_examples=data["score_examples"],
        score_batch_size=SCORE_BATCH,
    )
    result = compressor.prune(model, data["tokenizer"], data["train"], spec, validation=data["eval"], seed=seed)
    accs = [data["base_accuracy"]] + [s["val_after_prune"]["accuracy"] for s in result.steps]
    seconds = [s["score_seconds"] for s in result.steps]
    for fraction, acc, secs in zip(FRACTIONS[1:], accs[1:], seconds, strict=True):
        print(f"  {name:11s} seed {seed} removed {fraction:.0%}: acc {acc:.4f} ({secs:.1f}s)", flush=True)
    return {"accuracy": accs, "score_seconds": seconds}


# Run settings that shape every curve and cost figure: results from runs that differ in any of them do not belong
# in one file (one plot, one y-axis label, costs relative to taylor).
RUN_SETTINGS = ("model", "eval_examples", "score_examples", "train_examples", "train_batch", "max_length", "threads")


def merge_previous(previous: dict, settings: dict) -> dict:
    """The criteria entries of an earlier results file to merge this run's into; ValueError naming every setting
    that differs (a setting an older file did not record is not checked)."""
    if not previous.get("criteria"):
        return {}
    differ = [
        f"{key} {previous[key]!r} there, {settings[key]!r} now"
        for key in RUN_SETTINGS
        if key in previous and key in settings and previous[key] != settings[key]
    ]
    if differ:
        raise ValueError(
            f"refusing to merge into results made with other settings ({'; '.join(differ)}): "
            "use the same settings, another --out, or --fresh to start the file over"
        )
    return dict(previous["criteria"])


def load(args: argparse.Namespace) -> tuple[torch.nn.Module, dict]:
    model = load_pruned(args.model, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    task = load_task_data(DataSpec())
    fields = task.text_fields
    validation = task.validation.shuffle(seed=0).select(range(min(args.eval_examples, len(task.validation))))
    eval_ds = tokenize(validation, tokenizer, fields, args.max_length)
    data = {
        "tokenizer": tokenizer,
        "eval": eval_ds,
        "train": tokenize(task.train, tokenizer, fields, args.max_length),
        "score_examples": args.score_examples,
        "base_accuracy": evaluate(model, eval_ds, tokenizer)["accuracy"],
    }
    return model, data


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, entry in sorted(results["criteria"].items()):
        style = {"linestyle": "--", "color": "black"} if name == "random" else {"marker": "o", "markersize": 3}
        ax.plot([100 * f for f in FRACTIONS], entry["accuracy"], label=name, **style)
    ax.axhline(results["majority_class"], color="grey", linewidth=0.8, linestyle=":", label="majority class")
    ax.set_xlabel("% of heads removed (no fine-tuning, scores recomputed every 10%)")
    ax.set_ylabel(f"validation accuracy ({results['eval_examples']} examples)")
    ax.set_title("MiniLM-L6 on Rotten Tomatoes: head-pruning curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / ".cache" / "finetuned" / "minilm-rt"))
    parser.add_argument("--criteria", nargs="*", default=list(SETTINGS))
    parser.add_argument("--random-seeds", type=int, default=3)
    parser.add_argument("--eval-examples", type=int, default=400)
    parser.add_argument("--score-examples", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS / "criteria.json"))
    parser.add_argument("--fresh", action="store_true", help="discard the results already in --out instead of merging")
    args = parser.parse_args(argv)
    if not Path(args.model).exists():
        print(f"--model: {args.model} does not exist; expected the fine-tuned MiniLM directory", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = Path(args.out)
    model, data = load(args)
    labels = torch.tensor(data["eval"]["labels"])
    previous = json.loads(out.read_text()) if out.exists() and not args.fresh else {}
    settings = {
        "model": portable(Path(args.model)),
        "eval_examples": int(labels.numel()),
        "score_examples": args.score_examples,
        "train_examples": TRAIN_SCORE_EXAMPLES,  # the pool a learning criterion (l0) draws from per step
        "train_batch": SCORE_BATCH,
        "max_length": args.max_length,
        "threads": args.threads,
    }
    try:
        merged = merge_previous(previous, settings)
    except ValueError as exc:
        print(f"{out}: {exc}", file=sys.stderr)
        return 2
    results = {
        **settings,
        "fractions": FRACTIONS,
        "majority_class": float(labels.bincount().max() / labels.numel()),
        "criteria": merged,
    }
    for spec in args.criteria:
        name, params = parse_spec(spec)
        seeds = range(args.random_seeds) if name == "random" else [0]
        runs = [curve(model, name, params, data, seed) for seed in seeds]
        per_step = [s for run in runs for s in run["score_seconds"]]
        used = examples_used(name, params, args.score_examples, SCORE_BATCH)
        entry = {
            "params": params,
            "accuracy": [statistics.mean(r["accuracy"][i] for r in runs) for i in range(len(FRACTIONS))],
            "seconds_per_100_examples": round(100 * statistics.mean(per_step) / used, 4),
            "examples_per_scoring": used,
            "score_seconds": [round(s, 3) for s in per_step],
        }
        if len(runs) > 1:
            entry["runs"] = [r["accuracy"] for r in runs]
            entry["accuracy_std"] = [statistics.stdev(r["accuracy"][i] for r in runs) for i in range(len(FRACTIONS))]
        results["criteria"][spec] = entry
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
        print(f"{name}: {[round(a, 3) for a in entry['accuracy']]}  cost {entry['seconds_per_100_examples']}s/100")
    plot(results, out.with_suffix(".png"))
    taylor_cost = results["criteria"].get("taylor", {}).get("seconds_per_100_examples")
    summary = {
        n: {
            "50%": e["accuracy"][5],
            "70%": e["accuracy"][7],
            "cost_vs_taylor": round(e["seconds_per_100_examples"] / taylor_cost, 1) if taylor_cost else None,
        }
        for n, e in results["criteria"].items()
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
