"""`compressor run RECIPE`: prune, fine-tune, remove, export, benchmark and report."""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.core.errors import one_line_errors


@one_line_errors
def run(
    recipe: Path = typer.Argument(..., help="YAML recipe"),
    force: bool = typer.Option(False, "--force", help="overwrite a finished run in the output directory"),
    output_dir: str = typer.Option(None, "--output-dir", help="override the recipe's output_dir"),
) -> None:
    """Run a recipe end to end (resumes an interrupted run in the same output directory)."""
    from compressor.pipeline.runner import run_recipe
    from compressor.recipe import load_recipe

    overrides = {"output_dir": output_dir} if output_dir else None
    parsed = load_recipe(recipe, overrides)
    if run_recipe(parsed, force=force):  # empty on the processes that only helped (accelerate launch)
        typer.echo(f"report: {Path(parsed.output_dir) / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
