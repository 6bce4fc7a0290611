"""Benchmark candidates: a name, a `predict(batch) -> logits` function, size, FLOPs and heads per layer.

PyTorch models become candidates through `pytorch_candidate`, export variants through `exported_candidate` (each
loaded by its runtime's engine, `compressor.core.runtimes`), so the measuring code never knows which runtime it times.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

from compressor.core.errors import UserError
from compressor.pruning.deployed import as_deployed
from compressor.sources.batches import input_keys

Batch = dict[str, torch.Tensor]
as_sdpa = as_deployed  # the model as deployed (SDPA), for timing; kept under its public name


@dataclass
class Candidate:
    """One thing to benchmark.

    predict: logits (numpy, [batch, labels]) for one tokenised batch; it ignores keys its model does not take.
    size_bytes: weights on disk. flops_per_example: encoder FLOPs at the first (headline) sequence length (None if
    unknown); flops_by_seq_len: encoder FLOPs per sequence length, when known for several.
    threads: intra-op threads of its runtime when fixed at construction (ONNX Runtime sessions), else None.
    eval_batches: its own tokenised evaluation batches, for a model with another tokenizer than the bench's (the
    same examples in the same order, so the paired comparisons hold); None: the bench's batches. val_batches: the
    same for the validation examples (where it has eval_batches; without them such a candidate has no validation
    accuracy).
    """

    name: str
    predict: Callable[[Batch], np.ndarray]
    size_bytes: int
    flops_per_example: int | None
    kind: str  # the engine it runs on (`compressor.core.runtimes.Runtime.engine`): "pytorch", "onnx", "openvino"
    heads_per_layer: list[int] | None = None
    vocab_size: int | None = None
    threads: int | None = None
    extra: dict = field(default_factory=dict)
    flops_by_seq_len: dict[int, int] = field(default_factory=dict)
    eval_batches: Sequence[Batch] | None = None
    val_batches: Sequence[Batch] | None = None

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
    from compressor.surgery.arch import present_heads
    from compressor.surgery.cost import encoder_flops

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


def exported_candidate(
    name: str,
    runtime: str,
    variant_dir: str | Path,
    threads: int | None = None,
    flops_per_example: int | Mapping[int, int] | None = None,
    heads_per_layer: list[int] | None = None,
) -> Candidate:
    """An export variant (a directory written by `compressor.deploy.export`) of the declared `runtime` as a candidate,
    loaded by the runtime's engine (`compressor.core.runtimes.Engine.load`).

    Exported engines fix their thread count when the session (compiled model) is created, so `threads` is given
    here; left None, the runtime picks its default and the candidate records that count. A PyTorch variant runs on
    the process's threads (None). FLOPs and heads are those of the PyTorch model it was exported from (FLOPs as one
    int for the headline length or `{seq_len: flops}`, e.g. the PyTorch candidate's `flops_by_seq_len`); pass them
    to get FLOP-ideal ratios.
    """
    from compressor.core.runtimes import engine_of
    from compressor.core.runtimes import runtime as declared

    spec = declared(runtime, "bench runtime")
    variant_dir = Path(variant_dir)
    if not variant_dir.is_dir():
        raise UserError(f"{spec.engine}: variant directory '{variant_dir}' not found")
    classifier = engine_of(runtime).load(spec, variant_dir, threads)
    keys = input_keys(classifier.input_names)

    def predict(batch: Batch) -> np.ndarray:
        return np.asarray(classifier({k: batch[k] for k in keys if k in batch}))

    by_seq = {int(k): int(v) for k, v in flops_per_example.items()} if isinstance(flops_per_example, Mapping) else {}
    return Candidate(
        name=name,
        predict=predict,
        size_bytes=int(classifier.size_bytes),
        flops_per_example=next(iter(by_seq.values())) if by_seq else flops_per_example,
        kind=spec.engine,
        heads_per_layer=heads_per_layer,
        threads=threads if threads is not None else classifier.threads,
        extra={"threads_note": classifier.threads_note} if threads is None and classifier.threads_note else {},
        flops_by_seq_len=by_seq,
    )


def onnx_candidate(
    name: str,
    variant_dir: str | Path,
    threads: int | None = None,
    flops_per_example: int | Mapping[int, int] | None = None,
    heads_per_layer: list[int] | None = None,
    kind: str = "onnx",
) -> Candidate:
    """Any ONNX variant directory as a candidate (`kind` "openvino": any OpenVINO IR directory): every variant of
    one engine loads alike, so this is `exported_candidate` on the engine's first declared runtime."""
    from compressor.core.runtimes import declared, engines

    engine = next((e for e in engines() if e.name == kind), None)
    if engine is None:
        raise UserError(f"bench: candidate kind {kind!r} is no engine; expected one of onnx, openvino")
    runtime = next(r.name for r in declared(engine) if r.variant is not None)
    return exported_candidate(name, runtime, variant_dir, threads, flops_per_example, heads_per_layer)


openvino_candidate = partial(onnx_candidate, kind="openvino")  # an OpenVINO IR variant's directory as a candidate


def runtime_candidate(
    name: str,
    runtime: str,
    source: nn.Module | str | Path,
    seq_lens: int | Sequence[int],
    threads: int | None = None,
    like: Candidate | None = None,
) -> Candidate:
    """The candidate `name` of a model built for the declared `runtime`: `source` is what its export step made (a
    saved model directory or an in-memory model for a runtime with no export variant, a variant directory for the
    others, loaded by its engine); `like` is the PyTorch candidate of the same model, whose FLOPs and heads an
    exported variant shares."""
    from compressor.core.runtimes import runtime as declared
    from compressor.surgery.checkpoint import load_pruned

    if isinstance(source, nn.Module):
        return pytorch_candidate(name, source, seq_lens)
    if declared(runtime, "bench runtime").variant is None:  # the saved model itself, loaded as users deploy it
        return pytorch_candidate(name, load_pruned(source, attn_implementation="sdpa"), seq_lens, source)
    flops = like.flops_by_seq_len or like.flops_per_example if like is not None else None
    heads = like.heads_per_layer if like is not None else None
    return exported_candidate(name, runtime, source, threads, flops, heads)
