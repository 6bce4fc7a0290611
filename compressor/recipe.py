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


class RecipeError(ValueError):
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


class DistillSpec(Strict):
    """Distillation from the task-tuned original (the teacher) during recovery fine-tuning.

    The loss is `(1 - alpha) * task CE + alpha * T² · KL(teacher_T || student_T)` on temperature-`T` softened
    logits, plus `hidden_weight` × the mean squared error between each layer's hidden states and the teacher's.
    Teacher logits are computed once per training example and cached; teacher hidden states are only computed
    (during training) when `hidden_weight` > 0.
    """

    alpha: float = Field(0.5, ge=0, le=1, description="weight of the KL term; the task loss gets 1 - alpha")
    temperature: float = Field(2.0, gt=0, description="softening temperature of both logit distributions")
    hidden_weight: float = Field(0.0, ge=0, description="weight of layer-wise hidden-state MSE; 0 turns it off")
    teacher_batch_size: int = Field(64, ge=1, description="batch size of the one-off teacher pass")


class FinetuneSpec(TrainSpec):
    """Recovery fine-tuning between pruning steps: a `TrainSpec` plus optional distillation (null = off)."""

    distill: DistillSpec | None = None


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


class PruneSpec(Strict):
    criterion: CriterionSpec = Field(default_factory=CriterionSpec)
    target: float = Field(0.5, gt=0, lt=1, description="fraction of all heads removed at the end")
    steps: int = Field(4, ge=1, le=100)
    scope: Literal["global", "per_layer"] = "global"
    min_heads_per_layer: int = Field(0, ge=0)
    score_examples: int = Field(512, ge=1)
    score_batch_size: int = Field(32, ge=1)
    finetune: FinetuneSpec | None = Field(default_factory=lambda: FinetuneSpec(epochs=1.0, lr=3e-5))


class Int8Spec(Strict):
    """int8 variants: `int8` is dynamic quantisation, `int8_static` static QDQ calibrated on training examples.

    Each requested int8 variant's validation accuracy is compared with its fp32 graph's; one that drops more than
    `max_drop` (a fraction: 0.003 = 0.3 points) is kept on disk but marked rejected and never recommended.
    """

    per_channel: bool = Field(True, description="int8 weights per output channel (else per tensor)")
    exclude_nodes: list[str] = Field(default_factory=list, description="ONNX node names kept in fp32")
    calibration_examples: int = Field(256, ge=1, description="training examples that calibrate int8_static")
    max_drop: float | None = Field(0.005, ge=0, lt=1, description="allowed validation accuracy drop; null = no gate")
    eval_examples: int | None = Field(None, ge=1, description="validation examples for the gate; null = all")


class ExportSpec(Strict):
    enabled: bool = True
    variants: list[Literal["fp32", "optimized", "int8", "int8_static"]] = Field(
        default_factory=lambda: ["fp32", "optimized", "int8"]
    )
    int8: Int8Spec = Field(default_factory=Int8Spec)
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
        """The fields and defaults of `compressor.analysis.RoleConfig` (a test keeps the two in step)."""

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
