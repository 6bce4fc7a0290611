"""`compressor analyze RECIPE|MODEL_DIR`: what each attention head does (roles, tests, distances), as JSON/MD/PNG."""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.errors import UserError, one_line_errors


def _inputs(target: Path, data: str | None):
    """(model spec, data spec, default output dir) for a recipe file or a model directory."""
    from compressor.recipe import DataSpec, ModelSpec, load_recipe

    if target.is_file():
        recipe = load_recipe(target)
        run_dir = Path(recipe.output_dir)
        final = run_dir / "model"
        spec = DataSpec(source=data) if data else recipe.data
        if (final / "config.json").is_file():  # a finished run: analyse the pruned model it shipped
            return ModelSpec(source=str(final), task_tuned=True), spec, run_dir / "analysis_pruned"
        return recipe.model, spec, run_dir / "analysis_original"
    if target.is_dir():
        if not (target / "config.json").is_file():
            raise UserError(f"target: directory '{target}' has no config.json; expected a model directory or a recipe")
        spec = DataSpec(source=data) if data else DataSpec()
        return ModelSpec(source=str(target), task_tuned=True), spec, Path(f"{target.name}_analysis")
    raise UserError(f"target: '{target}' does not exist; expected a recipe YAML file or a model directory")


def _texts(ds, fields: list[str], n: int | None = None) -> list[str]:
    rows = ds if n is None else ds.select(range(min(n, len(ds))))
    return [" ".join(str(row[f]) for f in fields) for row in rows]


def _criterion_scores(names: list[str], model, tokenizer, task, max_length: int, n: int) -> dict:
    """Each named criterion's [L, H] scores on a test sample (skipped when the model's labels do not fit the data)."""
    if not names:
        return {}
    if model.config.num_labels != task.num_labels:
        typer.echo(f"note: model has {model.config.num_labels} labels, data {task.num_labels}; criterion maps skipped")
        return {}
    from compressor import criteria
    from compressor.layout import presence_mask
    from compressor.train import sample_batches, tokenize

    split = tokenize(task.test, tokenizer, task.text_fields, max_length)
    batches = sample_batches(split, tokenizer, n, 16, seed=0)
    ctx = criteria.ScoreContext(model=model, alive=presence_mask(model), batches=batches)
    out = {}
    for name in names:
        try:
            out[name] = criteria.score_heads(name, ctx)
        except ValueError as err:
            raise UserError(f"--criteria: {err}") from None
    return out


@one_line_errors
def analyze(
    target: Path = typer.Argument(..., help="a recipe YAML (its finished run's model if present) or a model directory"),
    examples: int = typer.Option(256, "--examples", min=1, help="evaluation sentences to analyse (test split)"),
    out: Path = typer.Option(
        None, "--out", help="output directory (default: <run>/analysis_pruned|_original or ./<model>_analysis)"
    ),
    data: str = typer.Option(
        None, "--data", help="dataset source (default: the recipe's, else builtin Rotten Tomatoes)"
    ),
    syntax: bool = typer.Option(True, "--syntax/--no-syntax", help="spaCy parses for syntactic roles"),
    max_length: int = typer.Option(128, "--max-length", min=8, help="truncate inputs to this many pieces"),
    criteria_names: str = typer.Option("taylor", "--criteria", help="comma-separated criteria to map ('' for none)"),
) -> None:
    """Head roles (positional, rare-word, delimiter, syntactic), Pande sieve tests, confidence, JS clustering."""
    import torch

    from compressor.analysis import analyze_heads, write_analysis
    from compressor.sources import load_model, load_task_data, load_tokenizer

    model_spec, data_spec, default_out = _inputs(target, data)
    task = load_task_data(data_spec)
    tokenizer = load_tokenizer(model_spec)
    model = load_model(model_spec, task.label_names, attention="eager").eval()
    names = [n.strip() for n in criteria_names.split(",") if n.strip()]
    scores = _criterion_scores(names, model, tokenizer, task, max_length, min(examples, 128))
    with torch.no_grad():
        result = analyze_heads(
            model,
            tokenizer,
            _texts(task.test, task.text_fields, examples),
            _texts(task.train, task.text_fields),
            max_length=max_length,
            scores=scores,
            syntax=syntax,
        )
    paths = write_analysis(result, out or default_out)
    counts = ", ".join(f"{k} {v}" for k, v in result["counts"].items())
    typer.echo(f"heads: {counts}")
    typer.echo(f"report: {paths[1]}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
