"""The runtimes a compressed model is built for, timed on and chosen by: one frozen declaration each.

A `Runtime` says, as data, everything the stages need to know about one way of running a model:

- `name`: what users write and read (`prune.budget.runtime`, `compressor pick --runtime`, the frontier's `runtime`
  column, the candidate names of `compressor.core.candidates`);
- `engine`: which code builds sessions and benchmark candidates for it ("pytorch", "onnx", "openvino");
- `variant`: the export variant it runs (`export.variants`, a directory under `onnx/`), None for the saved
  PyTorch model itself;
- `gated`: whether its export passes the int8 validation gate (a variant that fails it stays on disk, marked
  rejected, and is never recommended or picked);
- `budget`: whether a speed-up budget may be measured on it (the latency table and the in-run check can time it);
- `quantize_only`: whether the unpruned original on it is a point of every frontier by default (`bench.quantize_only`:
  what a user gets by quantizing the original instead of pruning it);
- `needs_vnni`: whether its int8 kernels pay only with a VNNI-class int8 dot product (VNNI, AVX-VNNI, AMX): on a CPU
  without one the bench leaves its candidates out and says so (`cannot_pay`), since there it runs slower than fp32
  and can never be the choice.

The declarations live in `core`, the lowest layer, so every reader may import them: the recipe schema (its allowed
`runtime` and `variants` values), `deploy` (which variants exist), `pruning.latency` (what it can time), `bench`
(how a runtime becomes a candidate), the pipeline and `compressor pick`. Code cannot live here without importing
upward, so each layer binds an *engine* to its own constructor in one table: `deploy.export` builds each variant,
`bench.candidates.CANDIDATE_BUILDERS` turns a built model or variant into a benchmark candidate, and
`pruning.latency.probe.SESSIONS` times a module on it. A runtime on an existing engine (another ONNX variant) is one
declaration here plus its export step; a new engine (OpenVINO) adds a declaration and one entry per table.
`tests/test_runtimes.py` checks that every declaration is exported, benchmarked and pickable.
"""

from __future__ import annotations

from dataclasses import dataclass

from compressor.core.errors import UserError


@dataclass(frozen=True)
class Runtime:
    """One way of running a model; see the module docstring for what each field drives."""

    name: str
    engine: str
    variant: str | None = None
    gated: bool = False
    budget: bool = False
    description: str = ""
    quantize_only: bool = False
    needs_vnni: bool = False


RUNTIMES: tuple[Runtime, ...] = (
    Runtime("pytorch", "pytorch", None, budget=True, description="the saved model in PyTorch (SDPA attention)"),
    Runtime("onnx-fp32", "onnx", "fp32", budget=True, description="ONNX Runtime, the exported fp32 graph"),
    Runtime("onnx-optimized", "onnx", "optimized", description="ONNX Runtime, the transformer-fused fp32 graph"),
    Runtime(
        "onnx-int8",
        "onnx",
        "int8",
        gated=True,
        budget=True,
        description="ONNX Runtime, dynamic int8",
        quantize_only=True,
    ),
    Runtime("onnx-int8_static", "onnx", "int8_static", gated=True, description="ONNX Runtime, static QDQ int8"),
    Runtime(
        "openvino-fp32",
        "openvino",
        "openvino-fp32",
        budget=True,
        description="OpenVINO, the IR of the fp32 graph (optional: compressor[openvino])",
    ),
    Runtime(
        "openvino-int8",
        "openvino",
        "openvino-int8",
        gated=True,
        budget=True,
        description="OpenVINO, NNCF static int8 calibrated on training examples (optional: compressor[openvino])",
        quantize_only=True,
        needs_vnni=True,
    ),
)
BY_NAME = {r.name: r for r in RUNTIMES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
BUDGET_NAMES: tuple[str, ...] = tuple(r.name for r in RUNTIMES if r.budget)  # `prune.budget.runtime` values
VARIANTS: tuple[str, ...] = tuple(r.variant for r in RUNTIMES if r.variant is not None)  # `export.variants` values
GATED_VARIANTS: tuple[str, ...] = tuple(r.variant for r in RUNTIMES if r.gated and r.variant is not None)
QUANTIZE_ONLY: tuple[str, ...] = tuple(r.name for r in RUNTIMES if r.quantize_only)  # `bench.quantize_only` default


def engine_variants(engine: str, gated: bool | None = None) -> tuple[str, ...]:
    """The export variants of the runtimes on `engine` (only the gated, i.e. int8, ones when `gated` is True)."""
    return tuple(r.variant for r in RUNTIMES if r.engine == engine and r.variant and gated in (None, r.gated))


def runtime(name: str, field: str = "runtime") -> Runtime:
    """The declaration called `name`, or a one-line `UserError` naming `field` and the declared names."""
    if name not in BY_NAME:
        raise UserError(f"{field}: expected one of {', '.join(NAMES)}, got {name!r}")
    return BY_NAME[name]


def cannot_pay(name: str) -> str | None:
    """Why runtime `name` cannot pay on this CPU, in one line, or None: a `needs_vnni` runtime on a CPU known to lack
    a VNNI-class int8 dot product (under `$ONEDNN_MAX_CPU_ISA`, the CPU it caps to)."""
    from compressor.core.machine import cpu_has_vnni, int8_features

    if not runtime(name).needs_vnni or cpu_has_vnni() is not False:
        return None
    return (
        f"{name} not benchmarked: its int8 kernels need VNNI or AMX, which this CPU ({int8_features()}) lacks, "
        "so it runs slower than fp32 here and can never be the choice"
    )


def for_variant(variant: str) -> Runtime:
    """The runtime that runs the export variant `variant` (a `UserError` for an undeclared variant)."""
    for r in RUNTIMES:
        if r.variant == variant:
            return r
    raise UserError(f"export.variants: unknown variant {variant!r}; expected some of {', '.join(VARIANTS)}")
