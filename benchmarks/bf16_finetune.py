"""What `accelerate.mixed_precision: auto` buys on this machine: a fine-tune in bf16 autocast against fp32, paired.

Measured with compressor's own `recovery.train.train` (dynamic padding, length-grouped batches, AdamW, the real
task's lengths) on each model with a fresh 2-label head over the first `--examples` of the task's train split:
the fp32 and the bf16 fine-tune alternate `--repeats` times, each from the same starting weights, after one
warm-up of each; medians and the ratio of medians. The precision is one per process in Accelerate, so its state is
reset between the two. On a CPU without AMX-BF16 or AVX512-BF16 `auto` would choose fp32 (bf16 is emulated there):
this script still times bf16, to show what `auto` avoids.

Usage: python benchmarks/bf16_finetune.py [--models builtin:mpnet-base,builtin:minilm-l6] [--examples 320]
       [--repeats 3] [--else-running "..."] → prints and writes benchmarks/results/bf16_finetune.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402
from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor.core.machine import cpu_has_bf16  # noqa: E402
from compressor.pipeline.runner import native_precision  # noqa: E402
from compressor.recipe import DataSpec, ModelSpec, TrainSpec  # noqa: E402
from compressor.recovery.train import train  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import tokenize  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bf16_finetune.json"
DATA = DataSpec(source="builtin:rotten_tomatoes", text_fields=["text"], label_field="label", max_length=64)


def accelerator(precision: str) -> Accelerator:
    """A fresh Accelerator at `precision` ("no" or "bf16"): Accelerate keeps one precision per process."""
    AcceleratorState._reset_state(reset_partial_state=True)
    return Accelerator(cpu=True, mixed_precision=None if precision == "no" else precision)


def timed_finetune(start: torch.nn.Module, split, tokenizer, spec: TrainSpec, precision: str) -> tuple[float, float]:
    """Seconds of one fine-tune of a copy of `start` at `precision`, and its mean training loss."""
    model = copy.deepcopy(start)
    acc = accelerator(precision)
    t0 = time.perf_counter()
    stats = train(model, split, tokenizer, spec, acc, seed=0, desc=precision)
    return time.perf_counter() - t0, float(stats["train_loss"])


def measure(source: str, examples: int, repeats: int) -> dict:
    """Paired fp32 / bf16 fine-tunes of `source` on `examples` train examples (medians of `repeats`)."""
    data = load_task_data(DATA)
    spec = ModelSpec(source=source)
    tokenizer = load_tokenizer(spec)
    split = tokenize(data.train, tokenizer, data.text_fields, DATA.max_length)
    model = load_model(spec, data.label_names, attention="eager")
    finetune = TrainSpec(epochs=1, lr=3e-5, batch_size=32, max_examples=examples)
    timed_finetune(model, split, tokenizer, finetune.model_copy(update={"max_examples": 64}), "no")  # warm-ups
    timed_finetune(model, split, tokenizer, finetune.model_copy(update={"max_examples": 64}), "bf16")
    seconds: dict[str, list[float]] = {"no": [], "bf16": []}
    losses: dict[str, float] = {}
    for _ in range(repeats):
        for precision in ("no", "bf16"):
            took, losses[precision] = timed_finetune(model, split, tokenizer, finetune, precision)
            seconds[precision].append(took)
    fp32, bf16 = statistics.median(seconds["no"]), statistics.median(seconds["bf16"])
    return {
        "model": source,
        "examples": examples,
        "seconds_fp32": [round(s, 2) for s in seconds["no"]],
        "seconds_bf16": [round(s, 2) for s in seconds["bf16"]],
        "median_fp32_s": round(fp32, 2),
        "median_bf16_s": round(bf16, 2),
        "bf16_speedup": round(fp32 / bf16, 3),
        "train_loss": {"fp32": round(losses["no"], 4), "bf16": round(losses["bf16"], 4)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="builtin:mpnet-base,builtin:minilm-l6")
    parser.add_argument("--examples", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--else-running", default="", help="what else ran on the machine while measuring")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = [measure(source, args.examples, args.repeats) for source in args.models.split(",")]
    result = {
        "figure": "a fine-tune's wall time in fp32 and in bf16 autocast, paired, with compressor's own train()",
        **measured_on(args.else_running),
        "cpu_has_bf16": cpu_has_bf16(),
        "auto_chooses": native_precision()[0],
        "torch_threads": torch.get_num_threads(),
        "rows": rows,
    }
    print(f"cpu: {result['cpu_identity']}; native bf16: {result['cpu_has_bf16']}; auto -> {result['auto_chooses']}")
    for row in rows:
        print(f"{row['model']}: {row['examples']} examples, fp32 {row['median_fp32_s']:.1f} s, bf16 "
              f"{row['median_bf16_s']:.1f} s: bf16 {row['bf16_speedup']:.2f}x faster")  # fmt: skip
    write_result(result, args.out)


if __name__ == "__main__":
    main()
