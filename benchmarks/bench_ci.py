"""CI regression check of this repository: a small pruned BERT checked with `compressor bench --baseline`.

A random-init BERT (4 layers × 8 heads, hidden 256, FFN 512) loses 16 of its 32 heads by a fixed plan; the original,
the pruned model and the pruned model's fp32 ONNX export are saved, then benchmarked and checked against
benchmarks/baseline_ci.json by the same code path as `compressor bench --reference ... --candidate ... --baseline`
(`compressor.commands.bench.run_bench`, decisions in `compressor.guard.baseline`): per-round speed-up ratios (a
regression when the change is beyond the tolerance and Welch's one-sided test is significant; inconclusive, also a
failure, when this run's rounds are too noisy), absolute throughput and the ONNX-vs-PyTorch ratios (set by each CPU's
kernels) only on the baseline's CPU model, and quality on
seeded synthetic batches labelled by the original's own predictions (so the original scores 1.0 and the pruned
model's accuracy is its agreement, deterministic). Before timing, the pruned model must reproduce the masked
original exactly.
Exit 0 pass, 1 regression or inconclusive (or a pruned/masked disagreement), 2 invalid or mismatched baseline, or
(with --update-baseline) rounds too dispersed to save: renew the baseline on a quiet machine.

Usage: python benchmarks/bench_ci.py [--update-baseline] [--threads 1] [--rounds 12] [--out runs/bench-ci]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from compressor import bench
from compressor.commands.bench import run_bench
from compressor.core.errors import UserError
from compressor.deploy.export import export_onnx
from compressor.pruning.masking import gated
from compressor.pruning.selection import plan_to_mask
from compressor.recipe import BenchSpec
from compressor.surgery.checkpoint import load_pruned, save_pruned
from compressor.surgery.slicing import pruned_copy

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "benchmarks" / "baseline_ci.json"
PLAN = {0: [0, 1], 1: [0, 2, 4, 5, 6, 7], 2: [1, 3, 5, 7], 3: [0, 1, 2, 3]}  # 16 of 32 heads, uneven on purpose
LAYERS, HEADS, HIDDEN, FFN, VOCAB = 4, 8, 256, 512, 1000
SEQ_LEN, BATCH_SIZES = 128, [1, 8, 32]
# Written into a new baseline. This repository's CI shares 2 cores with other jobs: absolute throughput moves a lot,
# so it gets a wide tolerance, and per-round ratios spread with a log sd of 0.1-0.2 under load, which 12 rounds
# resolve against a 15% tolerance (`compressor.guard.baseline.too_noisy`) but not against the 10% default (that needs
# a quiet runner). Quality keeps the default.
TOLERANCES = {"throughput": {"relative": 0.5}, "ratio": {"relative": 0.15}}


def build_models(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(original, pruned) with SDPA attention, the implementation users deploy."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=SEQ_LEN,
        num_labels=2,
    )
    original = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa").eval()
    return original, pruned_copy(original, PLAN).eval()


def synthetic_eval_batches(n: int = 512, batch: int = 32, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Seeded random token ids with varied lengths (right padding), as a data loader would give them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n // batch):
        ids = torch.randint(5, VOCAB, (batch, SEQ_LEN), generator=g)
        lengths = torch.randint(8, SEQ_LEN + 1, (batch,), generator=g)
        mask = (torch.arange(SEQ_LEN)[None, :] < lengths[:, None]).long()
        out.append({"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(mask)})
    return out


def labelled_by(reference: bench.Candidate, batches: list) -> list[dict[str, torch.Tensor]]:
    """Copies of `batches` with `labels` = `reference`'s own predictions (deterministic for a seeded model)."""
    return [{**b, "labels": torch.as_tensor(bench.collect_logits(reference, [b]).argmax(-1))} for b in batches]


def masked_candidate(original: torch.nn.Module) -> bench.Candidate:
    """The original with the plan's heads gated off: the physically pruned model must reproduce it exactly."""
    gates = plan_to_mask(PLAN, torch.ones(LAYERS, HEADS, dtype=torch.bool)).float()

    def predict(batch):
        with torch.inference_mode(), gated(original, gates):
            return original(**batch).logits.numpy()

    return bench.Candidate("pytorch-masked", predict, 0, None, "pytorch")


def agreements(candidates: list[bench.Candidate], batches: list, pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Share of examples on which two candidates predict the same class, for each (a, b) pair."""
    by_name = {c.name: c for c in candidates}
    preds = {c.name: bench.collect_logits(c, batches).argmax(-1) for c in candidates}
    return {f"{a}|{b}": float(np.mean(preds[a] == preds[b])) for a, b in pairs if a in by_name and b in by_name}


def save_models(work: Path) -> tuple[Path, Path, list, bench.Candidate]:
    """Save original and pruned, export the pruned model's fp32 ONNX (parity-checked) under work/onnx; returns
    (original dir, pruned dir, evaluation batches, the original as a candidate) after the masked-equivalence gate."""
    original, pruned = build_models()
    batches = synthetic_eval_batches()
    orig_dir = save_pruned(original, work / "original")
    pruned_dir = save_pruned(pruned, work / "pruned", original=original, seq_len=SEQ_LEN)
    export_onnx(pruned_dir, work / "onnx", ["fp32"], batches[:2])
    loaded = bench.pytorch_candidate("pytorch-pruned", load_pruned(pruned_dir, attn_implementation="sdpa"), SEQ_LEN)
    reference = bench.pytorch_candidate("pytorch-original", original, SEQ_LEN)
    agree = agreements([loaded, masked_candidate(original)], batches, [("pytorch-pruned", "pytorch-masked")])
    if agree["pytorch-pruned|pytorch-masked"] != 1.0:
        raise AssertionError(f"pruned vs masked original agreement {agree} (expected exactly 1.0)")
    return Path(orig_dir), Path(pruned_dir), batches, reference


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--update-baseline", action="store_true", help="write this run's metrics as the baseline")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1 keeps ratios stable)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-ci", help="bench report directory")
    args = parser.parse_args()
    start = time.perf_counter()
    bench.set_threads(args.threads)
    spec = BenchSpec(
        batch_sizes=BATCH_SIZES, seq_lens=[SEQ_LEN], rounds=args.rounds, warmup=2, min_time_s=0.3, threads=args.threads
    )
    save, check = (args.baseline, None) if args.update_baseline else (None, args.baseline)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            orig_dir, pruned_dir, batches, reference = save_models(Path(tmp))
            code = run_bench(
                orig_dir,
                pruned_dir,
                args.out,
                spec,
                onnx_dir=Path(tmp) / "onnx",
                batches_for=lambda _dir, _labels: labelled_by(reference, batches),
                save_baseline=save,
                baseline=check,
                roles=("original", "pruned"),
                tolerances=TOLERANCES,
            )
        except UserError as err:
            print(f"bench-ci: error: {err}", file=sys.stderr)
            return 2
        except AssertionError as err:
            print(f"bench-ci: FAIL: {err}", file=sys.stderr)
            return 1
    print(f"bench-ci: {'PASS' if code == 0 else 'FAIL'} in {time.perf_counter() - start:.0f} s (report: {args.out})")
    return code


if __name__ == "__main__":
    sys.exit(main())
