"""The measured speed-up of a real pruned model over its original, to correct the latency table during a run.

The table sums synthetic layers timed one at a time; a real model adds what they lack (attention-mask handling,
memory traffic of the full weights), and that share shrinks as the model is pruned, so the table's prediction and the
measured speed-up part ways (by tens of percent: docs/lab/history.md). A speed-up budget therefore times the
physically pruned copy against the unpruned copy after every step, on the budget's runtime, batch and length, and
scales the table's later predictions by measured / predicted (`compressor.pruning.budget.Budget.calibrate`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from compressor.core import atomic
from compressor.core.timing import set_threads
from compressor.pruning.deployed import as_deployed
from compressor.pruning.latency.probe import Dims, check_runtime, is_pytorch, runner, timed_rounds
from compressor.pruning.latency.table import cache_key, default_cache_dir

log = logging.getLogger(__name__)


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
    vocab = min(int(original.config.vocab_size), int(pruned.config.vocab_size))  # ids every model's table holds
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


def reference_speedup(
    config,
    reference_config,
    runtime: str,
    batch_size: int,
    seq_len: int,
    num_labels: int,
    *,
    cache_dir: str | Path | None = None,
) -> float:
    """The measured speed-up of a classifier of `reference_config` over one of `config` (each `num_labels` wide) on
    `runtime`: `measured_speedup` of the two built from their configs, since speed depends on shape, not weights, so
    it is known before any weights load. Cached beside the latency tables under the same key (machine, library
    versions, runtime, batch, length) and both shapes: the repeats of one recipe (`--seeds`) and a resumed run read
    the same figure, so their targets and members are the same."""
    from compressor.surgery.checkpoint import _build as build_classifier

    shapes = [asdict(replace(Dims.from_config(c), num_labels=num_labels)) for c in (config, reference_config)]
    key = {**cache_key(Dims.from_config(config), runtime, batch_size, seq_len, None, [], []), "shapes": shapes}
    key["types"] = [config.model_type, reference_config.model_type]
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = Path(cache_dir) if cache_dir else default_cache_dir()
    path = path / f"reference-{runtime}-b{batch_size}-s{seq_len}-{digest}.json"
    if path.exists():
        return float(json.loads(path.read_text())["speedup"])
    models = []
    for c in (config, reference_config):
        c = copy.deepcopy(c)
        c.num_labels = num_labels
        models.append(build_classifier(c, "eager", torch.float32))
    log.info("budget: timing the reference's shape against the model's on %s (batch %d, %d tokens)", runtime,
             batch_size, seq_len)  # fmt: skip
    with tqdm(total=1, desc=f"reference speed on {runtime}", leave=False) as bar:  # a minute on base-size models
        speedup = measured_speedup(models[0], models[1], runtime, batch_size, seq_len)
        bar.update()
    atomic.write_text(path, json.dumps({"key": key, "speedup": speedup}, indent=1, default=str))
    return speedup
