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
    report = run_recipe(load_recipe(recipe, overrides), force=force)
    if report:
        typer.echo(f"report: {Path(report['pruned']['model_dir']).parent / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
