"""`compressor export MODEL_DIR OUT_DIR`: ONNX variants of a saved model, each checked against PyTorch."""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.errors import UserError, one_line_errors


def parse_variants(text: str) -> list[str]:
    """'fp32,int8' → ['fp32', 'int8'] in canonical order; unknown names are a one-line error naming the option."""
    from compressor.export import VARIANTS, check_variants

    names = [part.strip() for part in text.split(",") if part.strip()]
    try:
        return check_variants(names)
    except UserError:
        raise UserError(
            f"--variants: expected comma-separated names from {', '.join(VARIANTS)}, got '{text}'"
        ) from None


def check_batches(recipe_path: Path | None, model_dir: Path, examples: int) -> list[dict]:
    """A seeded sample of the validation split of the recipe's data (default data without a recipe), tokenised by
    the model's own tokenizer, in batches of 32: the real inputs the parity gate runs on."""
    from transformers import AutoTokenizer

    from compressor.batches import eval_batches
    from compressor.recipe import DataSpec, load_recipe
    from compressor.sources import load_task_data

    spec = load_recipe(recipe_path).data if recipe_path is not None else DataSpec()
    data = load_task_data(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as err:
        raise UserError(f"MODEL_DIR: '{model_dir}' has no usable tokenizer ({err}); expected a saved model") from None
    return eval_batches(data, tokenizer, "validation", spec.max_length, examples, seed=1)


@one_line_errors
def export(
    model_dir: Path = typer.Argument(..., help="saved model directory (compressor output or a plain HF model dir)"),
    out_dir: Path = typer.Argument(..., help="where fp32/, optimized/, int8/ and export.json go"),
    variants: str = typer.Option("fp32,optimized,int8", "--variants", help="comma-separated: fp32,optimized,int8"),
    atol: float = typer.Option(1e-4, "--atol", help="max |logit difference| allowed between ONNX fp32 and PyTorch"),
    opset: int = typer.Option(None, "--opset", help="ONNX opset (default: optimum's choice)"),
    recipe: Path = typer.Option(None, "--recipe", help="recipe whose data provides the parity-check batches"),
    check_examples: int = typer.Option(128, "--check-examples", help="validation examples for the parity gate"),
) -> None:
    """Export to ONNX (fp32, ORT-optimised, dynamic int8); stop with one line if fp32 misses PyTorch by > atol."""
    from compressor.export import export_onnx

    names = parse_variants(variants)
    if not atol > 0:
        raise UserError(f"--atol: expected a positive tolerance, got {atol}")
    if check_examples < 1:
        raise UserError(f"--check-examples: expected a positive number, got {check_examples}")
    if opset is not None and opset < 11:
        raise UserError(f"--opset: expected 11 or higher, got {opset}")
    if not model_dir.is_dir():
        raise UserError(f"MODEL_DIR: directory '{model_dir}' not found (expected a saved model directory)")
    if not (model_dir / "config.json").is_file():
        raise UserError(f"MODEL_DIR: '{model_dir}' has no config.json (expected a saved model directory)")
    batches = check_batches(recipe, model_dir, check_examples)
    result = export_onnx(model_dir, out_dir, names, batches, atol=atol, opset=opset)
    for name, info in result.items():
        fusion = f", fused attention nodes {info['fused_attention_nodes']}" if name != "fp32" else ""
        typer.echo(
            f"{name}: {info['size_bytes'] / 1e6:.1f} MB, max |Δlogit| {info['max_abs_diff']:.2e}, "
            f"agreement {info['agreement']:.4f} on {info['check_examples']} examples{fusion} → {info['dir']}"
        )


def register(app: typer.Typer) -> None:
    app.command("export")(export)
