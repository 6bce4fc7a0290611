"""The recipe: YAML → typed, strict configuration.

Every model forbids unknown keys and range-checks its values, so `compressor validate` catches typos before any
model loads. `load_recipe` turns any problem into a `RecipeError` whose message names the field and what was
expected (the CLI prints it as one line and exits 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from compressor.core.runtimes import VARIANTS, runtime
from compressor.recipe.base import Repeats, Strict
from compressor.recipe.bench import BenchSpec
from compressor.recipe.prune import PruneSpec, TrainSpec
from compressor.recipe.yamlio import RecipeError, apply_settings, format_validation_error, read_yaml, short, short_key


class ModelSpec(Strict):
    """The model to prune: a sequence classifier (or an encoder a classification head is added to)."""

    source: str = Field(
        "builtin:minilm-l6",
        max_length=4096,
        description="'builtin:minilm-l6', 'builtin:mpnet-base', a hub id, or a local directory",
    )
    revision: str | None = Field(None, max_length=256, description="hub revision (branch, tag or commit); null = main")
    task_tuned: bool = Field(
        False, description="true if the model is already fine-tuned on this task (base_finetune is then skipped)"
    )
    trust_remote_code: bool = Field(False, description="run modeling code shipped with a hub model (trust it first)")

    @model_validator(mode="after")
    def _no_remote_code_for_builtins(self) -> ModelSpec:
        """A built-in model is a packaged copy of a plain architecture: there is no code of its own to trust, and
        asking for it is a sign the recipe means another model."""
        if self.trust_remote_code and self.source.startswith("builtin:"):
            raise ValueError(
                f"trust_remote_code: built-in models ship no remote code; expected false (or no key) with "
                f"model.source '{short_key(self.source)}'"
            )
        return self


class DataSpec(Strict):
    """The labelled text data: where it is, which columns hold text and label, and how much of it is used."""

    source: str = Field(
        "builtin:rotten_tomatoes", max_length=4096, description="'builtin:rotten_tomatoes', a hub dataset, or a path"
    )
    config: str | None = Field(None, max_length=256, description="hub dataset configuration (e.g. a GLUE task)")
    text_fields: list[str] = Field(
        default_factory=lambda: ["text"], min_length=1, max_length=2, description="one text column, or two for pairs"
    )
    label_field: str = Field("label", max_length=256, description="the column of class labels")
    train_labels: bool = Field(
        True,
        description="false: the training split is read as unlabelled text (its label_field is not needed, and "
        "ignored if there); class names come from the validation split, which with test still needs labels to "
        "measure accuracy. Only with a post-training recovery (rescale, none) of a task-tuned model",
    )
    splits: dict[Literal["train", "validation", "test"], str] = Field(
        default_factory=lambda: {"train": "train", "validation": "validation", "test": "test"},
        description="split names for train and validation (required) and test (defaults to the validation split)",
    )
    max_length: int = Field(128, ge=8, le=4096, description="also checked against the model's position embeddings")
    max_train_examples: int | None = Field(None, ge=1, le=10**9, description="cap on training examples; null = all")
    max_eval_examples: int | None = Field(
        None, ge=1, le=10**9, description="cap on validation and test examples; null = all"
    )
    split_seed: int = Field(
        0, ge=0, lt=2**32, description="seed of the splits carved out of one file and of the capped subsets"
    )

    @field_validator("splits")
    @classmethod
    def _train_and_validation(cls, splits: dict[str, str]) -> dict[str, str]:
        missing = [k for k in ("train", "validation") if k not in splits]
        if missing:
            raise ValueError(f"missing {missing}; expected split names for 'train' and 'validation' (and 'test')")
        return {"test": splits["validation"], **splits}


class Int8Spec(Strict):
    """int8 variants: `int8` is dynamic quantisation, `int8_static` static QDQ calibrated on training examples.

    Each requested int8 variant's validation accuracy is compared with its fp32 graph's; one that drops more than
    `max_drop` (a fraction: 0.003 = 0.3 points), or agrees with fp32 on fewer than `min_agreement` of the
    predictions, is kept on disk but marked rejected and never recommended. With `fallback_nodes` > 0 a variant
    that fails is first rescanned: its nodes are ranked by how much int8 error each causes, and up to that many of
    the worst are kept in fp32 until the gate passes (the scan costs one quantisation and one validation pass per
    quantised node). `smooth_alpha` rescales activation outliers into the weights before either kind is quantised
    (SmoothQuant; `compressor.deploy.smoothing`): on every MatMul, with `smooth_scope: cheap` on all but the
    down-projections (1-2% instead of ~5% of int8 speed on MiniLM), with `free` only where the division folds into
    attention (no added node); the last two also smooth those whose input has an outlier `smooth_outlier_ratio`
    strong.
    """

    per_channel: bool = Field(True, description="int8 weights per output channel (else per tensor)")
    reduce_range: bool | Literal["auto"] = Field(
        "auto", description="7-bit int8 weights; auto = on where the x86 CPU lacks VNNI (8-bit weights can saturate)"
    )
    exclude_nodes: list[str] = Field(default_factory=list, description="ONNX node names kept in fp32")
    calibration_examples: int = Field(256, ge=1, le=10**6, description="training examples that calibrate int8_static")
    max_drop: float | None = Field(0.005, ge=0, lt=1, description="allowed validation accuracy drop; null = no gate")
    min_agreement: float | None = Field(
        None, gt=0, le=1, description="required share of validation predictions equal to fp32's; null = not gated"
    )
    fallback_nodes: int = Field(
        0, ge=0, le=1000, description="nodes a failing variant may keep in fp32 to pass its gate; 0 = no fallback"
    )
    eval_examples: int | None = Field(None, ge=1, le=10**9, description="validation examples for the gate; null = all")
    smooth_alpha: float | None = Field(
        None,
        gt=0,
        le=1,
        description="SmoothQuant: move activation outliers into the weights before quantising (per input channel, "
        "s = max|x|^alpha / max|w|^(1-alpha), calibrated on calibration_examples training examples); null = off",
    )
    smooth_scope: Literal["all", "cheap", "free"] = Field(
        "all",
        description="which MatMuls smoothing rescales: all; cheap = skip the down-projections whose input is "
        "wider than their output (their division is an extra pass over the widest activation), so smoothing costs "
        "1-2% of int8 speed on MiniLM instead of ~5%; free = only those whose division folds into attention (no "
        "added node)",
    )
    smooth_outlier_ratio: float | None = Field(
        None,
        gt=1,
        le=1e6,
        description="with smooth_scope cheap or free: still smooth a skipped MatMul whose input has one channel "
        "this many times the median channel's max |x| (a lone huge neuron, BERT's classic int8 failure; one Mul "
        "each); null = never",
    )
    eval_batch_size: int = Field(
        32,
        ge=1,
        le=4096,
        description="batch size of the gate's validation pass: dynamic int8 picks one activation scale per batch, "
        "so its accuracy depends on the batch size it serves at (set yours)",
    )

    @model_validator(mode="after")
    def _outlier_ratio_needs_a_skipping_scope(self) -> Int8Spec:
        if self.smooth_outlier_ratio is not None and self.smooth_scope == "all":
            raise ValueError(
                "smooth_outlier_ratio: only applies with smooth_scope 'cheap' or 'free' (scope 'all' smooths every "
                "MatMul); expected null with scope 'all'"
            )
        return self


class ExportSpec(Strict):
    """ONNX export of the pruned model, each variant checked against PyTorch's logits."""

    enabled: bool = Field(True, description="export ONNX graphs of the pruned model")
    variants: list[Literal[VARIANTS]] = Field(
        default_factory=lambda: ["fp32", "optimized", "int8"],
        description="fp32 graph, ONNX Runtime's fused graph, dynamic int8, static (calibrated) int8",
    )
    int8: Int8Spec = Field(default_factory=Int8Spec)
    atol: float = Field(1e-4, gt=0, le=1, description="largest logit difference from PyTorch an fp32 graph may show")
    opset: int | None = Field(None, ge=11, le=30, description="ONNX opset; null = the exporter's default")
    exporter: Literal["auto", "torch.export", "torchscript"] = Field(
        "auto", description="auto = torch.export, falling back to TorchScript (the report names a fallback and why)"
    )


class AnalysisSpec(Strict):
    """Head-role analysis after pruning; `roles` are the detectors' thresholds (docs/analysis.md)."""

    class Roles(Strict):
        """The detectors' thresholds; `compressor.analysis.RoleConfig` is this model."""

        positional_threshold: float = Field(0.9, gt=0, le=1, description="share of queries at one offset")
        rare_top_k: int = Field(500, ge=0, le=10**7, description="most frequent training pieces never counted as rare")
        rare_threshold: float = Field(0.5, gt=0, le=1, description="share of queries on the rarest piece")
        delimiter_threshold: float = Field(0.5, gt=0, le=1, description="attention share on [CLS]/[SEP]/punct")
        syntactic_margin: float = Field(0.10, ge=0, le=1, description="accuracy points above the offset baseline")
        min_relation_count: int = Field(30, ge=1, le=10**7, description="instances a relation/direction needs to count")
        sieve_tau: float = Field(2.0, gt=0, le=1000, description="sieve bias that H0 allows (1 = no preference)")
        sieve_alpha: float = Field(0.05, gt=0, lt=1, description="significance level after correction")
        sieve_test: Literal["t", "wilcoxon"] = Field("t", description="the sieve's paired test")
        sieve_correction: Literal["holm", "bh", "bonferroni", "none"] = Field(
            "holm", description="multiple-comparison correction across heads"
        )

    enabled: bool = Field(True, description="classify what the kept and removed heads attend to")
    examples: int = Field(256, ge=8, le=10**6, description="validation examples the detectors read")
    roles: Roles = Field(default_factory=Roles)


class AccelerateSpec(Strict):
    """Accelerate's settings for the run's fine-tunes (the base fine-tune and every recovery fine-tune).

    `mixed_precision` runs their forward passes under autocast: `bf16` on CPUs and GPUs that support it, `fp16` on
    CUDA GPUs (with loss scaling); `auto` picks bf16 where the hardware multiplies it natively and fp32 elsewhere (on
    a CPU without AMX-BF16 or AVX512-BF16, bf16 is emulated and slower than fp32). Two forward-only passes that
    feed training or only rank take it too: the teacher's targets and the measured allocation's loss passes.
    Scoring, evaluation, gates, surgery, export and benchmarks stay fp32, and the saved weights are fp32.
    `accelerate launch --mixed_precision bf16` sets the same thing for a launched run (the recipe wins where it says
    other than `no`).
    """

    mixed_precision: Literal["no", "auto", "bf16", "fp16"] = Field(
        "no",
        description="fine-tune forward passes in bf16 or fp16 (autocast); auto = bf16 where the hardware runs "
        "it natively (a CUDA GPU with bf16, a CPU with AMX-BF16 or AVX512-BF16), else fp32; no = fp32",
    )


class Recipe(Repeats):
    name: str = Field("run", max_length=200, description="the run's name in its report")
    output_dir: str = Field(
        "runs/out", min_length=1, max_length=4096, description="where the run writes (relative to the working dir)"
    )
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    base_finetune: TrainSpec = Field(
        default_factory=lambda: TrainSpec(epochs=2.0, lr=5e-5),
        description="fine-tuning of a model not yet tuned on the task, before pruning (cached and reused)",
    )
    prune: PruneSpec = Field(default_factory=PruneSpec)
    export: ExportSpec = Field(default_factory=ExportSpec)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    accelerate: AccelerateSpec = Field(default_factory=AccelerateSpec)

    @model_validator(mode="after")
    def _post_training_needs_a_task(self) -> Recipe:
        """A post-training mode preserves what a task-tuned model knows: a fresh encoder has nothing to preserve.
        A recipe that names `base_finetune` explicitly tunes the base first (cached) and prunes the result."""
        if self.prune.post_training and not self.model.task_tuned and "base_finetune" not in self.model_fields_set:
            raise ValueError(
                f"prune.recovery: '{self.prune.resolved_recovery}' prunes a task-tuned model without training, but "
                "model.task_tuned is false; expected task_tuned: true (or an explicit base_finetune section)"
            )
        return self

    @model_validator(mode="after")
    def _unlabelled_training_needs_no_training(self) -> Recipe:
        """Unlabelled training text can score and fit, never train: no base fine-tune, no recovery fine-tune,
        no criterion that trains (l0)."""
        if self.data.train_labels:
            return self
        if not (self.prune.post_training and self.model.task_tuned):
            raise ValueError(
                "data.train_labels: false (unlabelled training text) needs model.task_tuned: true and "
                "a prune.recovery without finetune (rescale, none); expected a run that trains nothing"
            )
        if self.prune.criterion.name == "l0":
            raise ValueError("data.train_labels: false: criterion 'l0' trains on labels; expected fisher or taylor")
        return self

    @model_validator(mode="after")
    def _references_are_benchmarked(self) -> Recipe:
        """A reference is fine-tuned on the training labels only to be benchmarked beside the members."""
        if self.bench.references and not self.bench.enabled:
            raise ValueError("bench.references: references are compared in the bench; expected bench.enabled: true")
        finetune = self.prune.recovery_finetune
        if self.bench.reference_distill and (finetune is None or finetune.distill is None):
            raise ValueError(
                "bench.reference_distill: a reference learns from the run's teacher targets; expected "
                "prune.finetune.distill"
            )
        if self.bench.references and not self.data.train_labels:
            raise ValueError(
                "bench.references: a reference is fine-tuned on the training split's labels; expected "
                "data.train_labels: true"
            )
        return self

    @model_validator(mode="after")
    def _relative_budget_names_a_reference(self) -> Recipe:
        """A budget relative to a reference times that reference, so it must be one the bench compares with."""
        budget = self.prune.budget
        if budget is not None and budget.relative_to and budget.relative_to not in self.bench.references:
            raise ValueError(
                f"prune.budget.relative_to: '{budget.relative_to}' is not one of bench.references "
                f"{self.bench.references}; expected one of them"
            )
        return self

    @model_validator(mode="after")
    def _budget_runtime_exported(self) -> Recipe:
        """A speed-up on an ONNX runtime is measured on the run's own export of that variant."""
        budget = self.prune.budget
        variant = runtime(budget.runtime).variant if budget is not None and budget.kind == "speedup" else None
        if variant is not None:
            if not self.export.enabled or variant not in self.export.variants:
                raise ValueError(
                    f"prune.budget.runtime: {budget.runtime} is measured on the run's own export; expected "
                    f"export.enabled with '{variant}' in export.variants"
                )
        return self


def parse_recipe(data: Any, origin: str = "recipe") -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"{origin}: expected a YAML mapping at the top level, got {type(data).__name__}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise RecipeError(f"{origin}: {format_validation_error(err)}") from None


def load_recipe(path: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read a YAML recipe safely (bounded safe loading), set `overrides` (dotted keys, `yamlio.apply_settings`) and
    validate it; relative output_dir stays relative to cwd."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe: file '{short(str(path))}' not found")
    return parse_recipe(apply_settings(read_yaml(path), overrides or {}), origin=str(path))


def dump_recipe(recipe: Recipe) -> str:
    """The fully resolved recipe (defaults filled in) as YAML, written next to every run's outputs."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
