"""Export figures: size, test accuracy, agreement and batch-32 throughput of the ONNX variants of a pruned model.

Takes the fine-tuned default model (MiniLM-L6 on Rotten Tomatoes) and a pruned version of it: `--pruned DIR` (e.g.
the lead's run output), else one made here — Taylor scores on training examples, the lowest 50% of heads removed
globally (whole layers may go), then a short recovery fine-tune — cached under .cache/bench-export/. Both are
exported with `compressor.deploy.export.export_onnx` (all variants, parity-gated on validation batches); every candidate
is scored on the whole test split and timed with `compressor.bench` (interleaved rounds, synthetic batch 32).

Usage: .venv/bin/python benchmarks/export.py [--original DIR] [--pruned DIR] [--threads 1] [--rounds 5]
       → prints a table and writes benchmarks/results/export.json
The machine may be shared: throughput is noisy; the JSON records load averages before and after timing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FINETUNED = ROOT / ".cache" / "finetuned" / "minilm-rt"
WORK = ROOT / ".cache" / "bench-export"
OUT = ROOT / "benchmarks" / "results" / "export.json"


def make_pruned(original: Path, dest: Path, data, tokenizer, target: float, score_examples: int, recover: int) -> dict:
    """Prune `target` of the heads by Taylor importance (one shot, global), fine-tune briefly, save to `dest`."""
    from accelerate import Accelerator

    import compressor
    from compressor.recipe import PruneSpec, TrainSpec
    from compressor.sources.batches import tokenize
    from compressor.surgery.checkpoint import load_pruned, save_pruned

    model = load_pruned(original, attn_implementation="eager")
    train_split = tokenize(data.train, tokenizer, data.text_fields, 128)
    finetune = TrainSpec(epochs=1.0, lr=5e-5, batch_size=32, max_examples=recover) if recover else None
    spec = PruneSpec(target=target, steps=1, finetune=finetune, score_examples=score_examples)
    result = compressor.prune(model, tokenizer, train_split, spec, seed=0, accelerator=Accelerator(cpu=True))
    step = result.steps[0]
    info: dict = {"plan": step["removed"], "heads_removed": int((~result.masks.heads).sum()), "criterion": "taylor"}
    if recover:
        info["recovery"] = {**step["finetune"], "examples": recover}
    original_model = load_pruned(original, attn_implementation="eager")
    pruned = result.pruned()
    save_pruned(pruned, dest, tokenizer, metadata={"made_by": "benchmarks/export.py", **info}, original=original_model)
    return info


def onnx_rows(candidates, quality: dict, speed: dict, exports: dict, original_acc: float) -> dict:
    """One row per candidate: size, test accuracy and its delta to the original, agreement, batch-32 speed."""
    rows = {}
    for c in candidates:
        q, s = quality["results"][c.name], speed["summary"][c.name]
        b, seq = str(s["headline_batch"]), str(s["headline_seq_len"])
        row = {
            "size_mb": round(c.size_bytes / 1e6, 2),
            "test_accuracy": q["accuracy"],
            "accuracy_delta_points_vs_original": round(100 * (q["accuracy"] - original_acc), 2),
            "agreement_vs_pytorch_pruned_test": q["agreement"],
            "max_abs_logit_diff_vs_pytorch_pruned_test": q["max_abs_logit_diff"],
            f"examples_per_s_b{b}": speed["throughput"][c.name][seq][b]["examples_per_s"]["median"],
            f"speedup_vs_pytorch_original_b{b}": s["headline_speedup"],
            "speedup_iqr": s["speedup_iqr"][seq][b],
            "flop_ideal_speedup": s["flop_ideal_speedup"],
        }
        export_key = c.name.removeprefix("onnx-")
        if export_key in exports:
            e = exports[export_key]
            row |= {
                "gate_max_abs_diff": e["max_abs_diff"],
                "gate_agreement": e["agreement"],
                "fused_attention_nodes": e["fused_attention_nodes"],
            }
            if "attention_fusion" in e:
                row["attention_fusion"] = e["attention_fusion"]
        rows[c.name] = row
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--original", type=Path, default=FINETUNED, help="fine-tuned original model directory")
    parser.add_argument("--pruned", type=Path, help="pruned model directory (default: make one, cached)")
    parser.add_argument("--target", type=float, default=0.5, help="fraction of heads removed when making one")
    parser.add_argument("--recover-examples", type=int, default=2000, help="recovery fine-tune examples (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for PyTorch and ONNX Runtime")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per synthetic timing example")
    parser.add_argument("--test-examples", type=int, default=None, help="test examples (default: the whole split)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from compressor import bench
    from compressor.deploy.export import export_onnx
    from compressor.recipe import BenchSpec, DataSpec
    from compressor.sources import load_task_data
    from compressor.sources.batches import sample_batches, tokenize
    from compressor.surgery.arch import present_heads
    from compressor.surgery.checkpoint import load_pruned

    if not (args.original / "config.json").is_file():
        raise SystemExit(f"--original: no model at '{args.original}' (the fine-tuned default model is not there yet)")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    data = load_task_data(DataSpec())
    tokenizer = AutoTokenizer.from_pretrained(args.original)
    pruned_dir, made = args.pruned, None
    if pruned_dir is None:
        pruned_dir = WORK / f"pruned{round(100 * args.target)}-taylor-r{args.recover_examples}"
        if not (pruned_dir / "config.json").is_file():
            made = make_pruned(args.original, pruned_dir, data, tokenizer, args.target, 512, args.recover_examples)
        made = made or json.loads((pruned_dir / "compressor_plan.json").read_text())["metadata"]
    validation = tokenize(data.validation, tokenizer, data.text_fields, 128)
    check = sample_batches(validation, tokenizer, 128, 32, seed=1)
    exports = {
        "pruned": export_onnx(pruned_dir, WORK / "onnx-pruned", ["fp32", "optimized", "int8"], check),
        "original": export_onnx(args.original, WORK / "onnx-original", ["fp32", "optimized", "int8"], check),
    }
    original, pruned = (load_pruned(d, attn_implementation="sdpa") for d in (args.original, pruned_dir))
    candidates = [
        bench.pytorch_candidate("pytorch-original", original, args.seq_len, args.original),
        bench.pytorch_candidate("pytorch-pruned", pruned, args.seq_len, pruned_dir),
    ]
    for which, source in (("pruned", candidates[1]), ("original", candidates[0])):
        for name, info in exports[which].items():
            candidates.append(
                bench.onnx_candidate(
                    f"onnx-{which}-{name}", info["dir"], args.threads, source.flops_per_example, source.heads_per_layer
                )
            )
    test = tokenize(data.test, tokenizer, data.text_fields, 128)
    batches = sample_batches(test, tokenizer, args.test_examples or len(test), 32, seed=0)
    quality = bench.measure_quality(candidates, batches, reference="pytorch-pruned")
    load_before = os.getloadavg()
    spec = BenchSpec(batch_sizes=[32], seq_len=args.seq_len, rounds=args.rounds, threads=args.threads)
    speed = bench.bench(candidates, None, spec, None, reference="pytorch-original")
    original_acc = quality["results"]["pytorch-original"]["accuracy"]
    flat_exports = {f"{w}-{k}": v for w, ex in exports.items() for k, v in ex.items()}
    result = {
        "original_dir": str(args.original),
        "pruned_dir": str(pruned_dir),
        "pruned_made_here": made,
        "heads_per_layer_pruned": [len(h) for h in present_heads(pruned)],
        "test_examples": quality["n"],
        "threads": args.threads,
        "seq_len": args.seq_len,
        "rounds": args.rounds,
        "load_average_before_timing": list(load_before),
        "load_average_after_timing": list(os.getloadavg()),
        "machine": speed["machine"],
        "rows": onnx_rows(candidates, quality, speed, flat_exports, original_acc),
        "exports": exports,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


def print_table(result: dict) -> None:
    print(f"heads per layer (pruned): {result['heads_per_layer_pruned']}; test examples {result['test_examples']}")
    print(
        f"threads {result['threads']}, load average before/after timing {result['load_average_before_timing']} / "
        f"{result['load_average_after_timing']}"
    )
    header = f"{'candidate':26} {'MB':>7} {'acc %':>7} {'Δ pts':>6} {'agree':>7} {'ex/s':>8} {'× orig':>7}  fusion"
    print(header)
    for name, r in result["rows"].items():
        eps = next(v for k, v in r.items() if k.startswith("examples_per_s"))
        sp = next(v for k, v in r.items() if k.startswith("speedup_vs"))
        print(
            f"{name:26} {r['size_mb']:7.1f} {100 * r['test_accuracy']:7.2f} "
            f"{r['accuracy_delta_points_vs_original']:6.2f} {r['agreement_vs_pytorch_pruned_test']:7.4f} "
            f"{eps:8.1f} {sp:7.2f}  {r.get('attention_fusion', '')}"
        )


if __name__ == "__main__":
    main()
