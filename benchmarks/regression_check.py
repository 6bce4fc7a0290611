"""How reliable is `compressor bench --baseline` on this machine? Runs the check repeatedly on three candidates.

A "release" model (MiniLM-L6 by default, or `--model DIR`) is saved, and a baseline is taken of it against itself
(the deployed-model case: reference = last release, candidate = the new build). Then, `--repeats` times each:
- unchanged: the candidate is the release itself → any failing check is a false alarm;
- slower: the release with one extra encoder layer (a copy of the last; ~15% more time for MiniLM-L6's 6 layers)
  → caught when a speed-up `ratio` metric is flagged;
- worse: the release with its classifier bias shifted until test accuracy drops by ≥ 2 points on the checked
  examples (timing unchanged) → caught when `accuracy:pytorch-candidate` is flagged.
Every check goes through `compressor.commands.bench.run_bench` (what the CLI runs), with timing settings chosen so
that one check of a MiniLM-sized model fits in 2 minutes on 2 cores. Each check records its wall seconds, its
verdicts (change, interval, p-value, status of each timing metric) and the 1-minute load average before and after
(os.getloadavg), so a reader sees whether the machine was busy. Prints a table and writes
benchmarks/results/regression_check.json.

No "half the threads" slowdown: `run_bench` times every candidate with the same thread count (PyTorch's is
process-wide), so a candidate cannot be given fewer threads than the reference without changing compressor code.

Usage: python benchmarks/regression_check.py [--repeats 10] [--model DIR] [--rounds 20] [--eval-examples 600]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from compressor import bench
from compressor.commands.bench import bench_batches, run_bench
from compressor.core import atomic
from compressor.core.errors import UserError
from compressor.recipe import BenchSpec, ModelSpec
from compressor.sources.models import load_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "regression_check.json"
SCENARIOS = ("unchanged", "slower", "worse")


def save(model: torch.nn.Module, tokenizer, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def with_extra_layer(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with its last encoder layer duplicated at the end (BERT-style `encoder.layer`)."""
    slower = copy.deepcopy(model)
    layers = slower.base_model.encoder.layer
    layers.append(copy.deepcopy(layers[-1]))
    slower.config.num_hidden_layers = len(layers)
    return slower


def bias_for_drop(logits: np.ndarray, labels: np.ndarray, drop: float) -> np.ndarray:
    """The smallest shift of the class-0 logit (either sign) that lowers accuracy on these examples by ≥ `drop`:
    a model that is worse by a known amount while every weight that is timed stays as it was."""
    base = np.mean(logits.argmax(-1) == labels)
    margins = np.sort(np.abs(logits[:, 1] - logits[:, 0]))
    for size in margins + 1e-4:
        for sign in (1.0, -1.0):
            shift = np.array([sign * size, 0.0], dtype=np.float32)
            if base - np.mean((logits + shift).argmax(-1) == labels) >= drop:
                return shift
    raise ValueError(f"no bias shift lowers accuracy by {drop}")


def prepare(spec: ModelSpec, work: Path, examples: int, drop: float) -> tuple[dict[str, Path], list]:
    """Save the release, slower and worse models under `work`; returns their dirs and the evaluation batches."""
    torch.manual_seed(0)  # a base encoder gets a seeded classifier head: the same release on every run
    model = load_model(spec).eval()
    tokenizer = load_tokenizer(spec)
    release = save(model, tokenizer, work / "release")
    batches = bench_batches(None, release, model.config.num_labels, examples)
    candidate = bench.pytorch_candidate("release", model, 64)
    logits = bench.collect_logits(candidate, batches)
    labels = np.concatenate([b["labels"].numpy() for b in batches])
    worse = copy.deepcopy(model)
    with torch.no_grad():
        worse.classifier.bias += torch.as_tensor(bias_for_drop(logits, labels, drop))
    dirs = {
        "unchanged": release,
        "slower": save(with_extra_layer(model), tokenizer, work / "slower"),
        "worse": save(worse, tokenizer, work / "worse"),
    }
    return dirs, batches


def model_spec(source: str) -> ModelSpec:
    """builtin:minilm-l6 is a base encoder (gets a seeded head); a local directory is taken as task-tuned."""
    return ModelSpec(source=source, task_tuned=not source.startswith("builtin:"))


def load() -> float:
    """The 1-minute load average: near the core count or above means other work competed with the timing."""
    return round(os.getloadavg()[0], 2)


def timed(run) -> tuple[int, dict]:
    """Run `run()`; return its result and its wall seconds with the load average before and after."""
    before, start = load(), time.perf_counter()
    result = run()
    return result, {"seconds": time.perf_counter() - start, "load_before": before, "load_after": load()}


def bench_against_release(dirs: dict, scenario: str, spec: BenchSpec, batches: list, out: Path, **option) -> int:
    """`compressor bench --reference release --candidate <scenario>` with `save_baseline=` or `baseline=`."""
    return run_bench(dirs["unchanged"], dirs[scenario], out, spec, batches_for=lambda _d, _n: batches, **option)


def one_check(dirs: dict, scenario: str, spec: BenchSpec, batches: list, baseline: Path, out: Path) -> dict:
    """Check the scenario's candidate against the baseline: exit code, flagged metrics, the timing metrics'
    verdicts, wall seconds and load averages."""
    code, cost = timed(lambda: bench_against_release(dirs, scenario, spec, batches, out, baseline=baseline))
    verdicts = json.loads((out / "regression.json").read_text())["verdicts"]
    keep = ("change", "low", "high", "p_value", "status")
    return {
        "exit_code": code,
        **cost,
        "regressed": [v["metric"] for v in verdicts if v["status"] == "REGRESSION"],
        "inconclusive": [v["metric"] for v in verdicts if v["status"] == "inconclusive"],
        "changes": {v["metric"]: v["change"] for v in verdicts},
        "ratios": {v["metric"]: {k: v[k] for k in keep} for v in verdicts if v["kind"] == "ratio"},
    }


def summarize(runs: dict[str, list[dict]]) -> dict:
    """The issue's figures: false alarms (unchanged), speed and quality detections, check wall time."""

    def count(scenario: str, test) -> int:
        return sum(bool(test(r)) for r in runs[scenario])

    seconds = [r["seconds"] for rs in runs.values() for r in rs]
    loads = [r[k] for rs in runs.values() for r in rs for k in ("load_before", "load_after")]
    return {
        "false_alarms": count("unchanged", lambda r: r["exit_code"] != 0),
        "slowdown_caught": count("slower", lambda r: any(m.startswith("ratio:") for m in r["regressed"])),
        "accuracy_drop_caught": count("worse", lambda r: "accuracy:pytorch-candidate" in r["regressed"]),
        "inconclusive_checks": {s: count(s, lambda r: r["inconclusive"]) for s in runs},
        "repeats": len(runs["unchanged"]),
        "check_seconds_median": float(np.median(seconds)),
        "check_seconds_max": float(max(seconds)),
        "load_average_max": max(loads),
        "cpu_count": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:minilm-l6", help="release model: builtin:minilm-l6 or a dir")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-examples", type=int, default=600)
    parser.add_argument("--drop", type=float, default=0.02, help="accuracy drop of the 'worse' candidate")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    spec = BenchSpec(
        batch_sizes=sizes, seq_lens=[args.seq_len], rounds=args.rounds, warmup=1, min_time_s=0.2, threads=args.threads
    )
    bench.set_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dirs, batches = prepare(model_spec(args.model), work, args.eval_examples, args.drop)
        baseline = work / "baseline.json"
        try:
            _, baseline_cost = timed(
                lambda: bench_against_release(dirs, "unchanged", spec, batches, work / "first", save_baseline=baseline)
            )
        except UserError as err:  # e.g. rounds too dispersed on a loaded machine: no baseline, nothing to check
            print(f"regression_check: error: {err} (load average {load()})", file=sys.stderr)
            return 2
        runs: dict[str, list[dict]] = {s: [] for s in SCENARIOS}
        for i in range(args.repeats):
            for scenario in SCENARIOS:
                runs[scenario].append(one_check(dirs, scenario, spec, batches, baseline, work / f"{scenario}-{i}"))
                r = runs[scenario][-1]
                print(f"repeat {i + 1} {scenario:9s}: exit {r['exit_code']} in {r['seconds']:.0f} s (load "
                      f"{r['load_before']}→{r['load_after']}), regressed {r['regressed']}, inconclusive "
                      f"{r['inconclusive']}", flush=True)  # fmt: skip
    summary = summarize(runs)
    settings = {k: v for k, v in vars(args).items() if k != "out"} | {"baseline": baseline_cost}
    atomic.write_text(args.out, json.dumps({"settings": settings, "summary": summary, "runs": runs}, indent=2))
    n = summary["repeats"]
    print(f"false alarms (unchanged): {summary['false_alarms']} of {n}")
    print(f"15% slowdown caught (extra layer): {summary['slowdown_caught']} of {n}")
    print(f"{100 * args.drop:.0f}-point accuracy drop caught: {summary['accuracy_drop_caught']} of {n}")
    print(f"inconclusive checks: {summary['inconclusive_checks']}")
    print(f"one check: median {summary['check_seconds_median']:.0f} s, max {summary['check_seconds_max']:.0f} s; "
          f"load average up to {summary['load_average_max']} on {summary['cpu_count']} CPUs")  # fmt: skip
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
