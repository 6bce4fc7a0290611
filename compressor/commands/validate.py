"""`compressor validate RECIPE`: check a recipe without loading any model or dataset."""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.core.errors import one_line_errors


@one_line_errors
def validate(
    recipe: Path = typer.Argument(..., help="YAML recipe"),
    settings: list[str] = typer.Option(None, "--set", help="set one recipe field, KEY=VALUE, as `run --set` does"),
) -> None:
    """Check schema, value ranges and criterion parameters; exit 2 with one line naming the field on error."""
    from compressor.recipe import load_recipe, settings_of

    r = load_recipe(recipe, settings_of(settings))
    typer.echo(
        f"ok: {recipe} — model {r.model.source}, data {r.data.source}, criterion {r.prune.criterion.name}, "
        f"budget {r.prune.resolved_budget.describe()} in {r.prune.steps} steps → {r.output_dir}"
    )


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
