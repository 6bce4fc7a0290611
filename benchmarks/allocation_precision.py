"""Whether the measured allocation ranks alike in bf16 autocast: its loss passes fp32 against bf16 on a real run.

`accelerate.mixed_precision` (bf16 where the CPU multiplies it natively) now also runs the allocation's loss passes
(`pruning.allocation.masked_loss`) and the teacher pass. Those passes only rank proposals against each other; what
matters is that bf16's rounding is small next to the gaps between the proposals. For some checkpointed steps of a
finished run (`state/step_NNN`: the weights and masks after that step), this script measures, in fp32 and in bf16:
the loss of the step's units (a step's base), of the next step's units (a real proposal: more removed), and of
dropping each layer that still has units (the `layers` kind's passes). It reports the largest loss difference
between precisions, the smallest gap between two layer drops' losses, Kendall's tau between the two rankings of
the layer drops, whether the least costly drop is the same, and the median seconds of one pass each way.

Usage (machine to itself):
    .venv/bin/python benchmarks/allocation_precision.py --run runs/mpnet_rt_family --steps 0 3 6 \
        --else-running "nothing"
  → prints a line per step and writes benchmarks/results/allocation_precision.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from allocation_passes import allocation_setup  # noqa: E402
from family import write_result  # noqa: E402
from member_finetune import step_masks  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor.pruning.allocation import _without, kept_loss  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "allocation_precision.json"


def accelerators() -> dict[str, Accelerator]:
    """One CPU Accelerator per precision: fp32, and the same with bf16 autocast (one precision per process in
    accelerate's state, so the second one's autocast is set by hand, as a bf16 run's is)."""
    fp32, bf16 = Accelerator(cpu=True), Accelerator(cpu=True)
    bf16.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return {"fp32": fp32, "bf16": bf16}


def step_row(model: torch.nn.Module, batches: list[dict], kept, proposal) -> dict:
    """Both precisions' losses of the step's units, the next step's and each layer drop; their comparison."""
    layers = [i for i in range(kept.heads.shape[0]) if bool(kept.heads[i].any()) or bool(kept.neurons[i].any())]
    alive = kept.alive()
    masks = {"base": alive, "next step": proposal.alive()} | {f"drop {i}": _without(alive, [i]) for i in layers}
    losses, seconds = {}, {}
    for name, acc in accelerators().items():
        loss = kept_loss(model, batches, kept, acc)
        loss(alive)  # warm-up
        took, losses[name] = [], {}
        for key, mask in masks.items():
            started = time.perf_counter()
            losses[name][key] = loss(mask)
            took.append(time.perf_counter() - started)
        seconds[name] = statistics.median(took)
    drops = [f"drop {i}" for i in layers]
    ranked = {name: sorted(drops, key=lambda k: losses[name][k]) for name in losses}
    fp32_drops = sorted(losses["fp32"][k] for k in drops)
    pairs = [[losses[name][k] for k in drops] for name in ("fp32", "bf16")]
    return {
        "layers_offered": len(layers),
        "max_abs_loss_diff": max(abs(losses["bf16"][k] - losses["fp32"][k]) for k in masks),
        "next_step_gap_fp32": losses["fp32"]["next step"] - losses["fp32"]["base"],
        "smallest_drop_gap_fp32": min((b - a for a, b in zip(fp32_drops, fp32_drops[1:], strict=False)), default=None),
        "kendall_tau_drops": float(kendalltau(*pairs)[0]) if len(drops) > 1 else None,
        "same_least_costly_drop": ranked["fp32"][0] == ranked["bf16"][0] if drops else None,
        "pass_seconds": {name: round(s, 3) for name, s in seconds.items()},
        "pass_speedup": round(seconds["fp32"] / seconds["bf16"], 2),
        "losses": {name: {k: round(v, 6) for k, v in values.items()} for name, values in losses.items()},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished run with its state/ checkpoints")
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 3, 6], help="0-based checkpointed steps")
    parser.add_argument("--else-running", required=True, help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    recipe, model, batches = allocation_setup(args.run)
    p = recipe.prune
    rows = {}
    for step in args.steps:
        step_dir = args.run / "state" / f"step_{step:03d}"
        model.load_state_dict(load_file(str(step_dir / "model.safetensors")))
        kept = step_masks(step_dir)
        proposal = step_masks(args.run / "state" / f"step_{step + 1:03d}")
        row = rows[f"after step {step + 1}"] = step_row(model, batches, kept, proposal)
        print(f"after step {step + 1}: max |bf16 - fp32| loss {row['max_abs_loss_diff']:.5f}, next step's gap "
              f"{row['next_step_gap_fp32']:.4f}, smallest layer-drop gap {row['smallest_drop_gap_fp32']}, tau "
              f"{row['kendall_tau_drops']}, same least costly drop {row['same_least_costly_drop']}; one pass "
              f"{row['pass_seconds']} ({row['pass_speedup']}x)", flush=True)  # fmt: skip
    out = {
        "what": "measured-allocation loss passes in fp32 and in bf16 autocast on a finished run's checkpoints",
        "run": args.run.name, **measured_on(args.else_running), "model": recipe.model.source,
        "pass_examples": sum(len(b["labels"]) for b in batches), "batch_size": p.score_batch_size,
        "threads": torch.get_num_threads(), "steps": rows,
    }  # fmt: skip
    write_result(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
