"""The experiments, declared one per file in `benchmarks/experiments/NAME.yaml` (learnt from peft's
`method_comparison/`: one folder of declarations, one runner, one result format). A declaration says what the figure
is and why it is measured (`figure`, `goal`), what it runs on (`recipe`, `seeds`, `runtimes`), the product commands
that make it (`steps`: each a command and the directory it leaves its output in; `env`: variables every step runs
with, e.g. the math libraries capped to AVX2) and how that output reads as result rows (`reader` and its
`reader_args`, checked against the reader's signature). `runs_toward` counts the runs made toward a figure chosen
among several (the page prints it beside the figure)."""

from __future__ import annotations

import inspect
import shlex
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from benchmarks.readers import READERS
from compressor.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "benchmarks" / "experiments"
RESULTS = ROOT / "benchmarks" / "results"
RUNS = "runs/bench"  # each experiment's outputs go under runs/bench/NAME unless a step names its own


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Step(_Strict):
    """One command (`compressor ...`, `python ...`); `{output}` in it is the step's output directory, and the step
    is finished when `done` (a path inside that directory) exists: a rerun skips it unless forced. `parts` names the
    files of an unfinished output that another session may resume it from (`benchmarks.parts`)."""

    command: str
    output: str | None = None
    done: str = "report.json"
    parts: list[str] = []  # globs in the output that a later session resumes from (`benchmarks.parts`)


class RunsToward(_Strict):
    count: int
    note: str


class Experiment(_Strict):
    name: str
    figure: str
    goal: str
    recipe: str | None = None
    seeds: list[int] = [0]
    runtimes: list[str] = []
    steps: list[Step]
    reader: str
    reader_args: dict = {}
    runs_toward: RunsToward | None = None
    env: dict[str, str] = {}

    @model_validator(mode="after")
    def _known_reader(self) -> Experiment:
        if self.reader not in READERS:
            raise ValueError(f"reader: '{self.reader}' is not one of {sorted(READERS)}")
        params = inspect.signature(READERS[self.reader]).parameters
        unknown = sorted(set(self.reader_args) - set(list(params)[2:]))
        if unknown:
            raise ValueError(f"reader_args: {unknown} are not parameters of reader '{self.reader}'")
        if not self.steps:
            raise ValueError("steps: at least one command is needed")
        return self

    def output(self, step: Step) -> str:
        """The step's output directory, relative to the repository root."""
        return step.output or f"{RUNS}/{self.name}"

    def commands(self) -> list[list[str]]:
        """Each step's command as arguments, `{output}` filled in."""
        return [[arg.replace("{output}", self.output(s)) for arg in shlex.split(s.command)] for s in self.steps]

    def shown(self) -> list[str]:
        """Each step's command as a shell line, prefixed with `env` (what the page and the provenance print)."""
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items())
        return [prefix + shlex.join(c) for c in self.commands()]

    def last_output(self) -> Path:
        """Where the reader reads: the last step's output directory."""
        return ROOT / self.output(self.steps[-1])


def load_experiment(path: Path) -> Experiment:
    """One declaration; a bad one is a one-line `UserError` naming the file and field."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"{path.name}: cannot read the declaration: {err}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path.name}: expected a mapping of fields")
    try:
        return Experiment.model_validate({"name": path.stem, **data})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "declaration"
        raise UserError(f"{path.name}: {where}: {first['msg']}") from None


def load_experiments(folder: Path = EXPERIMENTS) -> dict[str, Experiment]:
    """Every declared experiment by name, in name order."""
    return {p.stem: load_experiment(p) for p in sorted(folder.glob("*.yaml"))}


def experiment(name: str, folder: Path = EXPERIMENTS) -> Experiment:
    """The experiment `name`; an unknown name is a one-line `UserError` listing the declared ones."""
    found = load_experiments(folder)
    if name not in found:
        raise UserError(f"experiment: '{name}' is not declared; declared: {', '.join(found) or 'none'}")
    return found[name]
