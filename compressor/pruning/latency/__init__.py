"""Measured latency of pruned shapes: a per-layer lookup table for a "speed-up on a named runtime" budget.

FLOPs say little about speed at small widths (fixed per-call overheads, memory traffic, int8 kernels), so a speed-up
budget needs measured costs. Measuring every pruned shape is impossible; instead `LatencyTable.build` times synthetic
single encoder layers built from the model's config at a small grid of (heads kept, FFN neurons kept), plus the fixed
cost outside the layers, and interpolates in between (`table.py`; the timing itself is in `probe.py`).

    table = load_or_build(model.config, "onnx-int8", batch_size=32, seq_len=64)
    table.speedup(Dims.from_config(model.config).full(), Widths(heads=(6, 3, ...), neurons=(1536, 768, ...)))
    table.marginal_ms(layer_heads=6, layer_neurons=1536, unit="neurons", count=64)  # ms saved by one block
"""

from compressor.pruning.latency.probe import (
    BUDGET_RUNTIMES,
    DEFAULT_FRACTIONS,
    RUNTIMES,
    BudgetRuntime,
    Dims,
    Runtime,
    Unit,
    Widths,
    check_runtime,
)
from compressor.pruning.latency.table import (
    LatencyTable,
    NarrowTable,
    default_cache_dir,
    load_file,
    load_or_build,
)

__all__ = [
    "BUDGET_RUNTIMES",
    "DEFAULT_FRACTIONS",
    "RUNTIMES",
    "BudgetRuntime",
    "Dims",
    "LatencyTable",
    "NarrowTable",
    "Runtime",
    "Unit",
    "Widths",
    "check_runtime",
    "default_cache_dir",
    "load_file",
    "load_or_build",
]
