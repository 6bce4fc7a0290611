"""Per-step checkpoints of the pruning loop: every finished step is saved atomically under `state/step_NNN/`
(weights, each step's scores and masks, the log; `step.json` marks completion), and a rerun resumes from the
newest one, ending exactly where an uninterrupted run would. A step that closes a family member keeps its
checkpoint as that member's weights (`StepRecord.weights`), so the members need no copy in memory.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from compressor.core import atomic
from compressor.core.errors import UserError
from compressor.pruning.selection import plan_to_mask
from compressor.pruning.units import Masks
from compressor.recovery.loop import PruneState, StepRecord

log = logging.getLogger("compressor")

RECORDS_FILE = "records.safetensors"  # per finished step: the scores it selected on and the head mask after it


@dataclass
class StepCheckpoints:
    """The runner's `recovery.loop.StepHook`: every finished step is saved atomically under `<root>/step_NNN/`
    (weights, each step's scores and masks, the log; `step.json` is the completion marker), and a rerun resumes from
    the newest."""

    root: Path
    main: bool

    def after_step(self, model: torch.nn.Module, state: PruneState) -> None:
        if not self.main:
            return
        weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        records = {
            "scores": torch.stack([r.scores.float().cpu() for r in state.steps]),
            "heads": torch.stack([r.masks.heads for r in state.steps]),
        }
        if state.masks.neurons is not None:
            records["neurons"] = torch.stack([r.masks.neurons for r in state.steps])
            records["neuron_scores"] = torch.stack([r.neuron_scores.float().cpu() for r in state.steps])
        if state.masks.hidden is not None:
            records["hidden"] = torch.stack([r.masks.hidden for r in state.steps])
        meta = {"step": len(state.steps) - 1, "alive": state.masks.heads.int().tolist(), "log": state.log}
        final = self.root / f"step_{len(state.steps) - 1:03d}"
        with atomic.directory(final) as tmp:
            save_file(weights, str(tmp / "model.safetensors"))
            save_file(records, str(tmp / RECORDS_FILE))
            (tmp / "step.json").write_text(json.dumps(meta))
        state.steps[-1].weights = _weights_of(final, state.steps[-1].entry)

    def resume(self, model: torch.nn.Module, fresh: PruneState) -> PruneState:
        done = sorted(p for p in self.root.glob("step_*") if (p / "step.json").exists()) if self.root.exists() else []
        if not done:
            return fresh
        last = done[-1]
        meta = json.loads((last / "step.json").read_text())
        model.load_state_dict(load_file(str(last / "model.safetensors")))
        log.info("resuming after step %d from %s", meta["step"] + 1, last)
        scores, heads = _records(last, meta["log"], fresh.masks.heads)
        neurons, neuron_scores = _neuron_records(last, len(heads), fresh.masks.neurons is not None)
        widths = _width_records(last, len(heads), fresh.masks.hidden is not None)
        rows = zip(meta["log"], scores, heads, neurons, neuron_scores, widths, strict=True)
        steps = [
            StepRecord(e, s, Masks(h, n, w), ns, _weights_of(self.root / f"step_{i:03d}", e))
            for i, (e, s, h, n, ns, w) in enumerate(rows)
        ]
        return PruneState(steps[-1].masks, steps)


def _weights_of(step_dir: Path, entry: dict):
    """For a step that closes a family member: a loader of its checkpointed weights (None for other steps)."""
    if "members" not in entry:
        return None
    return partial(load_file, str(step_dir / "model.safetensors"))


def _neuron_records(step_dir: Path, count: int, pruned: bool) -> tuple[list, list]:
    """Per finished step: the neuron mask and scores (None each when the run does not prune neurons)."""
    if not pruned:
        return [None] * count, [None] * count
    records = load_file(str(step_dir / RECORDS_FILE))
    if "neurons" not in records:
        raise UserError(f"output_dir: checkpoint '{step_dir}' holds no neuron masks; pass --force to start over")
    return list(records["neurons"]), list(records["neuron_scores"])


def _width_records(step_dir: Path, count: int, pruned: bool) -> list:
    """Per finished step: the residual channels kept (None each when the run does not prune the width)."""
    if not pruned:
        return [None] * count
    records = load_file(str(step_dir / RECORDS_FILE))
    if "hidden" not in records:
        raise UserError(f"output_dir: checkpoint '{step_dir}' holds no width masks; pass --force to start over")
    return list(records["hidden"])


def _records(step_dir: Path, steps_log: list[dict], full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, head masks) of every finished step; checkpoints written before `RECORDS_FILE` existed rebuild them
    from the JSON log (scores rounded to 6 digits there)."""
    if (step_dir / RECORDS_FILE).exists():
        records = load_file(str(step_dir / RECORDS_FILE))
        return records["scores"], records["heads"]
    scores = [
        torch.tensor([[float("-inf") if s is None else s for s in row] for row in e["scores"]]) for e in steps_log
    ]
    heads, alive = [], full
    for entry in steps_log:
        alive = plan_to_mask({int(k): v for k, v in entry["removed"].items()}, alive)
        heads.append(alive)
    return scores, torch.stack(heads)
