"""`compressor export MODEL_DIR OUT_DIR`: ONNX variants of a saved model, each checked against PyTorch."""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.core.errors import UserError, one_line_errors
from compressor.core.runtimes import CALIBRATED_VARIANTS
from compressor.core.runtimes import VARIANTS as DECLARED_VARIANTS


def parse_variants(text: str) -> list[str]:
    """'fp32,int8' → ['fp32', 'int8'] in canonical order; unknown names are a one-line error naming the option."""
    from compressor.deploy.export import VARIANTS, check_variants

    names = [part.strip() for part in text.split(",") if part.strip()]
    try:
        return check_variants(names)
    except UserError:
        raise UserError(
            f"--variants: expected comma-separated names from {', '.join(VARIANTS)}, got '{text}'"
        ) from None


def _task(recipe_path: Path | None, model_dir: Path):
    """(recipe or None, its task data or the default data, the model's own tokenizer)."""
    from transformers import AutoTokenizer

    from compressor.recipe import DataSpec, load_recipe
    from compressor.sources import load_task_data

    recipe = load_recipe(recipe_path) if recipe_path is not None else None
    data = load_task_data(recipe.data if recipe else DataSpec())
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as err:
        raise UserError(f"MODEL_DIR: '{model_dir}' has no usable tokenizer ({err}); expected a saved model") from None
    return recipe, data, tokenizer


def check_batches(data, tokenizer, max_length: int, examples: int) -> list[dict]:
    """A seeded sample of the validation split, tokenised by the model's own tokenizer, in batches of 32: the real
    inputs the parity gate runs on."""
    from compressor.sources.batches import eval_batches

    return eval_batches(data, tokenizer, "validation", max_length, examples, seed=1)


def recipe_int8(recipe, data, tokenizer, names: list[str]):
    """The recipe's `export.int8` settings on its data (calibration from the training split, the gate and its fp32
    fallback on the validation split), so a standalone export's int8 is checked exactly like a run's."""
    from compressor.deploy.quantize import int8_options
    from compressor.sources.batches import tokenize

    def split(name: str):
        return tokenize(getattr(data, name), tokenizer, data.text_fields, recipe.data.max_length)

    return int8_options(recipe.export.int8, names, split("train"), split("validation"), tokenizer, seed=recipe.seed)


@one_line_errors
def export(
    model_dir: Path = typer.Argument(..., help="saved model directory (compressor output or a plain HF model dir)"),
    out_dir: Path = typer.Argument(..., help="where fp32/, optimized/, int8/ and export.json go"),
    variants: str = typer.Option(
        "fp32,optimized,int8",
        "--variants",
        help=f"comma-separated, some of: {','.join(DECLARED_VARIANTS)} ({','.join(CALIBRATED_VARIANTS)} need "
        "--recipe for calibration; openvino-* need compressor[openvino])",
    ),
    atol: float = typer.Option(1e-4, "--atol", help="max |logit difference| allowed between ONNX fp32 and PyTorch"),
    opset: int = typer.Option(None, "--opset", help="ONNX opset (default: the exporter's, 18 or TorchScript's 17)"),
    exporter: str = typer.Option(
        None,
        "--exporter",
        help="auto (torch.export, falling back to TorchScript), torch.export or torchscript; default: the recipe's"
        " export.exporter, else auto",
    ),
    recipe: Path = typer.Option(
        None,
        "--recipe",
        help="recipe whose data provides the parity-check batches, and whose export.int8 settings (gate, fp32 "
        "fallback, calibration) the int8 variants follow; without one int8 is ungated",
    ),
    check_examples: int = typer.Option(128, "--check-examples", help="validation examples for the parity gate"),
) -> None:
    """Export to ONNX (fp32, ORT-optimised, dynamic int8); stop with one line if fp32 misses PyTorch by > atol."""
    from compressor.deploy.export import export_onnx
    from compressor.deploy.exporters import choices as exporter_choices
    from compressor.deploy.quantize import smoothing_note
    from compressor.recipe import DataSpec

    names = parse_variants(variants)
    if not atol > 0:
        raise UserError(f"--atol: expected a positive tolerance, got {atol}")
    if check_examples < 1:
        raise UserError(f"--check-examples: expected a positive number, got {check_examples}")
    if opset is not None and opset < 11:
        raise UserError(f"--opset: expected 11 or higher, got {opset}")
    if exporter is not None and exporter not in exporter_choices():
        raise UserError(f"--exporter: unknown exporter {exporter!r}; expected one of {', '.join(exporter_choices())}")
    if not model_dir.is_dir():
        raise UserError(f"MODEL_DIR: directory '{model_dir}' not found (expected a saved model directory)")
    if not (model_dir / "config.json").is_file():
        raise UserError(f"MODEL_DIR: '{model_dir}' has no config.json (expected a saved model directory)")
    spec, data, tokenizer = _task(recipe, model_dir)
    max_length = (spec.data if spec else DataSpec()).max_length
    batches = check_batches(data, tokenizer, max_length, check_examples)
    int8 = recipe_int8(spec, data, tokenizer, names) if spec else None
    how = exporter or (spec.export.exporter if spec else "auto")
    result = export_onnx(model_dir, out_dir, names, batches, atol=atol, opset=opset, int8=int8, exporter=how)
    for name, info in result.items():
        nodes = info.get("fused_attention_nodes")  # ONNX graphs only: an IR or a PyTorch variant has none
        fusion = f", fused attention nodes {nodes}" if name != "fp32" and nodes is not None else ""
        fusion += f", written by {info['exporter']}" if "exporter" in info else ""
        status = f", {info['status']}" if "status" in info else ""
        kept = info.get("excluded_nodes")
        status += f" ({len(kept)} node(s) kept in fp32)" if kept else ""
        typer.echo(
            f"{name}{smoothing_note(info.get('smoothing'))}: {info['size_bytes'] / 1e6:.1f} MB, "
            f"max |Δlogit| {info['max_abs_diff']:.2e}, "
            f"agreement {info['agreement']:.4f} on {info['check_examples']} examples{fusion}{status} → {info['dir']}"
        )


def register(app: typer.Typer) -> None:
    app.command("export")(export)
