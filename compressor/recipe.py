"""The recipe: YAML → typed, strict configuration.

Every model forbids unknown keys and range-checks its values, so `compressor validate` catches typos before any
model loads. `load_recipe` turns any problem into a `RecipeError` whose message names the field and what was
expected (the CLI prints it as one line and exits 2).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from compressor.errors import UserError


class RecipeError(UserError, ValueError):
    """A recipe (or its inputs) is invalid; the message is one line naming the field."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Strict):
    source: str = Field("builtin:minilm-l6", description="'builtin:minilm-l6', a hub id, or a local directory")
    revision: str | None = None
    task_tuned: bool = Field(False, description="true if the model is already fine-tuned on this task")
    trust_remote_code: bool = False


class DataSpec(Strict):
    source: str = Field("builtin:rotten_tomatoes", description="'builtin:rotten_tomatoes', a hub dataset, or a path")
    config: str | None = None
    text_fields: list[str] = Field(default_factory=lambda: ["text"], min_length=1, max_length=2)
    label_field: str = "label"
    splits: dict[Literal["train", "validation", "test"], str] = Field(
        default_factory=lambda: {"train": "train", "validation": "validation", "test": "test"},
        description="split names for train and validation (required) and test (defaults to the validation split)",
    )
    max_length: int = Field(128, ge=8, le=4096)
    max_train_examples: int | None = Field(None, ge=1)
    max_eval_examples: int | None = Field(None, ge=1)
    split_seed: int = Field(0, ge=0, lt=2**32)

    @field_validator("splits")
    @classmethod
    def _train_and_validation(cls, splits: dict[str, str]) -> dict[str, str]:
        missing = [k for k in ("train", "validation") if k not in splits]
        if missing:
            raise ValueError(f"missing {missing}; expected split names for 'train' and 'validation' (and 'test')")
        return {"test": splits["validation"], **splits}


class TrainSpec(Strict):
    epochs: float = Field(1.0, gt=0)
    lr: float = Field(3e-5, gt=0, lt=1)
    batch_size: int = Field(32, ge=1)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    max_examples: int | None = Field(None, ge=1, description="cap on training examples per epoch")


class CriterionSpec(Strict):
    name: str = "taylor"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> CriterionSpec:
        from compressor import criteria

        try:
            criteria.check_params(self.name, self.params)
        except ValueError as err:
            raise ValueError(str(err).removeprefix("prune.criterion.")) from None
        return self


class BudgetSpec(Strict):
    """How much to prune, for the whole model: a fraction of heads removed, a fraction of encoder FLOPs removed,
    or a measured speed-up on a named runtime at a batch size and sequence length (`compressor.latency`).

    `runtime`, `batch_size` and `seq_len` describe where the speed-up is measured (used by kind `speedup`); the
    runtimes are those of `compressor.latency.RUNTIMES` (a test keeps the two in step).
    """

    kind: Literal["heads", "flops", "speedup"] = "heads"
    value: float = Field(
        0.5, allow_inf_nan=False, description="heads/flops: fraction removed, in (0, 1); speedup: factor, in (1, 100]"
    )
    runtime: Literal["pytorch", "onnx-fp32", "onnx-int8"] = "pytorch"
    batch_size: int = Field(32, ge=1)
    seq_len: int = Field(64, ge=8, le=4096)

    def describe(self) -> str:
        """One phrase for humans, e.g. '2.0x speed-up on pytorch (batch 32, 64 tokens)' or '50% of heads'."""
        if self.kind == "speedup":
            return f"{self.value}x speed-up on {self.runtime} (batch {self.batch_size}, {self.seq_len} tokens)"
        return f"{self.value:.0%} of {'heads' if self.kind == 'heads' else 'encoder FLOPs'}"

    @model_validator(mode="after")
    def _value_in_range(self) -> BudgetSpec:
        if self.kind == "speedup" and not 1 < self.value <= 100:
            raise ValueError(
                f"value: for kind 'speedup' expected a speed-up factor above 1 and at most 100, got {self.value}"
            )
        if self.kind != "speedup" and not 0 < self.value < 1:
            raise ValueError(
                f"value: for kind '{self.kind}' expected a fraction removed between 0 and 1, got {self.value}"
            )
        return self


class PruneSpec(Strict):
    """What to prune and how far. Head-only recipes (`units: [heads]`, a head-fraction `target`) run as before;
    `units: [heads, neurons]` with `budget: {kind: flops|speedup, value: ...}` lets heads and FFN neurons compete
    for one budget (importance per FLOP, or per measured millisecond saved). `target: T` is the shorthand of
    `budget: {kind: heads, value: T}`."""

    criterion: CriterionSpec = Field(default_factory=CriterionSpec)
    target: float | None = Field(
        None, gt=0, lt=1, description="fraction of all heads removed at the end (default 0.5 without a budget)"
    )
    units: list[Literal["heads", "neurons"]] = Field(
        default_factory=lambda: ["heads"], min_length=1, description="unit kinds that compete for the budget"
    )
    budget: BudgetSpec | None = Field(None, description="one budget for the whole model instead of `target`")
    uniform_ffn: bool = Field(
        False, description="remove neurons in equal numbers per layer so plain transformers can load the result"
    )
    steps: int = Field(4, ge=1, le=100)
    scope: Literal["global", "per_layer"] = "global"
    min_heads_per_layer: int = Field(0, ge=0)
    score_examples: int = Field(512, ge=1)
    score_batch_size: int = Field(32, ge=1)
    finetune: TrainSpec | None = Field(default_factory=lambda: TrainSpec(epochs=1.0, lr=3e-5))
    baseline: Literal["layer_drop"] | None = Field(
        "layer_drop", description="compare with dropping top layers to the pruned FLOPs, fine-tuned alike (null: off)"
    )

    @property
    def resolved_budget(self) -> BudgetSpec:
        """The budget in force: `budget`, or `target` as a head-fraction budget."""
        return self.budget or BudgetSpec(kind="heads", value=0.5 if self.target is None else self.target)

    @model_validator(mode="before")
    @classmethod
    def _one_budget(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("target") is not None and data.get("budget") is not None:
            raise ValueError("budget: give target (a head fraction) or budget, not both")
        return data

    @model_validator(mode="after")
    def _units_fit(self) -> PruneSpec:
        from compressor import criteria

        if len(set(self.units)) != len(self.units):
            raise ValueError(f"units: expected distinct unit kinds, got {self.units}")
        if "neurons" in self.units and self.resolved_budget.kind == "heads":
            raise ValueError("units: 'neurons' needs budget kind flops or speedup; a head fraction counts heads only")
        if self.budget is not None and self.budget.kind != "speedup" and self.budget.runtime != "pytorch":
            raise ValueError(f"budget.runtime: only applies to kind 'speedup', got kind '{self.budget.kind}'")
        if self.uniform_ffn and "neurons" not in self.units:
            raise ValueError("uniform_ffn: only applies when units include 'neurons'")
        for unit in self.units:
            if unit not in criteria.units_of(self.criterion.name):
                raise ValueError(
                    f"criterion.name: '{self.criterion.name}' cannot score {unit}; expected one of "
                    f"{criteria.scoring(unit)}"
                )
        return self


class ExportSpec(Strict):
    enabled: bool = True
    variants: list[Literal["fp32", "optimized", "int8"]] = Field(default_factory=lambda: ["fp32", "optimized", "int8"])
    atol: float = Field(1e-4, gt=0)
    opset: int | None = Field(None, ge=11)


class BenchSpec(Strict):
    """Benchmark settings: every sequence length in `seq_lens` is timed at every batch size in `batch_sizes`.

    The summary's single headline figure is at the first sequence length. The older single-length key
    `seq_len: N` is still accepted and means `seq_lens: [N]` (giving both is an error); `spec.seq_len` reads the
    first length.
    """

    enabled: bool = True
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32, 64], min_length=1)
    seq_lens: list[int] = Field(
        default_factory=lambda: [64], min_length=1, description="tokens per synthetic timing example, 8 to 4096"
    )
    rounds: int = Field(5, ge=1)
    warmup: int = Field(2, ge=0)
    min_time_s: float = Field(0.5, gt=0, description="minimum timed duration of one measurement")
    threads: int | None = Field(None, ge=1)
    eval_examples: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _single_seq_len(cls, data: Any) -> Any:
        if isinstance(data, dict) and "seq_len" in data:
            if "seq_lens" in data:
                raise ValueError("seq_len: give seq_len (one length) or seq_lens (a list), not both")
            data = dict(data)
            one = data.pop("seq_len")
            data["seq_lens"] = one if isinstance(one, list) else [one]
        return data

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(b <= 0 for b in v):
            raise ValueError(f"expected positive batch sizes, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"expected distinct batch sizes, got {v}")
        return v

    @field_validator("seq_lens")
    @classmethod
    def _lengths(cls, v: list[int]) -> list[int]:
        if any(not 8 <= s <= 4096 for s in v):
            raise ValueError(f"expected sequence lengths from 8 to 4096 tokens, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"expected distinct sequence lengths, got {v}")
        return v

    @property
    def seq_len(self) -> int:
        """The first (headline) sequence length."""
        return self.seq_lens[0]


class AnalysisSpec(Strict):
    """Head-role analysis after pruning; `roles` are the detectors' thresholds (docs/analysis.md)."""

    class Roles(Strict):
        """The detectors' thresholds; `compressor.analysis.RoleConfig` is this model."""

        positional_threshold: float = Field(0.9, gt=0, le=1, description="share of queries at one offset")
        rare_top_k: int = Field(500, ge=0, description="most frequent training pieces never counted as rare")
        rare_threshold: float = Field(0.5, gt=0, le=1, description="share of queries on the rarest piece")
        delimiter_threshold: float = Field(0.5, gt=0, le=1, description="attention share on [CLS]/[SEP]/punct")
        syntactic_margin: float = Field(0.10, ge=0, le=1, description="accuracy points above the offset baseline")
        min_relation_count: int = Field(30, ge=1, description="instances a relation/direction needs to count")
        sieve_tau: float = Field(2.0, gt=0, description="sieve bias that H0 allows (1 = no preference)")
        sieve_alpha: float = Field(0.05, gt=0, lt=1, description="significance level after correction")
        sieve_test: Literal["t", "wilcoxon"] = "t"
        sieve_correction: Literal["holm", "bh", "bonferroni", "none"] = "holm"

    enabled: bool = True
    examples: int = Field(256, ge=8)
    roles: Roles = Field(default_factory=Roles)


class Recipe(Strict):
    name: str = "run"
    seed: int = Field(0, ge=0, lt=2**32)
    output_dir: str = Field("runs/out", min_length=1)
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    base_finetune: TrainSpec = Field(default_factory=lambda: TrainSpec(epochs=2.0, lr=5e-5))
    prune: PruneSpec = Field(default_factory=PruneSpec)
    export: ExportSpec = Field(default_factory=ExportSpec)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)

    @model_validator(mode="after")
    def _budget_runtime_exported(self) -> Recipe:
        """A speed-up on an ONNX runtime is measured on the run's own export of that variant."""
        budget = self.prune.budget
        if budget is not None and budget.kind == "speedup" and budget.runtime != "pytorch":
            variant = budget.runtime.removeprefix("onnx-")
            if not self.export.enabled or variant not in self.export.variants:
                raise ValueError(
                    f"prune.budget.runtime: {budget.runtime} is measured on the run's own export; expected "
                    f"export.enabled with '{variant}' in export.variants"
                )
        return self


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key (not allowed here)"
    got = first.get("input")
    tail = "" if first["type"] in ("extra_forbidden", "missing") or isinstance(got, dict) else f" (got {got!r})"
    if loc and re.match(r"[\w.]+: ", msg):  # a validator's message naming a sub-field continues the location
        return f"{loc}.{msg}{tail}"
    return f"{loc}: {msg}{tail}" if loc else f"{msg}{tail}"


def parse_recipe(data: Any, origin: str = "recipe") -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"{origin}: expected a YAML mapping at the top level, got {type(data).__name__}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise RecipeError(f"{origin}: {_format_error(err)}") from None


def load_recipe(path: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read a YAML recipe safely (yaml.safe_load) and validate it; relative output_dir stays relative to cwd."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe: file '{path}' not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise RecipeError(
            f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start}); expected a YAML recipe"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(f"{path}: malformed YAML{where}: {getattr(err, 'problem', err)}") from None
    if overrides and isinstance(data, dict):
        data = {**data, **overrides}
    return parse_recipe(data, origin=str(path))


def dump_recipe(recipe: Recipe) -> str:
    """The fully resolved recipe (defaults filled in) as YAML, written next to every run's outputs."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
