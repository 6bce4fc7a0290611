"""The recipe: YAML → typed, strict configuration (schema only).

Owns the recipe's sections (`schema`, `prune`, `budget`, `bench`, `base`) and how a recipe file is read (`yamlio`:
bounded safe YAML, duplicate keys refused, one-line errors). May import nothing of ours but `core.errors`; what it
needs to know of the criteria and the recovery steps is registered by them (`base.register_criteria`,
`recovery.declare`).
"""

from compressor.recipe.base import Strict
from compressor.recipe.bench import BenchSpec
from compressor.recipe.budget import BudgetSpec
from compressor.recipe.prune import CriterionSpec, DistillSpec, FinetuneSpec, PruneSpec, TrainSpec
from compressor.recipe.schema import (
    AnalysisSpec,
    DataSpec,
    ExportSpec,
    Int8Spec,
    ModelSpec,
    Recipe,
    dump_recipe,
    load_recipe,
    parse_recipe,
)
from compressor.recipe.yamlio import RecipeError, format_validation_error, read_yaml, settings_of, short, short_key

__all__ = [
    "AnalysisSpec",
    "BenchSpec",
    "BudgetSpec",
    "CriterionSpec",
    "DataSpec",
    "DistillSpec",
    "ExportSpec",
    "FinetuneSpec",
    "Int8Spec",
    "ModelSpec",
    "PruneSpec",
    "Recipe",
    "RecipeError",
    "Strict",
    "TrainSpec",
    "dump_recipe",
    "format_validation_error",
    "load_recipe",
    "parse_recipe",
    "read_yaml",
    "settings_of",
    "short",
    "short_key",
]
