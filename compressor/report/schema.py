"""The run report as typed models: what `report.json` and a member's `member.json` hold, written and read through
them (`RunReport.write` / `RunReport.read`, `MemberSection`); `RunReport.member_models` finds a finished run's models.

The pipeline assembles the report section by section as it runs; at the end `RunReport.of` checks the whole of it
against these models (a missing or mistyped key fails the run before anything is written, not a user's script
later), the report writer renders `report.md` from the typed model, and `compressor pick` reads the frontier back
through it. The keys are the ones `report.json` has always had (users' scripts read them): the fields named here are
typed; the rest of a section (export details, the benchmark, the step log, the analysis) is kept as it is.

`SCHEMA_VERSION` counts changes of meaning or of key names: a report written by a newer compressor is refused by
an older reader in one line, rather than misread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from compressor.core import atomic
from compressor.core.candidates import KINDS, SINGLE
from compressor.core.errors import UserError

SCHEMA_VERSION = 1


class Section(BaseModel):
    """A report section: its named fields typed, any other key kept as written (`extra="allow"`), and dumped with
    exactly the keys it was given (`exclude_unset`), so a section grows without breaking old readers."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def of(cls, data: dict[str, Any]) -> Self:
        """Check an assembled section against the model, through JSON (as a reader of the file will see it)."""
        return cls.model_validate_json(json.dumps(data, default=str))

    def dump(self) -> dict[str, Any]:
        """The section as plain JSON data, with exactly the keys it was built from."""
        return self.model_dump(mode="json", exclude_unset=True)

    def write(self, path: Path) -> None:
        """Write the section as JSON, atomically (a reader never sees half of it)."""
        atomic.write_text(path, json.dumps(self.dump(), indent=2))


class Score(Section):
    """Accuracy and loss on one split (`n` examples); accuracy is None for a split without labels."""

    accuracy: float | None = None
    loss: float | None = None
    n: int | None = None


class Original(Section):
    """The task-tuned model before pruning: its scores and (on the main process) its size."""

    validation: Score | None = None
    test: Score
    parameters: int | None = None
    encoder_flops_per_example: int | None = None
    heads: int | None = None
    heads_per_layer: list[int] | None = None
    ffn_neurons: int | None = None
    layers: int | None = None
    hidden_size: int | None = None


class Pruned(Section):
    """A pruned model as saved: its test score, what it keeps, where it is, and its size against the original's."""

    test: Score
    heads_left: int
    heads_total: int
    heads_per_layer: list[int]
    model_dir: str
    plan: dict[int, list[int]]
    parameters: int
    encoder_flops_per_example: int
    flop_ratio: float
    masked_vs_pruned_max_abs_diff: float | None = None
    ffn_neurons: int | None = None
    ffn_neurons_per_layer: list[int] | None = None
    layers: int | None = None
    hidden_size: int | None = None  # the residual width kept (units 'hidden'); absent in reports before it


class Budget(Section):
    """The budget asked beside what a member reached; a speed-up budget adds its budget check: the speed-up measured
    against the original on the budget's runtime, with its spread over rounds."""

    target: float
    flop_ratio: float
    kind: str | None = None
    measured_speedup: float | None = None
    measured_iqr: list[float] | None = None
    measured_rounds: int | None = None
    within_10pct: bool | None = None


class FrontierRow(Section):
    """One benchmarked candidate as a choice (`compressor.bench.frontier`): speed-up against the PyTorch original,
    test accuracy and drop in points, the same on validation (what choices read; None in reports from before),
    McNemar's p, Pareto mark, and what `compressor pick` copies (`path`). A picked row (`Family.pick`) says which
    split chose it (`chosen_on`: "validation"; absent in reports from before, whose pick read test)."""

    name: str
    model: str
    role: Literal[KINDS]  # type: ignore[valid-type]
    runtime: str
    path: str | None = None
    rejected: bool = False
    speedup: float | None = None
    speedup_by_batch: dict[str, float | None] = {}
    batch: int | None = None
    seq_len: int | None = None
    accuracy: float | None = None
    drop_points: float | None = None
    val_accuracy: float | None = None
    val_drop_points: float | None = None
    mcnemar_p: float | None = None
    pareto: bool = False
    recovery: str | None = None
    cpu_int8_features: str | None = None
    chosen_on: str | None = None


class MemberSection(Section):
    """One member of a run (one per target): its step, the pruned model, its exports, its layer-drop baseline and
    budget check. Written last in the member's directory as `member.json`; a resumed run keeps it."""

    target: float
    label: str
    step: int
    member_finetune: dict[str, Any] | None = None  # its final fine-tune (`prune.member_finetune`), when asked for
    pruned: Pruned
    export: dict[str, dict[str, Any]] | None = None
    baseline: dict[str, Any] | None = None
    model_card: dict[str, Any] | None = None
    budget: Budget | None = None

    @classmethod
    def read(cls, path: Path) -> MemberSection:
        return _read(cls, path, "member")


class Family(Section):
    """A family run's section: its targets, members, and (with a bench) the frontier and the pick."""

    targets: list[float]
    kind: str
    runtime: str | None = None
    members: list[MemberSection]
    frontier: list[FrontierRow] | None = None
    pick: FrontierRow | None = None
    versus_references: list[dict[str, Any]] | None = None


class RunReport(Section):
    """`report.json`: a finished run. A one-target run keeps its member's sections at the top (`pruned`, `export`,
    `baseline`, `budget`, `frontier`); a family run has them per member under `family`."""

    schema_version: int
    name: str
    status: Literal["complete"]
    model_source: str
    data_source: str
    labels: list[str]
    base_finetune: dict[str, Any] | None = None
    mixed_precision: str | None = None  # the fine-tunes': "no" (fp32), "bf16", "fp16"; None in older reports
    device: str | None = None  # where they ran: "cpu", "cuda:0 (<GPU name>)"; None in older reports
    original: Original
    steps: list[dict[str, Any]]
    recovery: dict[str, Any] | None = None
    relative_budget: dict[str, Any] | None = None  # a budget `relative_to` a reference: the speed-up it measured
    member_finetune: dict[str, Any] | None = None
    pruned: Pruned | None = None
    export: dict[str, dict[str, Any]] | None = None
    baseline: dict[str, Any] | None = None
    model_card: dict[str, Any] | None = None
    bench: dict[str, Any] | None = None
    budget: Budget | None = None
    frontier: list[FrontierRow] | None = None
    versus_references: list[dict[str, Any]] | None = None
    family: Family | None = None
    references: list[dict[str, Any]] | None = None
    analysis: dict[str, Any] | None = None
    seconds: float | None = None
    timings: dict[str, float] | None = None
    distillation: dict[str, Any] | None = None
    recommendation: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> RunReport:
        if (self.family is None) == (self.pruned is None):
            raise ValueError("a run report has either 'pruned' (one target) or 'family' (several), not both or none")
        return self

    def members(self) -> list[MemberSection]:
        """The run's members in the report's order: a family's, or a one-target run's model as its one member,
        labelled `SINGLE` (a run is a family of one; the one-target report keeps its member's sections at the top)."""
        if self.family is not None:
            return list(self.family.members)
        if self.pruned is None or self.budget is None:  # `_one_shape` guarantees `pruned`; a run writes `budget`
            raise UserError("a one-target run report without its 'budget' section; expected one from `compressor run`")
        return [
            MemberSection(
                target=self.budget.target, label=SINGLE, step=len(self.steps), member_finetune=self.member_finetune,
                pruned=self.pruned, export=self.export, baseline=self.baseline, model_card=self.model_card,
                budget=self.budget,
            )
        ]  # fmt: skip

    def member_models(self, run_dir: Path) -> list[tuple[MemberSection, Path]]:
        """Each member with the directory its pruned model is in now, this report being `run_dir`'s. The report
        keeps the directory as the run was given it (relative to where it ran, or absolute); one that is not there
        is looked up inside `run_dir` by its trailing parts, so a run directory moved or copied finds its models."""
        return [(m, _inside(run_dir, Path(m.pruned.model_dir))) for m in self.members()]

    def frontier_rows(self) -> list[FrontierRow]:
        """The run's frontier: a family's, else a one-target run's (empty without a benchmark)."""
        rows = self.family.frontier if self.family is not None else self.frontier
        return list(rows or [])

    @classmethod
    def read(cls, path: Path) -> RunReport:
        """A finished run's report; a file that is not one (bad JSON, a newer schema, a missing or mistyped key)
        is one line naming the file and what is wrong."""
        return _read(cls, path, "compressor run report")


def _inside(run_dir: Path, given: Path) -> Path:
    """`given` where it exists, else the first of its trailing parts under `run_dir` that does (else `given`)."""
    if given.exists():
        return given
    tails = (run_dir.joinpath(*given.parts[i:]) for i in range(len(given.parts)))
    return next((path for path in tails if path.exists()), given)


def _read(model: type[Section], path: Path, what: str) -> Any:
    """Load `path` into `model`, or one `UserError` line naming the file and the first problem."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"'{path}' is not valid JSON ({err.msg}); expected a {what}") from None
    version = data.get("schema_version", SCHEMA_VERSION) if isinstance(data, dict) else SCHEMA_VERSION
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise UserError(
            f"'{path}' has report schema {version}, newer than this compressor's {SCHEMA_VERSION}; expected a "
            "report from this version or older (upgrade compressor to read it)"
        )
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise UserError(f"'{path}': {where}: {first['msg']}; expected a {what}") from None
