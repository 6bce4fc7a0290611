"""`compressor init RECIPE`: write a starter recipe with every field at its default and commented."""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.core.errors import UserError, one_line_errors


@one_line_errors
def init(
    recipe: Path = typer.Argument(..., help="path of the YAML recipe to write"),
    model: str = typer.Option(None, "--model", help="model.source: a hub id, a local directory or builtin:NAME"),
    data: str = typer.Option(None, "--data", help="data.source: a hub dataset, a local file or builtin:NAME"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing file"),
) -> None:
    """Write a starter recipe (generated from the recipe schema, so every field is there with what it means)."""
    import yaml

    from compressor.core.atomic import write_text
    from compressor.recipe import parse_recipe
    from compressor.recipe.template import starter_recipe

    if recipe.exists() and not force:
        raise UserError(f"recipe: '{recipe}' already exists; expected a new path (or --force to overwrite it)")
    if not recipe.parent.is_dir():
        raise UserError(f"recipe: directory '{recipe.parent}' does not exist; expected an existing directory")
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in recipe.stem) or "run"
    text = starter_recipe(model=model, data=data, name=name)
    parse_recipe(yaml.safe_load(text), origin=str(recipe))  # a bad --model/--data is refused before anything is written
    write_text(recipe, text)
    typer.echo(f"wrote {recipe}: check it with `compressor validate {recipe}`, run it with `compressor run {recipe}`")


def register(app: typer.Typer) -> None:
    app.command("init")(init)
