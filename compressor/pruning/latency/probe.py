"""Timing synthetic pieces of a BERT-like classifier: one encoder layer at given widths, and everything outside.

Synthetic layers (sliced `nn.Linear`s, SDPA attention, GELU FFN, residuals and LayerNorms) need no pruned model and
are the same for every BERT-like architecture; what a real layer does beyond them (dropout in eval, reshapes) costs
next to nothing at these sizes. Each runtime's engine runs a module its own way (`Engine.timer` of
`compressor.core.runtimes`, in `compressor.deploy.engines`): ONNX runtimes export each synthetic module with
`torch.onnx.export` and run it with ONNX Runtime's session-level graph optimisations; the offline transformer fusions
(fused Attention) of `compressor.deploy.export`'s optimised graph are not applied, so ONNX attention costs are an
upper estimate.

Timing is `core.timing.Rounds`, the benchmark's protocol, driven here (`timed_rounds`): rounds are interleaved over
every piece in a rotating order so the drift of a shared machine hits all pieces alike; within a round a piece's
time is its fastest call, across rounds the median is kept. ONNX Runtime sessions made for it do not spin their idle
worker threads (`deploy.engines.onnx_runtime`): with every piece's session alive and timed in turn, threads left
spinning by one piece took the cores from the next and made the cells uneven (a narrower layer timed slower).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from compressor.core import runtimes
from compressor.core.contention import Quiet
from compressor.core.errors import UserError
from compressor.core.timing import Rounds
from compressor.surgery.arch import arch_spec

BudgetRuntime = Literal[runtimes.BUDGET_NAMES]  # the name of a runtime a speed-up budget can be measured on
BUDGET_RUNTIMES: tuple[str, ...] = runtimes.BUDGET_NAMES  # the declared runtimes a speed-up budget can be measured on
Runtime, RUNTIMES = BudgetRuntime, BUDGET_RUNTIMES  # their former names, kept for imports (not `core.runtimes`'s)
Unit = Literal["head", "neurons"]
DEFAULT_FRACTIONS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
NEURON_BLOCK = 32  # FFN neurons of one layer a speed-up budget removes together; the table measures this width too


def check_runtime(runtime: str) -> str:
    """`runtime` if it is one the table can measure, else a one-line `UserError` naming the field."""
    if runtime not in BUDGET_RUNTIMES:
        raise UserError(f"budget.runtime: expected one of {', '.join(BUDGET_RUNTIMES)}, got {runtime!r}")
    return runtime


def is_pytorch(runtime: str) -> bool:
    """Whether `runtime` runs in this process's PyTorch (its thread count is set through torch)."""
    return runtimes.runtime(runtime).engine == "pytorch"


# ---------------------------------------------------------------------------------------------------- model shape


@dataclass(frozen=True)
class Dims:
    """The widths of a BERT-like classifier that its cost depends on (read from a transformers config)."""

    hidden: int
    heads: int
    head_size: int
    intermediate: int
    layers: int
    vocab: int
    positions: int
    num_labels: int

    @classmethod
    def from_config(cls, config) -> Dims:
        """Read a transformers config (the FFN width under the architecture's declared name,
        `ArchSpec.ffn_size_attr`)."""
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        name = arch_spec(config.model_type).ffn_size_attr
        intermediate = getattr(config, name, None)
        if intermediate is None:
            raise UserError(f"model: config of type {type(config).__name__} has no {name}")
        return cls(
            hidden=hidden,
            heads=heads,
            head_size=hidden // heads,
            intermediate=int(intermediate),
            layers=int(config.num_hidden_layers),
            vocab=int(config.vocab_size),
            positions=int(getattr(config, "max_position_embeddings", 512)),
            num_labels=int(getattr(config, "num_labels", 2)),
        )

    def full(self) -> Widths:
        """The unpruned model's widths."""
        return Widths(heads=(self.heads,) * self.layers, neurons=(self.intermediate,) * self.layers)


@dataclass(frozen=True)
class Widths:
    """Heads and FFN neurons kept in each layer of a (pruned) model; a layer with (0, 0) is removed."""

    heads: tuple[int, ...]
    neurons: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.heads) != len(self.neurons):
            raise UserError(f"widths: {len(self.heads)} head counts but {len(self.neurons)} neuron counts")


# ---------------------------------------------------------------------------------------------------- synthetic modules


class SyntheticLayer(nn.Module):
    """One post-LayerNorm encoder layer with `heads` heads of `head_size` and `neurons` FFN neurons.

    A block with no units keeps what the pruned model keeps: its output bias, residual and LayerNorm.
    """

    def __init__(self, dims: Dims, heads: int, neurons: int):
        super().__init__()
        self.heads, self.head_size = heads, dims.head_size
        width = heads * dims.head_size
        self.qkv = nn.Linear(dims.hidden, 3 * width) if heads else None
        self.attn_out = nn.Linear(width, dims.hidden) if heads else None
        self.attn_bias = nn.Parameter(torch.zeros(dims.hidden))
        self.ffn_in = nn.Linear(dims.hidden, neurons) if neurons else None
        self.ffn_out = nn.Linear(neurons, dims.hidden) if neurons else None
        self.ffn_bias = nn.Parameter(torch.zeros(dims.hidden))
        self.norm1, self.norm2 = nn.LayerNorm(dims.hidden), nn.LayerNorm(dims.hidden)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        if self.qkv is None:
            return self.attn_bias.expand_as(x)
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_size).permute(2, 0, 3, 1, 4).unbind(0)
        context = F.scaled_dot_product_attention(q, k, v)
        return self.attn_out(context.transpose(1, 2).reshape(b, t, self.heads * self.head_size))

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        if self.ffn_in is None:
            return self.ffn_bias.expand_as(x)
        return self.ffn_out(F.gelu(self.ffn_in(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self._attention(x))
        return self.norm2(x + self._ffn(x))


class SyntheticOutside(nn.Module):
    """Everything but the encoder layers: embeddings (word, position, type, LayerNorm), pooler and classifier."""

    def __init__(self, dims: Dims):
        super().__init__()
        self.word = nn.Embedding(dims.vocab, dims.hidden)
        self.position = nn.Embedding(dims.positions, dims.hidden)
        self.token_type = nn.Embedding(2, dims.hidden)
        self.norm = nn.LayerNorm(dims.hidden)
        self.pooler = nn.Linear(dims.hidden, dims.hidden)
        self.classifier = nn.Linear(dims.hidden, dims.num_labels)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        embedded = self.word(input_ids) + self.position(positions) + self.token_type(torch.zeros_like(input_ids))
        hidden = self.norm(embedded)
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))


# ---------------------------------------------------------------------------------------------------- running


def runtime_threads(runtime: str, threads: int | None) -> int:
    """The intra-op thread count `runtime` will use: `threads`, else the runtime's default."""
    if threads is not None:
        return int(threads)
    if is_pytorch(runtime):
        return torch.get_num_threads()
    from compressor.core.timing import ort_default_threads

    return ort_default_threads()


def runner(
    module: nn.Module, example: torch.Tensor, runtime: str, threads: int | None, workdir: Path
) -> Callable[[], object]:
    """A no-argument call that runs `module` on `example` once in `runtime` (eval mode, no autograd), built by the
    runtime's engine (`compressor.core.runtimes.Engine.timer`)."""
    declared = runtimes.runtime(check_runtime(runtime))
    return runtimes.engine_of(runtime).timer(declared, module.eval(), example, threads, workdir)


def timed_rounds(
    calls: Mapping[Hashable, Callable[[], object]],
    rounds: int,
    min_time_s: float,
    min_calls: int = 3,
    warmup: int = 1,
    groups: Sequence[Sequence[Hashable]] | None = None,
    quiet: Quiet | None = None,
) -> dict[Hashable, list[float]]:
    """Seconds per call of each of `calls` (`{key: a call of no arguments}`), one figure per round: the benchmark's
    protocol (`core.timing.Rounds`; `groups` default: all calls in one), driven here."""
    schedule = Rounds([list(calls)] if groups is None else groups, rounds, min_time_s, min_calls, warmup, quiet=quiet)
    for visit in schedule:
        for _ in visit:
            calls[visit.key]()
    return schedule.per_round


def measure(
    calls: Mapping[Hashable, Callable[[], object]], rounds: int = 3, min_time_s: float = 0.05, warmup: int = 1
) -> dict[Hashable, float]:
    """Milliseconds per call of each of `calls`: median over interleaved rotating rounds (`timed_rounds`,
    the benchmark's protocol) of each round's fastest call."""
    per_round = timed_rounds(calls, rounds, min_time_s, warmup=warmup)
    return {name: float(np.median(times)) * 1e3 for name, times in per_round.items()}


def grid_counts(total: int, fractions: Sequence[float], smallest: int = 0) -> list[int]:
    """Distinct unit counts at `fractions` of `total` (0 and `total` always included), ascending, plus `smallest`
    (the narrowest non-empty width a pruner leaves: one head, one block of neurons) when it is between them.

    A block with no units at all skips its operations, so the step from 0 to the first non-empty width is the
    block's fixed cost (its matrix products' calls, the softmax, thread hand-offs); interpolated between 0 and the
    first fraction that cost would be spread over the units of that cell, and each of a layer's last units would
    seem to save a share of it (see `LatencyTable`)."""
    if any(not 0.0 <= f <= 1.0 for f in fractions):
        raise UserError(f"latency.grid: expected fractions from 0 to 1, got {list(fractions)}")
    extra = {smallest} if 0 < smallest < total else set()
    return sorted({0, total, *(round(f * total) for f in fractions), *extra})


def measure_grid(
    dims: Dims,
    runtime: str,
    batch_size: int,
    seq_len: int,
    threads: int | None,
    heads_grid: Sequence[int],
    neurons_grid: Sequence[int],
    rounds: int = 3,
    min_time_s: float = 0.05,
) -> dict[Hashable, float]:
    """Median-of-rounds milliseconds of every grid layer (keyed (heads, neurons)) and of the outside ("outside").
    Nine arguments: the shape, runtime and timing settings `LatencyTable.build` resolved, passed on singly."""
    torch.manual_seed(0)
    hidden = torch.randn(batch_size, seq_len, dims.hidden)
    ids = torch.randint(0, dims.vocab, (batch_size, seq_len))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        calls: dict = {
            (h, n): runner(SyntheticLayer(dims, h, n), hidden, runtime, threads, work)
            for h in heads_grid
            for n in neurons_grid
        }
        calls["outside"] = runner(SyntheticOutside(dims), ids, runtime, threads, work)
        return measure(calls, rounds=rounds, min_time_s=min_time_s)
