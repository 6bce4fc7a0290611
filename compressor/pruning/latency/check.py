"""The measured speed-up of a real pruned model over its original, to correct the latency table during a run.

The table sums synthetic layers timed one at a time; a real model adds what they lack (attention-mask handling,
memory traffic of the full weights), and that share shrinks as the model is pruned, so the table's prediction and the
measured speed-up part ways (by tens of percent: docs/lab/history.md). A speed-up budget therefore times the
physically pruned copy against the unpruned copy after every step, on the budget's runtime, batch and length, and
scales the table's later predictions by measured / predicted (`compressor.pruning.budget.Budget.calibrate`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from compressor.core.timing import set_threads
from compressor.pruning.deployed import as_deployed
from compressor.pruning.latency.probe import check_runtime, is_pytorch, runner, timed_rounds


class _Logits(nn.Module):
    """A classifier called with token ids only, returning its logits (a plain tensor, so it exports to ONNX)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits


def _for_timing(model: nn.Module) -> nn.Module:
    """`model` as deployed (`as_deployed`: a copy with SDPA attention where its architecture has it, as the benchmark
    times it), called with token ids only."""
    return _Logits(as_deployed(model))


def measured_speedup(
    original: nn.Module,
    pruned: nn.Module,
    runtime: str,
    batch_size: int,
    seq_len: int,
    threads: int | None = None,
    rounds: int = 5,
    min_time_s: float = 1.0,
    min_calls: int = 1,
) -> float:
    """The median over interleaved rounds of `original`'s time over `pruned`'s in the same round, timed on `runtime`
    (ONNX runtimes export each to a temporary graph first) with a batch of `batch_size` random token sequences of
    `seq_len`; a visit keeps the fastest of at least `min_calls` calls lasting `min_time_s` together. Paired by round,
    the ratio does not drift with the machine's speed. A small model's call takes tens of milliseconds, and the
    fastest of a second's worth of them is steadier than of two or three (a step that times short selects more units
    and times again); a base-size model's one call outlasts the second, and the benchmark's three would triple what
    this costs at every step. Both are timed as deployed (`as_deployed` copies), so neither is changed."""
    check_runtime(runtime)
    vocab = int(original.config.vocab_size)
    ids = torch.randint(
        1000 if vocab > 2000 else 0, vocab, (batch_size, seq_len), generator=torch.Generator().manual_seed(0)
    )
    previous = torch.get_num_threads()
    if is_pytorch(runtime):
        set_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            calls = {
                name: runner(_for_timing(model), ids, runtime, threads, Path(tmp))
                for name, model in (("original", original), ("pruned", pruned))
            }
            seconds = timed_rounds(calls, rounds, min_time_s, min_calls=min_calls, warmup=2)
    finally:
        torch.set_num_threads(previous)
    return float(np.median(np.array(seconds["original"]) / np.array(seconds["pruned"])))
