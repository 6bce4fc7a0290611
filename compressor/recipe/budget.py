"""The recipe's budget (`prune.budget`): how much to prune, for the whole model, and where a speed-up is measured."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, FiniteFloat, model_validator

from compressor.core.runtimes import BUDGET_NAMES
from compressor.recipe.base import Strict


class BudgetSpec(Strict):
    """How much to prune, for the whole model: a fraction of heads removed, a fraction of encoder FLOPs removed,
    or a measured speed-up on a named runtime at a batch size and sequence length (`compressor.pruning.latency`).

    `runtime` (a `compressor.core.runtimes` declaration with `budget`), `batch_size`, `seq_len`: where a speed-up
    is measured;
    `calibrate`: time the real pruned model after every step to correct the table (`compressor.pruning.latency.check`).
    `check_rounds`: the rounds of each member's final check against its target (`pipeline.measure.budget_checks`).
    `latency_table`: a table file (JSON, as `compressor.pruning.latency.load_or_build` caches it, e.g. measured on
    another CPU) used instead of this machine's; the calibration still times this machine, so the table steers which
    units go (its cost ratios) while the measured speed-up decides when a target is met.
    """

    kind: Literal["heads", "flops", "speedup"] = Field("heads", description="what the budget counts")
    value: float = Field(
        0.5, allow_inf_nan=False, description="heads/flops: fraction removed, in (0, 1); speedup: factor, in (1, 100]"
    )
    values: list[FiniteFloat] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="several targets, ascending: one run prunes through them in order and saves a model at each "
        "(a model family); `value` is then the last",
    )
    runtime: Literal[BUDGET_NAMES] = Field(
        "pytorch", description="where a speed-up is timed (the declared runtimes a speed-up can be measured on)"
    )
    batch_size: int = Field(32, ge=1, description="batch size a speed-up is timed at")
    seq_len: int = Field(64, ge=8, le=4096, description="tokens per example a speed-up is timed at")
    calibrate: bool = Field(True, description="time the real pruned model after every step to correct the table")
    check_rounds: int = Field(
        7,
        ge=1,
        le=1000,
        description="rounds of each member's budget check after the bench (kind 'speedup'): the member alone against "
        "the original on the runtime; its median decides 'within 10%'",
    )
    latency_table: str | None = Field(
        None, description="a latency table JSON to use instead of measuring this machine's (kind 'speedup' only)"
    )
    relative_to: str | None = Field(
        None,
        description="kind 'speedup': one of `bench.references`; `value`/`values` are then multiples of that "
        "reference's speed-up over the model, measured on `runtime` at `batch_size` x `seq_len` when the run starts "
        "(1.0: as fast as the reference)",
    )

    @property
    def targets(self) -> list[float]:
        """Every target the run saves a model at, ascending: `values`, or `[value]`."""
        return list(self.values) if self.values else [self.value]

    @property
    def is_family(self) -> bool:
        """Whether the run saves several models (`values` with more than one target)."""
        return len(self.targets) > 1

    def describe(self) -> str:
        """One phrase for humans, e.g. '2.0x speed-up on pytorch (batch 32, 64 tokens)', '50% of heads', or
        '1.5x, 2.0x, 3.0x speed-up on pytorch (...)' for a family."""
        if self.kind == "speedup":
            amounts = ", ".join(f"{v}x" for v in self.targets)
            if self.relative_to:
                amounts = f"{amounts} {self.relative_to}'s"
            return f"{amounts} speed-up on {self.runtime} (batch {self.batch_size}, {self.seq_len} tokens)"
        amounts = ", ".join(f"{v:.0%}" for v in self.targets)
        return f"{amounts} of {'heads' if self.kind == 'heads' else 'encoder FLOPs'}"

    @model_validator(mode="before")
    @classmethod
    def _value_is_last(cls, data: Any) -> Any:
        """With `values`, `value` defaults to the last (largest) target; given both, they must agree."""
        if not isinstance(data, dict) or not isinstance(data.get("values"), list) or not data["values"]:
            return data
        last = data["values"][-1]
        if data.get("value") is None:
            return {**data, "value": last}
        if isinstance(last, int | float) and float(data["value"]) != float(last):
            raise ValueError(f"value: {data['value']} is not the last of values {data['values']}; give one of them")
        return data

    @model_validator(mode="after")
    def _value_in_range(self) -> BudgetSpec:
        for value in self.targets:
            self._check_amount(value)
        if self.values and any(b <= a for a, b in zip(self.values, self.values[1:], strict=False)):
            raise ValueError(f"values: expected distinct targets in ascending order, got {self.values}")
        fields = type(self).model_fields  # a resolved recipe writes every default out: only a changed one is refused
        given = [n for n in ("latency_table", "check_rounds", "relative_to") if getattr(self, n) != fields[n].default]
        if given and self.kind != "speedup":
            raise ValueError(f"{given[0]}: only applies to kind 'speedup', got kind '{self.kind}'")
        return self

    def measured_against(self, reference_speedup: float) -> BudgetSpec:
        """This budget with `relative_to`'s multiples turned into speed-ups over the model, given the reference's
        measured `reference_speedup` (rounded to 0.01x, so members are named alike across repeats); one line naming
        the field when a target comes out at or below 1x or above 100x."""
        targets = [round(v * reference_speedup, 2) for v in self.targets]
        for multiple, target in zip(self.targets, targets, strict=True):
            if not 1 < target <= 100:
                raise ValueError(
                    f"{'values' if self.values else 'value'}: {multiple} x {self.relative_to}'s measured "
                    f"{reference_speedup:.2f}x is {target}x; expected a speed-up above 1 and at most 100"
                )
        if len(set(targets)) < len(targets):
            raise ValueError(f"values: {self.values} x {reference_speedup:.2f}x round to equal targets {targets}")
        update = {"value": targets[-1], "values": targets if self.values else None, "relative_to": None}
        return self.model_copy(update=update)

    def _check_amount(self, value: float) -> None:
        field = "values" if self.values else "value"
        if self.kind == "speedup" and self.relative_to and not 0 < value <= 100:
            raise ValueError(
                f"{field}: with relative_to expected a multiple of the reference's speed-up above 0 and at most 100,"
                f" got {value}"
            )
        if self.kind == "speedup" and not self.relative_to and not 1 < value <= 100:
            raise ValueError(
                f"{field}: for kind 'speedup' expected a speed-up factor above 1 and at most 100, got {value}"
            )
        if self.kind != "speedup" and not 0 < value < 1:
            raise ValueError(
                f"{field}: for kind '{self.kind}' expected a fraction removed between 0 and 1, got {value}"
            )
