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
    seeds: str = typer.Option(
        None,
        "--seeds",
        help="repeat the run over these seeds, e.g. 0,1,2 (overrides the recipe's `seeds`): the base fine-tune is "
        "shared, the rest redrawn; each under OUTPUT_DIR/seed-K/, then seeds.json and seeds.md",
    ),
    settings: list[str] = typer.Option(
        None,
        "--set",
        help="set one recipe field, KEY=VALUE with a dotted key and a YAML value, e.g. prune.steps=4 or "
        "prune.units=[heads,neurons]; repeatable",
    ),
) -> None:
    """Run a recipe end to end (resumes an interrupted run in the same output directory)."""
    from compressor.pipeline.runner import run_recipe
    from compressor.pipeline.seeds import SEEDS_MD, parse_seeds, run_seeds
    from compressor.recipe import load_recipe, settings_of

    repeats = None if seeds is None else parse_seeds(seeds)  # a bad value fails before the recipe is read
    overrides = settings_of(settings) | ({"output_dir": output_dir} if output_dir else {})
    parsed = load_recipe(recipe, overrides)
    repeats = repeats or parsed.seeds
    if repeats:
        if run_seeds(parsed, repeats, force=force):  # empty on the processes that only helped
            typer.echo(f"seeds: {Path(parsed.output_dir) / SEEDS_MD}")
    elif run_recipe(parsed, force=force):  # empty on the processes that only helped (accelerate launch)
        typer.echo(f"report: {Path(parsed.output_dir) / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
