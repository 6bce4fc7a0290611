"""`compressor analyze RECIPE|MODEL_DIR`: what each attention head does (roles, tests, distances), as JSON/MD/PNG.

Sentence-pair data (two `text_fields`) is analysed as pairs, as the model was trained. Role thresholds come from the
recipe's `analysis.roles` (defaults for a model directory), with the keys of `--roles-yaml FILE` on top. Syntax:
without a flag spaCy is used when its English model is installed, else one warning and the analysis goes on without
syntactic roles (as in `compressor run`); `--syntax` insists (one-line error, before any model loads, when spaCy is
missing); `--no-syntax` turns it off.
"""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.core.errors import UserError, one_line_errors


def _inputs(target: Path, data: str | None):
    """(model spec, data spec, default output dir, analysis.roles) for a recipe file or a model directory."""
    from compressor.recipe import AnalysisSpec, DataSpec, ModelSpec, load_recipe

    if target.is_file():
        recipe = load_recipe(target)
        run_dir = Path(recipe.output_dir)
        final = run_dir / "model"
        spec = DataSpec(source=data) if data else recipe.data
        roles = recipe.analysis.roles
        if (final / "config.json").is_file():  # a finished run: analyse the pruned model it shipped
            return ModelSpec(source=str(final), task_tuned=True), spec, run_dir / "analysis_pruned", roles
        return recipe.model, spec, run_dir / "analysis_original", roles
    if target.is_dir():
        if not (target / "config.json").is_file():
            raise UserError(f"target: directory '{target}' has no config.json; expected a model directory or a recipe")
        spec = DataSpec(source=data) if data else DataSpec()
        model = ModelSpec(source=str(target), task_tuned=True)
        return model, spec, Path(f"{target.name}_analysis"), AnalysisSpec.Roles()
    raise UserError(f"target: '{target}' does not exist; expected a recipe YAML file or a model directory")


def _roles(base, path: Path | None):
    """`base` (an `AnalysisSpec.Roles`) with the keys of the YAML mapping in `path` on top, validated like a recipe."""
    if path is None:
        return base
    from compressor.recipe import RecipeError, parse_recipe
    from compressor.recipe.yamlio import read_yaml

    if not path.is_file():
        raise UserError(f"--roles-yaml: file '{path}' not found")
    try:  # read like a recipe: bounded, a key given twice refused, `1e-3` a number
        data = read_yaml(path)
    except RecipeError as err:
        raise UserError(f"--roles-yaml: {err}") from None
    if data is None:
        return base
    if not isinstance(data, dict):
        raise UserError(f"--roles-yaml: expected a mapping of analysis.roles keys, got {type(data).__name__}")
    # checked exactly as a recipe's analysis.roles (one-line RecipeError naming the field)
    return parse_recipe(
        {"analysis": {"roles": {**base.model_dump(), **data}}}, origin=f"--roles-yaml {path}"
    ).analysis.roles


def _criterion_scores(names: list[str], model, tokenizer, task, max_length: int, n: int) -> dict:
    """Each named criterion's [L, H] scores on a test sample (skipped when the model's labels do not fit the data)."""
    if not names:
        return {}
    if model.config.num_labels != task.num_labels:
        typer.echo(f"note: model has {model.config.num_labels} labels, data {task.num_labels}; criterion maps skipped")
        return {}
    from compressor.pruning import criteria
    from compressor.sources.batches import eval_batches
    from compressor.surgery.arch import presence_mask

    batches = eval_batches(task, tokenizer, "test", max_length, n, batch_size=16, seed=0)
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
    syntax: bool | None = typer.Option(
        None, "--syntax/--no-syntax", help="spaCy parses for syntactic roles (default: if installed, else a warning)"
    ),
    roles_yaml: Path = typer.Option(
        None, "--roles-yaml", help="YAML mapping of analysis.roles thresholds, over the recipe's (see docs/analysis.md)"
    ),
    max_length: int = typer.Option(128, "--max-length", min=8, help="truncate inputs to this many pieces"),
    criteria_names: str = typer.Option("taylor", "--criteria", help="comma-separated criteria to map ('' for none)"),
) -> None:
    """Head roles (positional, rare-word, delimiter, syntactic), Pande sieve tests, confidence, JS clustering."""
    import torch

    from compressor.analysis import analyze_heads, model_texts, write_analysis
    from compressor.analysis.syntax import load_parser
    from compressor.sources import load_model, load_task_data, load_tokenizer

    model_spec, data_spec, default_out, roles = _inputs(target, data)
    config = _roles(roles, roles_yaml)
    if syntax:
        load_parser()  # asked for explicitly: fail now, before any model loads
    task = load_task_data(data_spec)
    tokenizer = load_tokenizer(model_spec)
    model = load_model(model_spec, task.label_names, attention="eager").eval()
    names = [n.strip() for n in criteria_names.split(",") if n.strip()]
    scores = _criterion_scores(names, model, tokenizer, task, max_length, min(examples, 128))
    with torch.no_grad():
        result = analyze_heads(
            model,
            tokenizer,
            model_texts(task.test, task.text_fields, examples),
            model_texts(task.train, task.text_fields),
            max_length=max_length,
            scores=scores,
            syntax="auto" if syntax is None else syntax,
            config=config,
        )
    paths = write_analysis(result, out or default_out)
    counts = ", ".join(f"{k} {v}" for k, v in result["counts"].items())
    typer.echo(f"heads: {counts}")
    typer.echo(f"report: {paths[1]}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
