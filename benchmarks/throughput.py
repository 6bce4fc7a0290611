"""Default-model figure: PyTorch pruned/original throughput of MiniLM-L6 with 50% of heads removed, vs the FLOP ideal.

Takes the fine-tuned MiniLM at .cache/finetuned/minilm-rt when present (else the built-in MiniLM with a fresh
classifier: timing does not depend on the weights' values), removes 36 of its 72 heads — the lowest Taylor scores
on 128 Rotten Tomatoes validation examples, or the plan of a finished run with `--plan model/compressor_plan.json`
— and times original and pruned (SDPA attention, as deployed) with `compressor.bench.measure_throughput`, twice,
to show that the ratios repeat. The FLOP-ideal ratio counts encoder FLOPs only (cost.encoder_flops): at 64 tokens
the feed-forward blocks dominate, so removing half of the heads cannot give anywhere near 2×.

Usage: python benchmarks/throughput.py [--threads 1] [--rounds 5] [--plan FILE]
       → prints and writes benchmarks/results/throughput.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import compressor
from compressor import bench
from compressor.bench.candidates import as_sdpa
from compressor.recipe import DataSpec, ModelSpec, PruneSpec
from compressor.sources import load_model, load_task_data, load_tokenizer
from compressor.sources.batches import tokenize
from compressor.surgery.checkpoint import load_pruned, read_plan
from compressor.surgery.slicing import pruned_copy

ROOT = Path(__file__).resolve().parents[1]
FINETUNED = ROOT / ".cache" / "finetuned" / "minilm-rt"
RESULTS = ROOT / "benchmarks" / "results" / "throughput.json"
HEADLINE = 32


def load_original() -> tuple[torch.nn.Module, str, object]:
    """(eager model, description, tokenizer): the fine-tuned MiniLM when it exists, else the built-in base."""
    if (FINETUNED / "config.json").exists():
        spec = ModelSpec(source=str(FINETUNED), task_tuned=True)
        return (
            load_pruned(FINETUNED, attn_implementation="eager"),
            str(FINETUNED.relative_to(ROOT)),
            load_tokenizer(spec),
        )
    spec = ModelSpec()
    model = load_model(spec, ["negative", "positive"], attention="eager").eval()
    return model, f"{spec.source} (not fine-tuned: {FINETUNED.relative_to(ROOT)} absent)", load_tokenizer(spec)


def taylor_plan(model: torch.nn.Module, tokenizer) -> dict[int, list[int]]:
    """Half of the heads with the lowest Taylor scores (global, one step, no fine-tuning), scored on 128 validation
    examples, through the Python API."""
    torch.set_num_threads(1)
    data = load_task_data(DataSpec(max_length=64))
    val = tokenize(data.validation, tokenizer, data.text_fields, 64)
    spec = PruneSpec(target=0.5, steps=1, finetune=None, score_examples=128, score_batch_size=32)
    return compressor.prune(model, tokenizer, val, spec, seed=0).plan


def repeat_summary(runs: list[dict], ideal: float, seq_len: int) -> dict:
    """Pruned/original speed-up per batch size for each repeat, and the largest relative difference."""
    per_batch = {}
    seq = str(seq_len)  # results are keyed [name][seq_len][batch]
    for b in runs[0]["results"]["pytorch-original"][seq]:
        values = [bench.paired_speedups(r, "pytorch-original")["pytorch-pruned"][seq][b]["median"] for r in runs]
        per_batch[b] = {
            "speedups": values,
            "over_flop_ideal": [v / ideal for v in values],
            "max_relative_difference": (max(values) - min(values)) / min(values),
        }
    return per_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--plan", type=Path, help="compressor_plan.json (or model dir) of a run to use instead")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    original, source, tokenizer = load_original()
    if args.plan:
        plan_dir = args.plan if args.plan.is_dir() else args.plan.parent
        plan, plan_source = read_plan(plan_dir), str(args.plan)
    else:
        plan, plan_source = taylor_plan(original, tokenizer), "taylor, 128 validation examples, global"
    cands = [  # sizes are the in-memory parameter bytes (no saved directory)
        bench.pytorch_candidate("pytorch-original", as_sdpa(original), args.seq_len),
        bench.pytorch_candidate("pytorch-pruned", as_sdpa(pruned_copy(original, plan)), args.seq_len),
    ]
    runs = []
    for repeat in range(2):
        t0 = time.perf_counter()
        runs.append(
            bench.measure_throughput(
                cands, sizes, args.seq_len, rounds=args.rounds, warmup=2, min_time_s=0.5, threads=args.threads
            )
        )
        print(f"repeat {repeat + 1}: {time.perf_counter() - t0:.0f} s")
    ideal = cands[0].flops_per_example / cands[1].flops_per_example
    summary = repeat_summary(runs, ideal, args.seq_len)
    result = {
        "model": source,
        "plan": {str(k): v for k, v in sorted(plan.items())},
        "plan_source": plan_source,
        "heads_left": cands[1].heads_per_layer,
        "seq_len": args.seq_len,
        "threads": args.threads,
        "flop_ideal_speedup": ideal,
        "size_bytes": {c.name: c.size_bytes for c in cands},
        "speedup_by_batch": summary,
        "machine": bench.machine_info(),
        "note": "2 CPU cores shared with other jobs while measured: absolute times are noisy; ratios are paired "
        "per round (interleaved), which cancels most of the drift.",
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"model {source}; heads per layer after pruning {cands[1].heads_per_layer}")
    print(f"FLOP-ideal pruned/original speed-up at {args.seq_len} tokens: {ideal:.3f}")
    for b, row in summary.items():
        sp = ", ".join(f"{v:.3f}" for v in row["speedups"])
        ratio = ", ".join(f"{v:.3f}" for v in row["over_flop_ideal"])
        eps = [r["results"]["pytorch-pruned"][str(args.seq_len)][b]["examples_per_s"]["median"] for r in runs]
        print(
            f"batch {b:>3}: speed-up {sp} (repeats) = {ratio} × ideal; repeat difference "
            f"{100 * row['max_relative_difference']:.1f}%; pruned {eps[0]:.0f}/{eps[1]:.0f} examples/s"
        )
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
