"""Would pruning the hidden size buy the deepest member speed, and at what accuracy? A probe, not a product mode.

The members keep the base model's residual width (768 for MPNet-base) while MiniLM-L6 runs at 384: however few
heads and neurons a deep member keeps, its fixed parts (LayerNorms, residual adds, the embeddings, every Q/K/V/FFN
input row) stay at full width. This script takes a family run's step checkpoint (`state/step_NNN`: weights and
masks after that step; the step that closes a member holds it before its last fine-tune), removes its dead units
(`Masks.pruned_copy`), and then cuts the residual stream to each width of `--widths`, keeping the dimensions with
the largest mean |activation| after the model's LayerNorms on training examples (one index set for every layer:
the residual stream is shared). Cut: every Embedding and LayerNorm of the hidden width, every Linear's input
columns that read the stream, and the rows of the Linears that write it (each layer's attention output and FFN
output projections, from the architecture's declaration). The LayerNorms then normalise over fewer dimensions, so
the model is retrained: the member's own last fine-tune (`prune.member_spec`, the run's teacher targets and
precision).

It reports (1) paired PyTorch speed-ups against the original at the bench's shape, for the member at full width,
each cut width, `--also-step`'s pruned model and the run's reference, in one interleaved timing; (2) for
`--train-widths` (with `--as-fast`, also the widest cut timed at least as fast as the reference), validation and
test accuracy after the fine-tune, with McNemar's p against the run's saved reference.

Usage (machine to itself):
    .venv/bin/python benchmarks/hidden_width.py --run runs/mpnet_rt_family --step 7 --widths 768 576 512 384 \
        --train-widths 576 --else-running "nothing"
  → prints the figures and writes benchmarks/results/hidden_width.json
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from family import write_result  # noqa: E402
from member_finetune import correct, scored, step_model  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor import bench  # noqa: E402
from compressor.core.outdir import RESOLVED_FILE  # noqa: E402
from compressor.pipeline.runner import make_accelerator  # noqa: E402
from compressor.recipe import load_recipe  # noqa: E402
from compressor.recovery.distill import load_or_compute  # noqa: E402
from compressor.recovery.draws import member_seed  # noqa: E402
from compressor.recovery.train import train  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import loader, model_inputs, tokenize_splits  # noqa: E402
from compressor.surgery.arch import arch_spec  # noqa: E402
from compressor.surgery.checkpoint import load_pruned  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "hidden_width.json"


def stream_importance(model: nn.Module, split, tokenizer, batches: int = 8) -> torch.Tensor:
    """Per residual dimension: the mean |output| of every LayerNorm of the hidden width, summed over them, on the
    first `batches` batches of `split`."""
    width = model.config.hidden_size
    total = torch.zeros(width)
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm) and m.normalized_shape == (width,)]

    def add(_module, _inputs, output):
        total.add_(output.detach().abs().float().reshape(-1, width).mean(0))

    hooks = [m.register_forward_hook(add) for m in norms]
    try:
        with torch.no_grad():
            for i, batch in enumerate(loader(split, tokenizer, 32, shuffle=False)):
                if i == batches:
                    break
                model(**model_inputs(batch))
    finally:
        for hook in hooks:
            hook.remove()
    return total


def _cut_linear(linear: nn.Linear, keep: torch.Tensor, rows: bool, cols: bool) -> None:
    """Keep `keep` among `linear`'s output rows (`rows`) and/or input columns (`cols`), in place."""
    weight = linear.weight.data
    if rows:
        weight = weight[keep]
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias.data[keep].clone())
        linear.out_features = len(keep)
    if cols:
        weight = weight[:, keep]
        linear.in_features = len(keep)
    linear.weight = nn.Parameter(weight.clone())


def cut_hidden(model: nn.Module, keep: torch.Tensor) -> nn.Module:
    """A copy of the (physically pruned) `model` whose residual stream keeps the dimensions `keep` (sorted): its
    embeddings and LayerNorms, the columns of every Linear reading a `width`-wide input, and the rows of the stream's
    writers. Outside the encoder layers every `width`-wide Linear is cut on both sides (the classifier's hidden)."""
    out = copy.deepcopy(model)
    width, spec = model.config.hidden_size, arch_spec(model)
    layers = out.base_model.get_submodule(spec.layers)
    writers = {id(layer.get_submodule(p)) for layer in layers for p in (spec.out_proj, spec.ffn_out) if _has(layer, p)}
    inside = {id(m) for m in layers.modules()}  # Q/K/V or an FFN may be `width` wide without being the stream
    for module in out.modules():
        if isinstance(module, nn.Embedding) and module.embedding_dim == width:
            module.weight = nn.Parameter(module.weight.data[:, keep].clone())
            module.embedding_dim = len(keep)
        elif isinstance(module, nn.LayerNorm) and module.normalized_shape == (width,):
            module.weight = nn.Parameter(module.weight.data[keep].clone())
            module.bias = nn.Parameter(module.bias.data[keep].clone())
            module.normalized_shape = (len(keep),)
        elif isinstance(module, nn.Linear):
            # rows: a layer's stream writers, and the head's hidden Linears outside the layers (BERT's pooler,
            # MPNet's classifier.dense: cut alike, so the Linear reading them is cut consistently by its columns)
            rows = module.out_features == width and (id(module) in writers or id(module) not in inside)
            _cut_linear(module, keep, rows=rows, cols=module.in_features == width)
    return out


def _has(layer: nn.Module, path: str) -> bool:
    try:
        layer.get_submodule(path)
    except AttributeError:
        return False
    return True


def timed(models: dict[str, nn.Module], seq_len: int, batch: int, rounds: int) -> dict[str, dict]:
    """Paired PyTorch speed-ups of `models` against the first one ("original"), interleaved rounds."""
    cands = [bench.pytorch_candidate(name, m.eval(), [seq_len]) for name, m in models.items()]
    throughput = bench.measure_throughput(cands, [batch], [seq_len], rounds, 2, 0.5)
    speedups = bench.paired_speedups(throughput, next(iter(models)))
    return {name: {k: round(v, 3) for k, v in speedups[name][str(seq_len)][str(batch)].items() if k != "per_round"}
            for name in models}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished family run directory")
    parser.add_argument("--step", type=int, required=True, help="the checkpointed step that closes the member")
    parser.add_argument("--widths", type=int, nargs="+", default=[768, 576, 512, 384])
    parser.add_argument("--train-widths", type=int, nargs="*", default=[], help="widths to fine-tune and score")
    parser.add_argument("--as-fast", action="store_true", help="also train the widest cut timed ≥ the reference")
    parser.add_argument("--also-step", type=int, help="time this step's pruned model (full width) beside them")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-examples", type=int, help="cap the fine-tune's examples (a quick check of the script)")
    parser.add_argument("--else-running", required=True, help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    recipe = load_recipe(args.run / RESOLVED_FILE)
    index = len(recipe.prune.resolved_budget.targets) - 1
    task, tokenizer = load_task_data(recipe.data), load_tokenizer(recipe.model)
    splits = tokenize_splits(task, tokenizer, recipe.data.max_length)
    model, masks = step_model(recipe, task.label_names, args.run / "state" / f"step_{args.step:03d}")
    member = masks.pruned_copy(model)
    also = {}
    if args.also_step is not None:  # e.g. the deepest member's own step, to compare at equal speed
        other, other_masks = step_model(recipe, task.label_names, args.run / "state" / f"step_{args.also_step:03d}")
        also[f"step{args.also_step}@full"] = other_masks.pruned_copy(other)
    order = torch.argsort(stream_importance(member, splits["train"], tokenizer), descending=True)
    cuts = {w: cut_hidden(member, order[:w].sort().values) for w in args.widths}
    ref_dir = next((args.run / "references").iterdir()) / "model"
    ref_model = load_pruned(ref_dir)
    seq_len, batch = recipe.bench.seq_len, 32
    models = {"original": load_model(recipe.model, task.label_names, attention="eager")}
    models |= {f"member@{w}": m for w, m in cuts.items()} | also | {"reference": ref_model}
    speed = timed(models, seq_len, batch, args.rounds)
    for name, row in speed.items():
        print(f"{name}: {row['median']:.2f}x (IQR {row['q1']:.2f}-{row['q3']:.2f})", flush=True)
    train_widths = list(args.train_widths)
    fast = [w for w in cuts if speed[f"member@{w}"]["median"] >= speed["reference"]["median"]]
    if args.as_fast and fast and max(fast) not in train_widths:
        train_widths.append(max(fast))
    ref_tokenizer = AutoTokenizer.from_pretrained(ref_dir)
    reference = correct(ref_model, tokenize_splits(task, ref_tokenizer, recipe.data.max_length)["test"], ref_tokenizer)
    accelerator = make_accelerator(recipe.accelerate.mixed_precision)  # "auto" resolved there
    spec = recipe.prune.member_spec(index)
    if args.max_examples:
        spec = spec.model_copy(update={"max_examples": args.max_examples})
    teacher = load_or_compute(args.run / "state" / "teacher", model, splits["train"], tokenizer, accelerator,
                              recipe.prune.recovery_finetune.distill)  # fmt: skip
    rows = []
    for width in train_widths:
        student, started = copy.deepcopy(cuts[width]), time.perf_counter()
        info = train(student, splits["train"], tokenizer, spec, accelerator, seed=member_seed(recipe.seed, index),
                     desc=f"fine-tune at width {width}", teacher=teacher)  # fmt: skip
        student = accelerator.unwrap_model(student).cpu().eval()
        val, test = (correct(student, splits[name], tokenizer) for name in ("validation", "test"))
        seconds = time.perf_counter() - started
        row = scored(f"width={width}", {}, info, seconds, val, test, reference)
        rows.append({"width": width, **row, "speedup": speed[f"member@{width}"]["median"]})
    out = {
        "what": "the deepest member's residual width cut before its last fine-tune: speed and accuracy",
        "run": str(args.run), "step": args.step, **measured_on(args.else_running), "batch": batch, "seq_len": seq_len,
        "member_epochs": spec.epochs, "reference_test_accuracy": float(reference.mean()),
        "heads_left": int(masks.heads.sum()),
        "neurons_left": None if masks.neurons is None else int(masks.neurons.sum()),
        "speedups_vs_original": speed, "trained": rows, "threads": torch.get_num_threads(),
    }  # fmt: skip
    write_result(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
