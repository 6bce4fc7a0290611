"""The second step of the `reference_speed` experiment: does a budget `relative_to` a reference aim where the bench
later finds that reference?

A relative budget's targets come from the reference's shape timed against the model's when the run starts, both built
from their configs with random weights (`compressor.pruning.latency.check.reference_speedup`). The run's bench times
the real ones: the fine-tuned reference and the original, each exported to every runtime. This times the shapes
afresh (an empty cache of its own, so nothing is read from an earlier run) on each runtime the finished run's bench
measured, and writes beside it the reference's speed-up over the original that the bench measured there (both are
ratios over the same original on the same runtime, batch and length).

Usage: python benchmarks/reference_speed.py --report runs/bench/mpnet_width_off/off/report.json \
    --reference builtin:minilm-l6 --runtimes onnx-int8 openvino-int8 pytorch --out runs/bench/reference_speed
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's compressor, as the suite's other scripts

from compressor.bench.timing import headline_batch  # noqa: E402
from compressor.core.candidates import ORIGINAL  # noqa: E402
from compressor.pipeline.references import references  # noqa: E402
from compressor.pruning.latency.check import reference_speedup  # noqa: E402
from compressor.recipe import ModelSpec, load_recipe  # noqa: E402
from compressor.sources.models import load_config  # noqa: E402


def bench_ratio(rows: list[dict], label: str, runtime: str) -> float | None:
    """The reference `label`'s speed-up over the original on `runtime` as the bench measured it (each row's speed-up
    is over the PyTorch original), or None when the bench has no such pair of rows."""
    speed = {(r["role"], r["model"]): r.get("speedup") for r in rows if r["runtime"] == runtime}
    ref, original = speed.get(("reference", label)), speed.get((ORIGINAL, ORIGINAL))
    return None if ref is None or original is None else ref / original


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, required=True, help="a finished run's report.json (with a bench)")
    parser.add_argument("--reference", required=True, help="one of the run's bench.references")
    parser.add_argument("--runtimes", nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    recipe = load_recipe(args.report.parent / "recipe.resolved.yaml")
    label = next(r.label for r in references(recipe) if r.spec.source == args.reference)
    rows = (report.get("family") or report)["frontier"]
    batch, seq = recipe.prune.resolved_budget.batch_size, recipe.prune.resolved_budget.seq_len
    headline = (headline_batch(recipe.bench.batch_sizes), recipe.bench.seq_lens[0])
    if headline != (batch, seq):  # the bench's frontier speed-ups are at its headline shape, not the budget's
        print(f"reference_speed: the budget times batch {batch} at {seq} tokens but the bench's frontier is at batch "
              f"{headline[0]}, {headline[1]} tokens; expected the same shape", file=sys.stderr)  # fmt: skip
        return 2
    config, reference = load_config(recipe.model), load_config(ModelSpec(source=args.reference))
    out: dict = {"reference": args.reference, "batch_size": batch, "seq_len": seq, "runtimes": {}}
    with tempfile.TemporaryDirectory() as cache:
        for runtime in args.runtimes:
            timed = reference_speedup(config, reference, runtime, batch, seq, len(report["labels"]), cache_dir=cache)
            out["runtimes"][runtime] = {"from_configs": timed, "bench": bench_ratio(rows, label, runtime)}
            print(f"{runtime}: from configs {timed:.2f}x, in the bench {out['runtimes'][runtime]['bench']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reference_speed.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
