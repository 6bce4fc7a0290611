"""The base of every recipe section, and the hook through which criteria tell the schema what they accept.

The recipe depends on nothing else of ours (but `core.errors`): a validator that needs another package's knowledge
gets it by registration. `compressor.pruning.criteria` registers its catalog on import (`register_criteria`);
`compressor/__init__.py` imports it, so any import of the recipe has the criteria registered.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Strict(BaseModel):
    """Unknown keys are errors, every float must be finite (`.inf` epochs would train forever), and values are not
    converted between types: a number field takes a YAML number only (an integer where a float is expected, but
    never a quoted `"0.5"` or a `true`), a flag takes `true`/`false` only, a list a YAML list."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


MAX_SEED = 1000  # the largest repeat seed `seeds` accepts (`compressor.pipeline.seeds` spaces their draws apart)
MAX_SEEDS = 100  # the most repeats one recipe asks for


class Repeats(Strict):
    """The recipe's seeds, a base of `Recipe`: `seed`, the base fine-tune's own seed (a repeat holds it at the
    first run's while its `seed` moves), and the seeds to repeat the run over (`compressor.pipeline.seeds`)."""

    seed: int = Field(0, ge=0, lt=2**32, description="seed of every random choice (shuffling, initialisation)")
    base_seed: int | None = Field(
        None, ge=0, lt=2**32, description="seed of the base fine-tune only (null = seed); repeats over seeds share it"
    )
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        max_length=MAX_SEEDS,
        description=f"repeat the run over these seeds (distinct, 0..{MAX_SEED}; 0 = this recipe's own run): the base "
        "fine-tune is shared, everything after it redrawn, each repeat under <output_dir>/seed-<k>/ "
        "(`compressor run --seeds` overrides it)",
    )

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int] | None) -> list[int] | None:
        """Repeats are told apart by their seed: each in range, none twice."""
        if seeds is not None and (any(not 0 <= k <= MAX_SEED for k in seeds) or len(set(seeds)) != len(seeds)):
            raise ValueError(f"expected distinct integers from 0 to {MAX_SEED}, got {seeds}")
        return seeds

    @property
    def base_finetune_seed(self) -> int:
        """The base fine-tune's seed: `base_seed`, else the recipe's `seed`."""
        return self.seed if self.base_seed is None else self.base_seed


@dataclass(frozen=True)
class CriterionCatalog:
    """What the schema needs to know of the criteria: a parameter check, the units a criterion scores, and the
    criteria that score a unit (for the error message)."""

    check_params: Callable[[str, dict], None]
    units_of: Callable[[str], Collection[str]]
    scoring: Callable[[str], list[str]]


_CATALOG: list[CriterionCatalog] = []


def register_criteria(catalog: CriterionCatalog) -> None:
    """Called by `compressor.pruning.criteria` when it is imported (the latest registration wins)."""
    _CATALOG[:] = [catalog]


def criteria() -> CriterionCatalog:
    """The registered criterion catalog."""
    if not _CATALOG:
        raise RuntimeError("no criteria registered with the recipe schema: import compressor.pruning.criteria")
    return _CATALOG[0]
