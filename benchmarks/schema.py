"""One result file per experiment (`benchmarks/results/NAME.json`), in one schema: the figure's rows, each a value
with its 95% interval (or null), the seeds and the examples it rests on, its unit, goal and whether it was met, and
one provenance record for the whole result. Written and read only through these models, so a file that strays from
the schema fails on read with the field that is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from compressor.core import atomic
from compressor.core.errors import UserError

# points: accuracy points of a gap; accuracy: percent correct; x: a speed-up (or another ratio); s: seconds; %: a
# share; MB: memory
UNITS = ("points", "accuracy", "x", "s", "%", "MB")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Row(_Strict):
    """One figure: `value` in `unit`, `low`/`high` its 95% interval (null when one run gives none), `seeds` the
    whole-pipeline seeds it spans, `n` the test examples (or timing repeats) behind it, `met` true/false against
    `goal` (null: no goal, or the interval straddles it)."""

    label: str
    value: float
    low: float | None = None
    high: float | None = None
    seeds: list[int] | None = None
    n: int | None = None
    unit: Literal[UNITS]  # type: ignore[valid-type]
    goal: str | None = None
    met: bool | None = None
    detail: str | None = None


class Provenance(_Strict):
    """Where and how the result was made (as peft's `run_info`: enough to tell two results apart). `script` names
    the script a legacy result came from, `note` its former file; `parts` the parts of its steps' outputs made in
    earlier sessions, each with its own commit, CPU and what else ran."""

    commit: str | None
    date: str | None = None  # UTC, when the result was written
    cpu: str
    int8_features: str
    cpu_identity: str | None = None
    else_running: str
    cache: Literal["empty", "warm", "unknown"]
    seconds: float | None
    commands: list[str] = []
    script: str | None = None
    note: str | None = None
    parts: list[dict] = []  # parts made in earlier sessions, each where it was made (`benchmarks.parts`)


class Result(_Strict):
    """An experiment's result. `legacy`: converted from a result file of a retired script, not produced by the
    runner (its provenance names the script)."""

    experiment: str
    figure: str
    goal: str
    legacy: bool = False
    rows: list[Row]
    provenance: Provenance


def read_result(path: Path) -> Result:
    """The result at `path`; a file that is not one is a one-line `UserError` naming the first wrong field."""
    try:
        return Result.model_validate(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path.name}: cannot read a result: {err}") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise UserError(f"{path.name}: {where}: {first['msg']}") from None


def write_result(path: Path, result: Result) -> None:
    """Write `result` atomically (a reader sees the old file or the new one, never half)."""
    atomic.write_text(path, result.model_dump_json(indent=2) + "\n")
