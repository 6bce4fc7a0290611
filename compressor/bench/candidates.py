"""Benchmark candidates: a name, a `predict(batch) -> logits` function, size, FLOPs and heads per layer.

PyTorch models and ONNX variants become candidates through `pytorch_candidate` and `onnx_candidate`, so the
measuring code never knows which runtime it times.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from compressor.batches import input_keys
from compressor.errors import UserError

Batch = dict[str, torch.Tensor]


@dataclass
class Candidate:
    """One thing to benchmark.

    predict: logits (numpy, [batch, labels]) for one tokenised batch; it ignores keys its model does not take.
    size_bytes: weights on disk. flops_per_example: encoder FLOPs at the first (headline) sequence length (None if
    unknown); flops_by_seq_len: encoder FLOPs per sequence length, when known for several.
    threads: intra-op threads of its runtime when fixed at construction (ONNX Runtime sessions), else None.
    """

    name: str
    predict: Callable[[Batch], np.ndarray]
    size_bytes: int
    flops_per_example: int | None
    kind: Literal["pytorch", "onnx"]
    heads_per_layer: list[int] | None = None
    vocab_size: int | None = None
    threads: int | None = None
    extra: dict = field(default_factory=dict)
    flops_by_seq_len: dict[int, int] = field(default_factory=dict)

    def flops_at(self, seq_len: int, headline_seq_len: int) -> int | None:
        """Encoder FLOPs per example at `seq_len`; `flops_per_example` alone counts as the headline length's."""
        if self.flops_by_seq_len:
            return self.flops_by_seq_len.get(seq_len)
        return self.flops_per_example if seq_len == headline_seq_len else None


def _dir_size(path: Path, patterns: Sequence[str]) -> int:
    return sum(f.stat().st_size for pattern in patterns for f in path.glob(pattern) if f.is_file())


def lengths_of(seq_lens: int | Sequence[int]) -> list[int]:
    return [int(seq_lens)] if isinstance(seq_lens, int) else [int(s) for s in seq_lens]


def check_names(candidates: Sequence[Candidate]) -> None:
    names = [c.name for c in candidates]
    if not names:
        raise UserError("bench: no candidates to benchmark")
    if len(set(names)) != len(names):
        raise UserError(f"bench: candidate names must be unique, got {names}")


def pytorch_candidate(
    name: str, model: nn.Module, seq_lens: int | Sequence[int], model_dir: str | Path | None = None
) -> Candidate:
    """A PyTorch classifier as a candidate (eval mode, `torch.inference_mode`).

    FLOPs are computed at each of `seq_lens` (one int or several; the first is the headline length). Size is the
    safetensors weight files of `model_dir` when given, else the in-memory parameter bytes.
    """
    from compressor.cost import encoder_flops
    from compressor.layout import present_heads

    model = model.eval()
    keys = input_keys(inspect.signature(model.forward).parameters)

    def predict(batch: Batch) -> np.ndarray:
        with torch.inference_mode():
            return model(**{k: batch[k] for k in keys if k in batch}).logits.float().numpy()

    size = _dir_size(Path(model_dir), ["*.safetensors"]) if model_dir is not None else 0
    if size == 0:
        size = sum(p.numel() * p.element_size() for p in model.parameters())
    flops = {s: int(encoder_flops(model, s)) for s in lengths_of(seq_lens)}
    return Candidate(
        name=name,
        predict=predict,
        size_bytes=int(size),
        flops_per_example=next(iter(flops.values())),
        kind="pytorch",
        heads_per_layer=[len(h) for h in present_heads(model)],
        vocab_size=int(model.get_input_embeddings().num_embeddings),
        flops_by_seq_len=flops,
    )


def onnx_candidate(
    name: str,
    variant_dir: str | Path,
    threads: int | None = None,
    flops_per_example: int | Mapping[int, int] | None = None,
    heads_per_layer: list[int] | None = None,
) -> Candidate:
    """An exported ONNX variant (a directory written by `compressor.export`) as a candidate.

    ONNX Runtime fixes its intra-op thread count when the session is created, so `threads` is given here; left
    None, ONNX Runtime picks its default and the candidate records that count (`ort_default_threads`).
    FLOPs and heads are those of the PyTorch model it was exported from (FLOPs as one int for the headline length
    or `{seq_len: flops}`, e.g. the PyTorch candidate's `flops_by_seq_len`); pass them to get FLOP-ideal ratios.
    """
    from compressor.export import OnnxClassifier

    variant_dir = Path(variant_dir)
    if not variant_dir.is_dir():
        raise UserError(f"onnx: variant directory '{variant_dir}' not found")
    classifier = OnnxClassifier(variant_dir, threads)
    keys = input_keys(classifier.input_names)

    def predict(batch: Batch) -> np.ndarray:
        return np.asarray(classifier({k: batch[k] for k in keys if k in batch}))

    size = classifier.size_bytes
    by_seq = {int(k): int(v) for k, v in flops_per_example.items()} if isinstance(flops_per_example, Mapping) else {}
    return Candidate(
        name=name,
        predict=predict,
        size_bytes=int(size),
        flops_per_example=next(iter(by_seq.values())) if by_seq else flops_per_example,
        kind="onnx",
        heads_per_layer=heads_per_layer,
        threads=threads if threads is not None else ort_default_threads(),
        extra={} if threads is not None else {"threads_note": ORT_DEFAULT_NOTE},
        flops_by_seq_len=by_seq,
    )


ORT_DEFAULT_NOTE = "not set: ONNX Runtime's default, one intra-op thread per physical core"


def ort_default_threads() -> int:
    """The intra-op thread count ONNX Runtime uses when none is set: one per physical core of the machine.

    ONNX Runtime does not report it (SessionOptions keeps 0), so it is counted here from the CPU topology
    (distinct package/core pairs of /sys/devices/system/cpu); with onnxruntime 1.32 on Linux this matches the
    threads a default session starts, whatever the process's CPU affinity. Falls back to `os.cpu_count()`.
    """
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            continue
    return len(cores) or os.cpu_count() or 1
