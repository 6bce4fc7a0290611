"""The runtimes a compressed model is built for, timed on and chosen by: a registry of engines and their runtimes.

An *engine* (PyTorch, ONNX Runtime, OpenVINO) is one registered object, an `Engine`: it builds its runtimes'
models at export, loads a classifier for the bench, times a module for the latency table, and names its version.
Each lives in one module of `compressor.deploy.engines`, which registers it with its `Runtime` declarations
(`register`); every reader here and above iterates over the registry, so adding a runtime is adding one module there.

A `Runtime` says, as data, everything the stages need to know about one way of running a model:

- `name`: what users write and read (`prune.budget.runtime`, `compressor pick --runtime`, the frontier's `runtime`
  column, the candidate names of `compressor.core.candidates`);
- `engine`: the engine it runs on ("pytorch", "onnx", "openvino"): how its threads are set (PyTorch's
  through torch, the others' when a session is made) and the bench candidate's `kind`;
- `variant`: the export variant it runs (`export.variants`, a directory under `onnx/`), None for the saved
  PyTorch model itself;
- `gated`: whether its export passes the int8 validation gate (a variant that fails it stays on disk, marked
  rejected, and is never recommended or picked);
- `budget`: whether a speed-up budget may be measured on it (the latency table and the in-run check can time it);
- `quantize_only`: whether the unpruned original on it is a point of every frontier by default (`bench.quantize_only`:
  what a user gets by quantizing the original instead of pruning it);
- `needs_vnni`: whether its int8 kernels pay only with a VNNI-class int8 dot product (VNNI, AVX-VNNI, AMX): on a CPU
  without one the bench leaves its candidates out and says so (`cannot_pay`), since there it runs slower than fp32
  and can never be the choice;
- `calibrated`: whether building it needs calibration batches (training examples);
- `optimizes`: the runtime whose graph of the same model it is an optimisation of; timed slower than that one, it is
  never picked (`compressor.bench.frontier.slower_than_source`).

The declarations and the registry live in `core`, the lowest layer, so every reader may import them: the recipe
schema (its allowed `runtime` and `variants` values), `deploy` (which variants exist), `pruning.latency` (what it can
time), `bench`, the pipeline and `compressor pick`. The engines' code imports upward (deploy's export, ONNX Runtime,
OpenVINO), so it stays in `compressor.deploy.engines`, imported by `compressor/__init__.py` before anything reads the
tables: reading them earlier is an error rather than a silently short list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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
    calibrated: bool = False
    optimizes: str | None = None


class Classifier(Protocol):
    """A loaded model called like one: batch → logits (numpy); what the bench times."""

    input_names: tuple[str, ...]
    size_bytes: int
    threads: int | None  # its fixed intra-op threads; None: the process's PyTorch setting
    threads_note: str | None  # why `threads` is what it is, when the user did not set it

    def __call__(self, batch: Mapping) -> Any: ...


@dataclass
class ExportJob:
    """What every engine's `build` works from (`compressor.deploy.export.export_onnx` makes it): the saved model
    (loaded with eager attention) and its directory, where variants are built (`tmp`) and where they will be
    (`out_dir`), the requested variants, the parity check (batches, PyTorch's `evaluate_variant` result on them,
    atol), the opset, the int8 options (`compressor.deploy.quantize.Int8Options`), the exporter to ask for, and the
    entries built so far."""

    model: Any
    model_dir: Path
    tmp: Path
    out_dir: Path
    names: list[str]
    batches: Sequence[Mapping]
    reference: dict
    atol: float
    opset: int | None
    options: Any
    exporter: str = "auto"  # `compressor.deploy.exporters.preference`
    built: dict[str, dict] = field(default_factory=dict)


class Engine:
    """How the runtimes of one engine are built, loaded, timed and versioned. Subclasses live in
    `compressor.deploy.engines` (one module each) and override what their runtimes need.

    `name` is what `Runtime.engine` says for its runtimes; `order` places its runtimes in every list (error messages,
    canonical variant order) and its `build` in the export (ONNX Runtime's fp32 graph comes before OpenVINO converts
    it).
    """

    name: str = ""
    order: int = 0

    def missing(self) -> str | None:
        """Why this engine cannot run here (an optional package absent), in one line, or None."""
        return None

    def versions(self) -> dict[str, str]:
        """{package: version} of what runs this engine's models (a latency table is rebuilt when one changes)."""
        return {}

    def build(self, job: ExportJob, wanted: list[str]) -> dict[str, dict]:
        """Build the `wanted` variants of this engine at export; returns the export manifest's entry per variant."""
        return {}

    def load(self, runtime: Runtime, source: Path, threads: int | None = None) -> Classifier:
        """The classifier of `runtime` built in `source` (a variant directory), on `threads` intra-op threads."""
        raise NotImplementedError(f"{runtime.name}: engine {self.name!r} loads no classifier")

    def timer(self, runtime: Runtime, module: Any, example: Any, threads: int | None, workdir: Path) -> Callable:
        """A no-argument call running `module` (an eval-mode `nn.Module`) on `example` once on `runtime`, for the
        latency table and the in-run check (`compressor.pruning.latency`); `workdir` holds any graph it writes."""
        raise NotImplementedError(f"{runtime.name}: engine {self.name!r} cannot time a module")


_ENGINES: list[tuple[Engine, tuple[Runtime, ...]]] = []
_complete = False


def register(engine: Engine, *declared: Runtime) -> Engine:
    """Register `engine` with the runtimes it runs (called once by each module of `compressor.deploy.engines`)."""
    taken = {r.name for _, rs in _ENGINES for r in rs} | {r.variant for _, rs in _ENGINES for r in rs if r.variant}
    for r in declared:
        if r.name in taken or (r.variant is not None and r.variant in taken):
            raise ValueError(f"runtime {r.name!r}: its name or variant is already registered")
    _ENGINES.append((engine, tuple(declared)))
    _ENGINES.sort(key=lambda pair: pair[0].order)
    return engine


def mark_complete() -> None:
    """Called by `compressor.deploy.engines` once every engine module is imported: the tables may be read."""
    global _complete
    _complete = True


def _registry() -> list[tuple[Engine, tuple[Runtime, ...]]]:
    if not _complete:
        raise RuntimeError("runtimes read before compressor.deploy.engines registered them: import compressor first")
    return _ENGINES


def engines() -> tuple[Engine, ...]:
    """Every registered engine, in `order`."""
    return tuple(engine for engine, _ in _registry())


def declared(engine: Engine | None = None) -> tuple[Runtime, ...]:
    """Every registered runtime in order (those of `engine` only, when given)."""
    return tuple(r for e, rs in _registry() if engine is None or e is engine for r in rs)


def engine_of(name: str) -> Engine:
    """The engine object that builds, loads and times runtime `name`."""
    for engine, rs in _registry():
        if any(r.name == name for r in rs):
            return engine
    runtime(name)  # the one-line error naming the declared runtimes
    raise AssertionError(name)


def unavailable(variants: Sequence[str]) -> list[tuple[list[str], str]]:
    """(the variants among `variants`, why) for each engine that cannot run here (`Engine.missing`)."""
    out = []
    for engine in engines():
        wanted = [r.variant for r in declared(engine) if r.variant in variants]
        reason = engine.missing() if wanted else None
        if reason is not None:
            out.append((wanted, reason))
    return out


def _tables() -> dict[str, Any]:
    rs = declared()
    return {
        "RUNTIMES": rs,
        "BY_NAME": {r.name: r for r in rs},
        "NAMES": tuple(r.name for r in rs),
        "BUDGET_NAMES": tuple(r.name for r in rs if r.budget),  # `prune.budget.runtime` values
        "VARIANTS": tuple(r.variant for r in rs if r.variant is not None),  # `export.variants` values
        "GATED_VARIANTS": tuple(r.variant for r in rs if r.gated and r.variant is not None),
        "CALIBRATED_VARIANTS": tuple(r.variant for r in rs if r.calibrated and r.variant is not None),
        "QUANTIZE_ONLY": tuple(r.name for r in rs if r.quantize_only),  # `bench.quantize_only` default
    }


def __getattr__(attr: str) -> Any:
    """The tables (`RUNTIMES`, `BY_NAME`, `NAMES`, `BUDGET_NAMES`, `VARIANTS`, `GATED_VARIANTS`,
    `CALIBRATED_VARIANTS`, `QUANTIZE_ONLY`), read from the registry when asked for."""
    if attr.isupper() and not attr.startswith("_"):
        tables = _tables()
        if attr in tables:
            return tables[attr]
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def engine_variants(engine: str, gated: bool | None = None) -> tuple[str, ...]:
    """The export variants of the runtimes on `engine` (only the gated, i.e. int8, ones when `gated` is True)."""
    return tuple(r.variant for r in declared() if r.engine == engine and r.variant and gated in (None, r.gated))


def runtime(name: str, field: str = "runtime") -> Runtime:
    """The declaration called `name`, or a one-line `UserError` naming `field` and the declared names."""
    for r in declared():
        if r.name == name:
            return r
    raise UserError(f"{field}: expected one of {', '.join(r.name for r in declared())}, got {name!r}")


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
    for r in declared():
        if r.variant == variant:
            return r
    variants = (r.variant for r in declared() if r.variant is not None)
    raise UserError(f"export.variants: unknown variant {variant!r}; expected some of {', '.join(variants)}")
