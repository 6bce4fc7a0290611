"""`LatencyTable`: predicted milliseconds of any pruned shape from a measured per-layer grid, and its cache.

A model's predicted time is the outside cost (embeddings, pooler, classifier) plus the sum of its layers' costs, each
interpolated bilinearly (`scipy.interpolate.RegularGridInterpolator`) from a (heads kept, neurons kept) grid timed by
`compressor.pruning.latency.probe`. A layer with no heads and no neurons costs 0 (it is removed entirely), so removing a
layer's last unit saves the whole layer, including what an emptied layer would still cost (LayerNorms, biases).

`load_or_build` caches a table as JSON under a name built from the runtime, batch, length and model shape, and stores
the full key (CPU model, core count, threads, torch / onnxruntime versions, shape, grid); a key that does not match
(another machine, an upgrade) rebuilds and overwrites.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy.interpolate import RegularGridInterpolator

from compressor.core import atomic
from compressor.core.errors import UserError
from compressor.core.machine import cache_root, cpu_identity
from compressor.core.timing import set_threads
from compressor.pruning.latency.probe import (
    DEFAULT_FRACTIONS,
    NEURON_BLOCK,
    Dims,
    Unit,
    Widths,
    check_runtime,
    grid_counts,
    is_pytorch,
    measure_grid,
    runtime_threads,
)

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: one head and one neuron block measured (`grid_axes`)

# ---------------------------------------------------------------------------------------------------- the table

WidthsLike = Widths | tuple[Sequence[int], Sequence[int]]


def _widths(shape: WidthsLike) -> Widths:
    """`Widths` from itself or from a (heads per layer, neurons per layer) pair."""
    if isinstance(shape, Widths):
        return shape
    heads, neurons = shape
    return Widths(heads=tuple(int(h) for h in heads), neurons=tuple(int(n) for n in neurons))


@dataclass
class LatencyTable:
    """Measured milliseconds per call of one encoder layer over a (heads, neurons) grid, plus the outside cost.

    `layer_grid_ms[i][j]` is a layer with `heads_grid[i]` heads and `neurons_grid[j]` neurons; cell (0, 0) is an
    emptied layer, used only to interpolate near that corner: a layer with no units at all costs 0 (removed).
    Times are per forward call of a batch of `batch_size` sequences of `seq_len` tokens on `runtime`.
    `build` makes the grid monotone (`monotone_grid`; the raw medians are kept in `measured_grid_ms`), so removing a
    unit never costs time: `marginal_ms` is never negative, though it can be 0 where the grid is flat.
    The grid includes one head and one block of neurons (`grid_axes`): a block's fixed cost then lies between its
    one-unit width and 0, so only removing its last unit saves it. Interpolated from 0 to the first fraction (a
    quarter of the heads or neurons), that cost was credited in shares to each of a block's last units, which made
    them look cheap per millisecond: selections emptied FFNs and cut heads to the per-layer minimum, more so on CPUs
    whose fixed costs are larger against their per-unit ones.
    """

    runtime: str
    batch_size: int
    seq_len: int
    threads: int
    dims: Dims
    heads_grid: list[int]
    neurons_grid: list[int]
    layer_grid_ms: list[list[float]]
    outside_ms: float
    key: dict = field(default_factory=dict)
    measured_grid_ms: list[list[float]] | None = None
    _interp: RegularGridInterpolator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        values = np.asarray(self.layer_grid_ms, dtype=float)
        axes = (np.asarray(self.heads_grid, dtype=float), np.asarray(self.neurons_grid, dtype=float))
        self._interp = RegularGridInterpolator(axes, values, method="linear")

    @classmethod
    def build(
        cls,
        config,
        runtime: str,
        batch_size: int,
        seq_len: int,
        threads: int | None = None,
        grid: Sequence[float] = DEFAULT_FRACTIONS,
        rounds: int = 3,
        min_time_s: float = 0.05,
    ) -> LatencyTable:
        """Measure the table for a transformers `config` (or `Dims`) on this machine now.

        `grid`: fractions of the heads and of the FFN neurons at which layers are timed (0 and 1 always added, and
        one head and one neuron block: `grid_axes`).
        `threads`: intra-op threads (None: the runtime's default; recorded either way). The keyword settings are
        the recipe's budget fields, passed singly so the API and benchmarks/ build tables without a recipe.
        """
        dims = config if isinstance(config, Dims) else Dims.from_config(config)
        check_runtime(runtime)
        _check_sizes(dims, batch_size, seq_len)
        heads_grid, neurons_grid = grid_axes(dims, grid)
        previous = torch.get_num_threads()
        if is_pytorch(runtime):
            set_threads(threads)
        try:
            ms = measure_grid(dims, runtime, batch_size, seq_len, threads, heads_grid, neurons_grid, rounds, min_time_s)
        finally:
            torch.set_num_threads(previous)
        measured = [[ms[(h, n)] for n in neurons_grid] for h in heads_grid]
        return cls(
            runtime=runtime,
            batch_size=batch_size,
            seq_len=seq_len,
            threads=runtime_threads(runtime, threads),
            dims=dims,
            heads_grid=heads_grid,
            neurons_grid=neurons_grid,
            layer_grid_ms=monotone_grid(measured),
            outside_ms=ms["outside"],
            measured_grid_ms=measured,
            key=cache_key(dims, runtime, batch_size, seq_len, threads, heads_grid, neurons_grid),
        )

    def layer_ms(self, heads: int, neurons: int) -> float:
        """Predicted milliseconds of one layer with `heads` heads and `neurons` FFN neurons (0 when both are 0)."""
        if not (0 <= heads <= self.dims.heads and 0 <= neurons <= self.dims.intermediate):
            raise ValueError(
                f"latency: a layer has 0..{self.dims.heads} heads and 0..{self.dims.intermediate} neurons,"
                f" got ({heads}, {neurons})"
            )
        if heads == 0 and neurons == 0:
            return 0.0
        return float(self._interp((heads, neurons)))

    def model_ms(self, heads_per_layer: Sequence[int], neurons_per_layer: Sequence[int]) -> float:
        """Predicted milliseconds of a whole model call: the outside cost plus every layer's."""
        widths = _widths((heads_per_layer, neurons_per_layer))
        return self.outside_ms + sum(self.layer_ms(h, n) for h, n in zip(widths.heads, widths.neurons, strict=True))

    def speedup(self, original: WidthsLike, pruned: WidthsLike) -> float:
        """Predicted speed-up of `pruned` over `original` (each `Widths` or a (heads, neurons) per-layer pair)."""
        a, b = _widths(original), _widths(pruned)
        return self.model_ms(a.heads, a.neurons) / self.model_ms(b.heads, b.neurons)

    def marginal_ms(self, layer_heads: int, layer_neurons: int, unit: Unit, count: int = 1) -> float:
        """Milliseconds saved by removing `count` more heads (unit "head") or neurons (unit "neurons", e.g. one
        block) from a layer that has `layer_heads` heads and `layer_neurons` neurons now.

        This is what a pruner divides a unit's importance by, so heads and neuron blocks compete on importance per
        millisecond saved. Removing a layer's last units also saves the emptied layer's cost (the layer goes).
        """
        have = {"head": layer_heads, "neurons": layer_neurons}.get(unit)
        if have is None:
            raise ValueError(f"latency: unit must be 'head' or 'neurons', got {unit!r}")
        if not 1 <= count <= have:
            raise ValueError(f"latency: cannot remove {count} {unit}(s) from a layer with {have}")
        after = (layer_heads - count, layer_neurons) if unit == "head" else (layer_heads, layer_neurons - count)
        return self.layer_ms(layer_heads, layer_neurons) - self.layer_ms(*after)

    def to_dict(self) -> dict:
        """JSON-ready contents (the interpolator is rebuilt on load)."""
        data = asdict(self)
        data.pop("_interp", None)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> LatencyTable:
        data = dict(data)
        data.pop("_interp", None)
        return cls(**{**data, "dims": Dims(**data["dims"])})


def grid_axes(dims: Dims, grid: Sequence[float]) -> tuple[list[int], list[int]]:
    """The heads and neuron counts a table is measured at: `grid`'s fractions, plus one head and one block of
    `NEURON_BLOCK` neurons, so a block's fixed cost is saved only by removing its last unit (`grid_counts`)."""
    return grid_counts(dims.heads, grid, 1), grid_counts(dims.intermediate, grid, NEURON_BLOCK)


def monotone_grid(grid_ms: Sequence[Sequence[float]]) -> list[list[float]]:
    """Each cell lowered to the cheapest time of any cell with at least as many heads and neurons.

    A layer's true cost grows with its widths, and noise on a shared machine only ever adds time, so where a wider
    cell was measured faster, that faster time is the better estimate for the narrower one too.
    """
    values = np.asarray(grid_ms, dtype=float)
    cheapest_above = np.minimum.accumulate(np.minimum.accumulate(values[::-1, ::-1], axis=0), axis=1)[::-1, ::-1]
    return cheapest_above.tolist()


def _check_sizes(dims: Dims, batch_size: int, seq_len: int) -> None:
    """One-line errors for a batch or length the table cannot be measured at (named as the recipe's budget)."""
    if batch_size < 1:
        raise UserError(f"budget.batch_size: expected a positive batch size, got {batch_size}")
    if not 1 <= seq_len <= dims.positions:
        raise UserError(f"budget.seq_len: expected 1 to {dims.positions} tokens (the model's maximum), got {seq_len}")


# ---------------------------------------------------------------------------------------------------- cache


def cache_key(dims: Dims, runtime: str, batch_size: int, seq_len: int, threads: int | None, heads_grid, neurons_grid):
    """Everything a cached table's numbers depend on: machine, library versions, threads, shape, grid."""
    import onnxruntime

    return {
        "version": CACHE_VERSION,
        "cpu": cpu_identity(),
        "cpu_count": os.cpu_count(),
        "threads": runtime_threads(runtime, threads),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        **_engine_version(runtime),
        "runtime": runtime,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "dims": asdict(dims),
        "heads_grid": list(heads_grid),
        "neurons_grid": list(neurons_grid),
    }


def _engine_version(runtime: str) -> dict:
    """{package: version} of what runs `runtime` (`Engine.versions`): its tables are redone when one is upgraded."""
    from compressor.core.runtimes import engine_of

    return engine_of(runtime).versions()


def default_cache_dir() -> Path:
    """`$COMPRESSOR_CACHE/latency` (default `~/.cache/compressor/latency`)."""
    return cache_root() / "latency"


def cache_file(dims: Dims, runtime: str, batch_size: int, seq_len: int, cache_dir: Path) -> Path:
    """The table's file: readable runtime / batch / length plus a digest of the model shape."""
    digest = hashlib.sha256(json.dumps(asdict(dims), sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir / f"{runtime}-b{batch_size}-s{seq_len}-{digest}.json"


def _read_cached(path: Path, key: dict) -> LatencyTable | None:
    """The table stored at `path` if it exists, parses and was measured under exactly `key`; else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        log.info("latency: cached table %s was measured elsewhere or with other settings; rebuilding", path.name)
        return None
    try:
        return LatencyTable.from_dict(data)
    except (TypeError, KeyError, ValueError):
        return None


def load_file(path: str | Path, config, runtime: str, batch_size: int, seq_len: int) -> LatencyTable:
    """A table read from `path` (a JSON file as `load_or_build` caches it, e.g. measured on another CPU), checked
    against the model shape and the budget's runtime, batch size and length; a one-line `UserError` naming
    `prune.budget.latency_table` when it cannot be read or does not fit."""
    field_name, dims = "prune.budget.latency_table", config if isinstance(config, Dims) else Dims.from_config(config)
    try:
        table = LatencyTable.from_dict(json.loads(Path(path).read_text()))
    except OSError as err:
        raise UserError(f"{field_name}: cannot read {path} ({err.strerror}); expected a latency table JSON") from None
    except (ValueError, TypeError, KeyError, AttributeError):
        raise UserError(f"{field_name}: {path} is no latency table; expected the JSON load_or_build caches") from None
    wanted = {"runtime": runtime, "batch_size": batch_size, "seq_len": seq_len, "dims": dims}
    for name, value in wanted.items():
        if getattr(table, name) != value:
            raise UserError(
                f"{field_name}: {path} was measured for {name} {getattr(table, name)}; expected {value} (the budget "
                "and the model this run prunes)"
            )
    log.info("latency: table forced from %s (measured on %s)", path, table.key.get("cpu", "an unrecorded CPU"))
    if 1 not in table.heads_grid or min(NEURON_BLOCK, dims.intermediate) not in table.neurons_grid:
        log.warning("latency: %s has no one-head / one-block widths: a block's last units look cheaper than they are"
                    " (measure it again with this version)", path)  # fmt: skip
    return table


def load_or_build(
    config,
    runtime: str,
    batch_size: int,
    seq_len: int,
    threads: int | None = None,
    *,
    cache_dir: str | Path | None = None,
    grid: Sequence[float] = DEFAULT_FRACTIONS,
    **timing,
) -> LatencyTable:
    """The cached table for this machine and model shape, measured (and cached) first when there is none.

    `cache_dir`: default `default_cache_dir()`. `grid`, `timing` (`rounds`, `min_time_s`): as for
    `LatencyTable.build`; the timing settings do not enter the key.
    """
    dims = config if isinstance(config, Dims) else Dims.from_config(config)
    check_runtime(runtime)
    path = cache_file(dims, runtime, batch_size, seq_len, Path(cache_dir) if cache_dir else default_cache_dir())
    key = cache_key(dims, runtime, batch_size, seq_len, threads, *grid_axes(dims, grid))
    table = _read_cached(path, key)
    if table is None:
        shape = f"{runtime} at width {dims.hidden} (batch {batch_size}, {seq_len} tokens)"
        log.info("latency table: timing %s", shape)
        start = time.perf_counter()
        table = LatencyTable.build(dims, runtime, batch_size, seq_len, threads, grid, **timing)
        atomic.write_text(path, json.dumps(table.to_dict(), indent=1))
        log.info("latency table: %s timed in %.0f s, cached", shape, time.perf_counter() - start)
    return table


@dataclass(frozen=True)
class NarrowTable:
    """A model narrowed to a residual width (units 'hidden') read against its full-width original: the original's
    milliseconds come from the full-width table, every pruned shape's from the table measured at the narrow width
    (its layers and outside at that width, heads at the original head size). Everything but `speedup` is the narrow
    table's, so selection by latency prices units at the width the model has now."""

    full: LatencyTable
    narrow: LatencyTable

    @property
    def dims(self) -> Dims:
        return self.narrow.dims

    def speedup(self, original: WidthsLike, pruned: WidthsLike) -> float:
        """The full-width `original` (timed by `full`) over `pruned` at the narrow width (timed by `narrow`)."""
        a, b = _widths(original), _widths(pruned)
        return self.full.model_ms(a.heads, a.neurons) / self.narrow.model_ms(b.heads, b.neurons)

    def __getattr__(self, name: str):
        return getattr(self.narrow, name)
