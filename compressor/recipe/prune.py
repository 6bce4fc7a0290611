"""The recipe's training and pruning sections: fine-tuning, distillation, the criterion, the budget and the
schedule. Criterion names, parameters and scored units are checked against the registered catalog (`base.criteria`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from compressor.recipe.base import Strict, criteria
from compressor.recipe.budget import BudgetSpec
from compressor.recipe.recovery import parse_steps, recovery_name, traits


class TrainSpec(Strict):
    """A fine-tune: AdamW with linear warm-up and decay, through Accelerate."""

    epochs: float = Field(1.0, gt=0, le=1000, description="passes over the training examples (fractions allowed)")
    lr: float = Field(3e-5, gt=0, lt=1, description="peak learning rate")
    batch_size: int = Field(32, ge=1, le=65536, description="examples per optimiser step (per process)")
    weight_decay: float = Field(0.01, ge=0, le=10, description="AdamW weight decay")
    warmup_ratio: float = Field(0.06, ge=0, lt=1, description="share of the steps spent warming the rate up")
    max_examples: int | None = Field(None, ge=1, le=10**9, description="cap on training examples per epoch")
    group_by_length: bool = Field(
        True, description="shuffle batches of similar-length examples (less padding on ragged text)"
    )


class DistillSpec(Strict):
    """Distillation from the task-tuned original (the teacher) during recovery fine-tuning.

    The loss is `(1 - alpha) * task CE + alpha * T² · KL(teacher_T || student_T)` on temperature-`T` softened
    logits, plus `hidden_weight` × the mean squared error between each kept layer's hidden states and the teacher's.
    Teacher logits are computed once per training example and cached; teacher hidden states are only computed
    (during training) when `hidden_weight` > 0.
    """

    alpha: float = Field(0.5, ge=0, le=1, description="weight of the KL term; the task loss gets 1 - alpha")
    temperature: float = Field(2.0, gt=0, le=100, description="softening temperature of both logit distributions")
    hidden_weight: float = Field(
        0.0, ge=0, le=1000, description="weight of layer-wise hidden-state MSE over the layers kept; 0 turns it off"
    )
    teacher_batch_size: int = Field(64, ge=1, le=65536, description="batch size of the one-off teacher pass")


class FinetuneSpec(TrainSpec):
    """Recovery fine-tuning between pruning steps: a `TrainSpec` plus optional distillation (null = off)."""

    distill: DistillSpec | None = None


class CriterionSpec(Strict):
    """How units are scored (`compressor.pruning.criteria`; the lowest scores are removed)."""

    name: str = Field("taylor", description="a registered criterion (`compressor validate` lists them on a typo)")
    params: dict[str, Any] = Field(default_factory=dict, description="the criterion's own parameters")

    @model_validator(mode="after")
    def _known(self) -> CriterionSpec:
        try:
            criteria().check_params(self.name, self.params)
        except ValueError as err:
            raise ValueError(str(err).removeprefix("prune.criterion.")) from None
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
    units: list[Literal["heads", "neurons", "layers", "hidden"]] = Field(
        default_factory=lambda: ["heads"],
        min_length=1,
        description="unit kinds that compete for the budget; 'layers' (with heads and neurons, allocation "
        "'measured') also proposes removing whole layers, ranked by the measured loss of dropping each; 'hidden' "
        "also narrows the residual stream: to hidden_size channels step by step, or as the budget allocates it",
    )
    hidden_size: int | None = Field(
        None, ge=1, le=65536, description="units 'hidden': the residual width the last step keeps (a multiple of "
        "hidden_multiple, below the model's); the steps narrow to it in equal shares of hidden_multiple channels. "
        "null: the width is allocated like the other kinds (allocation 'measured', a flops or speedup budget): a "
        "step narrows by hidden_multiple channels where that costs the least measured loss per cost saved",
    )  # fmt: skip
    hidden_multiple: int = Field(
        64, ge=1, le=4096, description="units 'hidden': every width a step keeps is a multiple of it (fast kernels)"
    )
    budget: BudgetSpec | None = Field(None, description="one budget for the whole model instead of `target`")
    uniform_ffn: bool = Field(
        False, description="remove neurons in equal numbers per layer so plain transformers can load the result"
    )
    steps: int = Field(4, ge=1, le=100, description="refused at run time when a step would remove no head")
    schedule: Literal["linear", "geometric"] = Field(
        "linear", description="head/FLOP budgets: equal amounts per step, or the same share of what is left"
    )
    scope: Literal["global", "per_layer"] = Field(
        "global", description="rank heads across the model, or remove the same share from every layer"
    )
    min_heads_per_layer: int = Field(0, ge=0, le=4096, description="heads every layer keeps")
    allocation: Literal["measured", "ratio"] = Field("measured", description="unit kinds share a FLOP/speed-up "
        "budget by each slice's measured loss increase per cost, or by the criterion's score per cost")  # fmt: skip
    allocation_parts: int = Field(4, ge=1, le=64, description="slices per step for allocation 'measured'")
    allocation_examples: int | None = Field(
        None, ge=1, le=10**7, description="allocation 'measured': examples its loss passes read, the first of the "
        "scoring batches (null: all of them; a post-training sample of thousands can pass a few hundred)",
    )  # fmt: skip
    score_examples: int = Field(512, ge=1, le=10**7, description="training examples the criterion reads per step")
    score_batch_size: int = Field(32, ge=1, le=65536, description="batch size of the scoring passes")
    finetune: FinetuneSpec | None = Field(
        default_factory=lambda: FinetuneSpec(epochs=1.0, lr=3e-5),
        description="recovery fine-tune after every pruning step (null = none)",
    )

    @field_validator("finetune", mode="before")
    @classmethod
    def _plain_train_spec(cls, value: Any) -> Any:
        """A plain `TrainSpec` (from Python) is a `FinetuneSpec` without distillation."""
        return value.model_dump() if isinstance(value, TrainSpec) and not isinstance(value, FinetuneSpec) else value

    recovery: list[str] | None = Field(
        None,
        description="the steps that repair the model after each pruning step, in order (`compressor.recovery.steps`): "
        "`finetune` (prune.finetune), `rescale` (per-unit scales fitted by least squares, no training); [] = none "
        "(one-shot). The old names still read: finetune, rescale, rescale_finetune ([rescale, finetune]), none ([]). "
        "null: [finetune], or [] with finetune: null. A list that trains nothing is post-training: it reads only "
        "sample_size training examples and needs a task-tuned model",
    )

    @field_validator("recovery", mode="before")
    @classmethod
    def _recovery_steps(cls, value: Any) -> Any:
        """An old name becomes its list of steps; every step must be a registered one (`recipe.recovery`)."""
        return parse_steps(value)

    sample_size: int = Field(
        2000, ge=1, le=10**7, description="post-training recoveries: the training examples scoring and the fit use "
        "(the run reads no others); a recovery that also fine-tunes: the examples of rescale's fit",
    )  # fmt: skip
    member_finetune: TrainSpec | None = Field(
        None,
        description="a last, longer recovery fine-tune of each model the run saves (every family member; a "
        "one-target run's model), its kept units trained and distilled as the steps' are (prune.finetune.distill), "
        "on the member's own copy: later steps go on from the model before it; the layer-drop baseline gets it "
        "too. Applied by `compressor run` as it saves members; `compressor.prune` returns the steps' models, before "
        "it (null: none)",
    )
    member_epochs: list[float] | None = Field(
        None,
        description="epochs of each member's final fine-tune, one per target in ascending order, instead of "
        "member_finetune.epochs (a deeper member may need a longer schedule; its layer-drop baseline gets the "
        "same). null: member_finetune.epochs for every member",
    )
    baseline: Literal["layer_drop"] | None = Field(
        "layer_drop", description="compare with dropping top layers to the pruned FLOPs, fine-tuned alike (null: off)"
    )

    def member_spec(self, index: int) -> TrainSpec | None:
        """Member `index`'s final fine-tune (targets ascending): `member_finetune` with its `member_epochs` entry."""
        if self.member_finetune is None or self.member_epochs is None:
            return self.member_finetune
        return self.member_finetune.model_copy(update={"epochs": self.member_epochs[index]})

    def _layers_fit(self) -> None:
        """Whole layers compete as units only beside heads and neurons, by measured loss, under a FLOP or speed-up
        budget, and not with equal FFN widths (a removed layer has none)."""
        if not {"heads", "neurons"} <= set(self.units) or self.allocation != "measured":
            raise ValueError("units: 'layers' needs units heads and neurons too and allocation 'measured'")
        if self.resolved_budget.kind == "heads" or self.uniform_ffn:
            raise ValueError("units: 'layers' needs a flops or speedup budget and uniform_ffn off")

    def _hidden_fit(self) -> None:
        """A width cut names its width, on the multiple's grid, and is repaired by training (no rescale fit)."""
        if "hidden" not in self.units:
            if self.hidden_size is not None:
                raise ValueError("hidden_size: only applies when units include 'hidden'")
            return
        if self.hidden_size is None:  # the width is allocated: only the measured allocation can price it
            if self.allocation != "measured" or self.resolved_budget.kind == "heads":
                raise ValueError(
                    "hidden_size: units include 'hidden'; expected the residual width to keep, e.g. 384 (or null "
                    "with allocation 'measured' under a flops or speedup budget, which allocates the width)"
                )
        elif self.hidden_size % self.hidden_multiple:
            raise ValueError(
                f"hidden_multiple: {self.hidden_multiple} does not divide hidden_size {self.hidden_size}; expected a "
                "width that is a multiple of it"
            )
        if self.reads_sample or self.recovery_finetune is None:  # a step that fits on samples (rescale) or none
            raise ValueError(
                "recovery: units 'hidden' are repaired by fine-tuning; expected finetune, got "
                f"'{self.resolved_recovery}'"
            )

    @property
    def recovery_steps(self) -> list[str]:
        """The recovery steps in force, in order: `recovery`, or [finetune] / [] from whether `finetune` is set."""
        if self.recovery is not None:
            return list(self.recovery)
        return ["finetune"] if self.finetune is not None else []

    @property
    def resolved_recovery(self) -> str:
        """The name of the steps in force (`recipe.recovery.recovery_name`: `rescale_finetune`, `none`, ...)."""
        return recovery_name(self.recovery_steps)

    @property
    def trains(self) -> bool:
        """Whether a recovery step fine-tunes (with `finetune`)."""
        return any(traits(name).trains for name in self.recovery_steps)

    @property
    def post_training(self) -> bool:
        """No training at all (a recovery list that trains nothing, asked for): scoring and fitting read only
        `sample_size` training examples."""
        return self.recovery is not None and not self.trains

    @property
    def reads_sample(self) -> bool:
        """Whether the run reads the `sample_size` examples: post-training, or a step fits on them (rescale)."""
        return self.post_training or any(traits(name).samples for name in self.recovery_steps)

    @property
    def recovery_finetune(self) -> FinetuneSpec | None:
        """The fine-tuning each step (and the layer-drop baseline) gets: `finetune`, or None when no recovery step
        trains."""
        return self.finetune if self.trains else None

    @property
    def scoring_examples(self) -> int:
        """Training examples the criterion scores on: the sample in post-training modes, else `score_examples`."""
        return self.sample_size if self.post_training else self.score_examples

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
    def _recovery_trains(self) -> PruneSpec:
        name = self.resolved_recovery
        if self.trains and self.finetune is None:
            raise ValueError(f"recovery: '{name}' fine-tunes; expected finetune settings, got finetune: null")
        if self.post_training and self.member_finetune is not None:
            raise ValueError(
                f"member_finetune: recovery '{name}' trains nothing and reads only sample_size examples; "
                "expected member_finetune: null (or a recovery with finetune in it)"
            )
        if self.member_epochs is not None:
            self._member_epochs_fit()
        return self

    def _member_epochs_fit(self) -> None:
        targets = self.resolved_budget.targets
        if self.member_finetune is None:
            raise ValueError("member_epochs: needs member_finetune settings; got member_finetune: null")
        if len(self.member_epochs) != len(targets) or not all(0 < e <= 1000 for e in self.member_epochs):
            raise ValueError(
                f"member_epochs: expected {len(targets)} epoch counts in (0, 1000], one per target {targets}, "
                f"got {self.member_epochs}"
            )

    @model_validator(mode="after")
    def _units_fit(self) -> PruneSpec:
        if len(set(self.units)) != len(self.units):
            raise ValueError(f"units: expected distinct unit kinds, got {self.units}")
        if "neurons" in self.units and self.resolved_budget.kind == "heads":
            raise ValueError("units: 'neurons' needs budget kind flops or speedup; a head fraction counts heads only")
        if self.budget is not None and self.budget.kind != "speedup" and self.budget.runtime != "pytorch":
            raise ValueError(f"budget.runtime: only applies to kind 'speedup', got kind '{self.budget.kind}'")
        if self.scope != "global" and self.resolved_budget.kind != "heads":
            raise ValueError("scope: 'per_layer' applies to a head-fraction target only; expected 'global' here")
        if self.uniform_ffn and "neurons" not in self.units:
            raise ValueError("uniform_ffn: only applies when units include 'neurons'")
        if "layers" in self.units:
            self._layers_fit()
        self._hidden_fit()
        for unit in self.units:
            if unit not in ("layers", "hidden") and unit not in criteria().units_of(self.criterion.name):
                raise ValueError(
                    f"criterion.name: '{self.criterion.name}' cannot score {unit}; expected one of "
                    f"{criteria().scoring(unit)}"
                )
        return self
