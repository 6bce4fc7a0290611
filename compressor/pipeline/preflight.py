"""Every check a run makes before any work, in one place and once: the run directory, the recipe against the model's
config (schedule, positions, budget, width, a task-tuned model's head), and against the data (the label set, each
reference), and last a speed-up budget's reach (its latency tables, measured into the cache when absent). Each check
is one line naming the field (exit 2), and nothing is written to the run or trained before they pass.

The checks themselves live with what they check (`pruning.selection`, `pruning.budget`, `pruning.width`,
`sources.models`, `pipeline.references`); this module is where a run calls them, in order, reading the config and
the data once. `runner.prepare` then takes the directory and tokenises with what was checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import yaml

from compressor.core import outdir
from compressor.core.errors import UserError
from compressor.pipeline import runlog
from compressor.pipeline.references import check_references
from compressor.pruning.budget import check_budget, check_reach
from compressor.pruning.latency.check import reference_speedup
from compressor.pruning.selection import check_against_model
from compressor.pruning.width import check_width
from compressor.recipe import ModelSpec, Recipe, RecipeError, parse_recipe
from compressor.sources import TaskData, load_task_data
from compressor.sources.models import check_task_head, labels_match, load_config, max_positions, model_labels
from compressor.surgery.arch import config_head_counts


@dataclass(frozen=True)
class Checked:
    """What the preflight read and found fit: the run directory to take, the model's config, the task's data, and
    the recipe the run executes (the one given, with a budget `relative_to` a reference measured into speed-ups:
    `reference_speedup`, that reference's measured speed-up over the model; None without one)."""

    target: outdir.RunDir
    config: object
    data: TaskData
    recipe: Recipe
    reference_speedup: float | None = None


def preflight(recipe: Recipe, force: bool) -> Checked:
    """Check, before any weights load or anything is written, that the run can start; returns what it read. What it
    logs is printed and held for the run's log (`runlog.held`: a failed preflight's lines reach no later log)."""
    from accelerate import PartialState

    with runlog.held(PartialState().is_main_process):
        return _checked(recipe, force)


def _checked(recipe: Recipe, force: bool) -> Checked:
    target = outdir.check_run_dir(recipe.output_dir, force, partial(_same_recipe, recipe=recipe))
    config = load_config(recipe.model)
    layers, heads = config_head_counts(config)
    check_against_model(recipe, layers * heads, max_positions(config))
    check_budget(config, recipe.prune)
    check_width(config, recipe.prune)
    check_task_head(recipe.model, config)
    data = load_task_data(recipe.data)
    check_labels(recipe, config, data)
    check_references(recipe, data.label_names)
    measured, speedup = _measured_budget(recipe, config, data.num_labels)
    _check_reach(measured, config, data.num_labels)
    return Checked(target, config, data, measured, speedup)


def _measured_budget(recipe: Recipe, config, num_labels: int) -> tuple[Recipe, float | None]:
    """A budget `relative_to` a reference as speed-ups over the model: the reference's shape timed against the
    model's on the budget's runtime (`pruning.latency.check.reference_speedup`, cached), by the main process first
    as the latency tables are. Any other recipe is returned as it is."""
    from accelerate import PartialState

    budget = recipe.prune.budget
    if budget is None or not budget.relative_to:
        return recipe, None
    reference = load_config(ModelSpec(source=budget.relative_to))
    with PartialState().main_process_first():
        speedup = reference_speedup(config, reference, budget.runtime, budget.batch_size, budget.seq_len, num_labels)
    try:
        measured = budget.measured_against(speedup)
    except ValueError as err:
        raise UserError(f"prune.budget.{err}") from None
    prune = recipe.prune.model_copy(update={"budget": measured})
    return recipe.model_copy(update={"prune": prune}), speedup


def _check_reach(recipe: Recipe, config, num_labels: int) -> None:
    """A speed-up budget out of reach, said before the base fine-tune (`pruning.budget.check_reach`). Its latency
    tables are the run's own, measured here when not cached, by the main process first as the steps do."""
    from accelerate import PartialState

    with PartialState().main_process_first():
        check_reach(config, recipe.prune, num_labels)


def _same_recipe(resolved: Path, recipe: Recipe) -> bool:
    """Whether the recipe an unfinished run was started with equals `recipe`, compared as parsed recipes (so a
    newer compressor that spells a default or a renamed key differently still resumes the same run)."""
    try:
        return parse_recipe(yaml.safe_load(resolved.read_text())) == recipe
    except (RecipeError, yaml.YAMLError):
        return False


def check_labels(recipe: Recipe, config, data: TaskData) -> None:
    """A task-tuned model must have the dataset's label set (count, and names when the model has real ones)."""
    if not recipe.model.task_tuned:
        return
    if config.num_labels != data.num_labels:
        raise UserError(
            f"data.label_field: dataset labels {data.label_names[:6]} ({data.num_labels}) do not match the "
            f"task-tuned model's {config.num_labels} labels; expected the model's label set"
        )
    if not labels_match(config, data.label_names):
        raise UserError(
            f"data.label_field: dataset labels {data.label_names} are not the model's labels "
            f"{model_labels(config)}; expected the same names in the same order"
        )
