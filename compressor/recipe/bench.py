"""The recipe's bench section (`bench`): what is timed and scored, against what, and which references join it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from compressor.core.runtimes import NAMES, QUANTIZE_ONLY, runtime
from compressor.recipe.base import Strict
from compressor.recipe.prune import TrainSpec
from compressor.recipe.yamlio import short


def _distinct_within(v: list[int], ok, expected: str, what: str) -> list[int]:
    """`v` when every value is `ok` and none repeats; else the validator's message, naming what was expected."""
    if not all(ok(x) for x in v):
        raise ValueError(f"expected {expected}, got {short(v)}")
    if len(set(v)) != len(v):
        raise ValueError(f"expected distinct {what}, got {short(v)}")
    return v


class BenchSpec(Strict):
    """Benchmark settings: every sequence length in `seq_lens` is timed at every batch size in `batch_sizes`.

    The summary's single headline figure is at the first sequence length. The older single-length key
    `seq_len: N` is still accepted and means `seq_lens: [N]` (giving both is an error); `spec.seq_len` reads the
    first length.
    """

    enabled: bool = Field(True, description="time and score the original, the pruned model and its ONNX variants")
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32, 64], min_length=1, description="distinct")
    seq_lens: list[int] = Field(
        default_factory=lambda: [64], min_length=1, description="tokens per synthetic timing example, 8 to 4096"
    )
    rounds: int = Field(
        5, ge=1, le=1000, description="interleaved timing rounds (at most, with precision); the median is reported"
    )
    precision: float | None = Field(
        0.03,
        gt=0,
        le=1,
        description="a candidate stops being timed after 3 rounds once the 95% interval of its paired speed-up is "
        "within this fraction of it, or wholly below 1 (null: every candidate gets every round)",
    )
    warmup: int = Field(2, ge=0, le=1000, description="untimed calls before timing")
    min_time_s: float = Field(0.5, gt=0, le=3600, description="minimum timed duration of one measurement")
    threads: int | None = Field(None, ge=1, le=4096, description="intra-op threads; null = the runtime's default")
    eval_examples: int | None = Field(None, ge=1, le=10**9, description="test examples scored; null = all")
    quantize_only: list[Literal[NAMES]] = Field(
        default_factory=lambda: list(QUANTIZE_ONLY),
        description="runtimes on which the unpruned original is exported too and benchmarked beside the members "
        "(quantizing instead of pruning, on every frontier; needs export.enabled); [] = none",
    )
    max_drop: float | None = Field(
        0.01, ge=0, le=1, description="test accuracy a recommended variant may lose vs the original (null: no gate)"
    )
    references: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="other models to compare with (a built-in, a hub id or a local directory, as model.source): "
        "each is fine-tuned on the same split with reference_finetune, else base_finetune (cached like the base), "
        "exported like a member and "
        "benchmarked beside the members and the original, marked as a reference on the frontier",
    )
    reference_finetune: TrainSpec | None = Field(
        None,
        description="the fine-tune each reference gets (null: the recipe's base_finetune). A smaller model often "
        "wants its own settings (a higher learning rate, more examples) to be a fair alternative",
    )
    reference_distill: bool = Field(
        False,
        description="each reference learns from the run's teacher targets as the members do (prune.finetune.distill): "
        "the alternative of distilling the original into the small model, not only fine-tuning it",
    )

    @field_validator("quantize_only")
    @classmethod
    def _exported_runtimes(cls, names: list[str]) -> list[str]:
        unexported = [n for n in names if runtime(n).variant is None]
        if unexported:
            raise ValueError(f"{unexported[0]!r} runs no export; expected exported runtimes such as onnx-int8")
        return list(dict.fromkeys(names))

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
        return _distinct_within(v, lambda b: b > 0, "positive batch sizes", "batch sizes")

    @field_validator("seq_lens")
    @classmethod
    def _lengths(cls, v: list[int]) -> list[int]:
        return _distinct_within(
            v, lambda s: 8 <= s <= 4096, "sequence lengths from 8 to 4096 tokens", "sequence lengths"
        )

    @field_validator("references")
    @classmethod
    def _reference_sources(cls, v: list[str]) -> list[str]:
        for source in v:
            if not source.strip() or len(source) > 4096:
                raise ValueError(f"expected model sources (a built-in, a hub id or a directory), got {short(source)}")
        if len(set(v)) != len(v):
            raise ValueError(f"expected distinct references, got {short(v)}")
        return v

    @property
    def seq_len(self) -> int:
        """The first (headline) sequence length."""
        return self.seq_lens[0]
