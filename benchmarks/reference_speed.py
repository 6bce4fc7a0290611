"""Issue 37's first figure: MiniLM-L6's PyTorch speed relative to MPNet-base, the speed a pruned MPNet-base member
must reach to be compared with the small model at equal speed.

Both built-ins load as sequence classifiers with a fresh two-label head (timing does not depend on the weights'
values) and the attention users deploy (SDPA; MPNet has none in transformers and runs eager). They are timed with
`compressor.bench.measure_throughput` in one process: interleaved rounds, each visiting both lengths and, inside
each, both models in a rotating order, on the same synthetic batches; the speed-up is paired per round
(`paired_speedups`) and summarised by its median and spread. The FLOP ratio (encoder FLOPs per example) is printed
beside it.

Needs `make setup-base` (builtin:mpnet-base). Run it with the machine to itself:
    .venv/bin/python benchmarks/reference_speed.py [--rounds 7] [--threads N] [--else-running "..."]
  → prints the figure and writes benchmarks/results/reference_speed.json (commit, CPU model and int8 features,
    library versions, load average, what else ran).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from provenance import measured_on  # noqa: E402

from compressor import bench  # noqa: E402
from compressor.recipe import ModelSpec  # noqa: E402
from compressor.sources import load_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "reference_speed.json"
BASE, SMALL = "builtin:mpnet-base", "builtin:minilm-l6"
LABELS = ["negative", "positive"]


def candidates(seq_lens: list[int]) -> list:
    """The two models as bench candidates, named by their sources."""
    out = []
    for source in (BASE, SMALL):
        model = load_model(ModelSpec(source=source), LABELS, attention="sdpa").eval()
        out.append(bench.pytorch_candidate(source, model, seq_lens))
    return out


def figures(cands: list, throughput: dict, seq_lens: list[int], batch: int) -> dict:
    """Per length: MiniLM-L6's paired speed-up over MPNet-base (median, IQR, min-max, per round), each model's
    milliseconds per batch, and the encoder-FLOP ratio."""
    speedups = bench.paired_speedups(throughput, BASE)[SMALL]
    results = throughput["results"]
    base, small = cands
    out = {}
    for s in seq_lens:
        row = speedups[str(s)][str(batch)]
        out[str(s)] = {
            "speedup": {k: row[k] for k in ("median", "q1", "q3", "min", "max")},
            "speedup_per_round": row["per_round"],
            "ms_per_batch": {c.name: results[c.name][str(s)][str(batch)]["ms_per_batch"]["median"] for c in cands},
            "flop_ratio": base.flops_at(s, seq_lens[0]) / small.flops_at(s, seq_lens[0]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="64,128")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-time-s", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--else-running", default="", help="what else ran on the machine while measuring")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    cands = candidates(seq_lens)
    started = time.perf_counter()
    throughput = bench.measure_throughput(
        cands, [args.batch_size], seq_lens, args.rounds, args.warmup, args.min_time_s, args.threads
    )
    result = {
        "figure": f"{SMALL} PyTorch speed-up over {BASE}, batch {args.batch_size}, paired per interleaved round",
        **measured_on(args.else_running, started),
        "machine": bench.machine_info(),
        "setup": throughput["setup"],
        "by_seq_len": figures(cands, throughput, seq_lens, args.batch_size),
        "throughput": throughput["results"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    threads = throughput["setup"]["torch_threads"]
    print(f"cpu: {result['cpu_identity']}, {result['cpu']['cores']} cores; torch threads {threads}")
    for s, row in result["by_seq_len"].items():
        sp, ms = row["speedup"], row["ms_per_batch"]
        print(
            f"{s:>4} tokens, batch {args.batch_size}: MiniLM-L6 {sp['median']:.2f}x MPNet-base (IQR {sp['q1']:.2f}-"
            f"{sp['q3']:.2f}, {args.rounds} rounds); {ms[BASE]:.1f} vs {ms[SMALL]:.1f} ms per batch; FLOP ratio "
            f"{row['flop_ratio']:.2f}"
        )
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
