"""The base of every recipe section, and the hook through which criteria tell the schema what they accept.

The recipe depends on nothing else of ours (but `core.errors`): a validator that needs another package's knowledge
gets it by registration. `compressor.pruning.criteria` registers its catalog on import (`register_criteria`);
`compressor/__init__.py` imports it, so any import of the recipe has the criteria registered.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are errors, every float must be finite (`.inf` epochs would train forever), and values are not
    converted between types: a number field takes a YAML number only (an integer where a float is expected, but
    never a quoted `"0.5"` or a `true`), a flag takes `true`/`false` only, a list a YAML list."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


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
