"""`compressor bench`: quality and throughput of an original model, its pruned version and their ONNX variants."""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.errors import UserError, one_line_errors


def parse_int_list(text: str, option: str, example: str) -> list[int]:
    """'1,8,32' → [1, 8, 32]; anything else is a one-line error naming the option."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(b < 1 for b in values):
        raise UserError(f"{option}: expected comma-separated positive integers like {example}, got '{text}'")
    return values


def parse_batch_sizes(text: str) -> list[int]:
    return parse_int_list(text, "--batch-sizes", "1,8,32")


def bench_spec(recipe, **overrides):
    """The recipe's `bench` section (or the defaults) with command-line values laid over it."""
    from pydantic import ValidationError

    from compressor.recipe import BenchSpec, RecipeError, format_validation_error

    base = recipe.bench.model_dump() if recipe is not None else {}
    base.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return BenchSpec.model_validate(base)
    except ValidationError as err:
        raise RecipeError(format_validation_error(err, prefix="bench.")) from None


def _model_dir(path: Path, option: str) -> Path:
    if not path.is_dir():
        raise UserError(f"{option}: directory '{path}' not found (expected a saved model directory)")
    if not (path / "config.json").is_file():
        raise UserError(f"{option}: '{path}' has no config.json (expected a saved model directory)")
    return path


def onnx_variants(onnx_dir: Path) -> dict[str, Path]:
    """`{name: dir}` for an export directory: the directory itself when it holds a model, else its sub-directories."""
    if not onnx_dir.is_dir():
        raise UserError(f"--onnx-dir: directory '{onnx_dir}' not found")
    if any(onnx_dir.glob("*.onnx")):
        return {onnx_dir.name: onnx_dir}
    found = {p.name: p for p in sorted(onnx_dir.iterdir()) if p.is_dir() and any(p.glob("*.onnx"))}
    if not found:
        raise UserError(f"--onnx-dir: no .onnx files in '{onnx_dir}' or its sub-directories")
    return found


def bench_batches(recipe, model_dir: Path, num_labels: int, examples: int | None) -> list[dict]:
    """The test split of the recipe's data (default data without a recipe), tokenised by the model's tokenizer."""
    from transformers import AutoTokenizer

    from compressor.batches import eval_batches
    from compressor.recipe import DataSpec
    from compressor.sources import load_task_data

    spec = recipe.data if recipe is not None else DataSpec()
    data = load_task_data(spec)
    if data.num_labels != num_labels:
        raise UserError(
            f"--recipe: the data has {data.num_labels} labels but the model has {num_labels}; "
            "expected a recipe whose data matches the model"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return eval_batches(data, tokenizer, "test", spec.max_length, examples, seed=0)


@one_line_errors
def bench(
    original: Path = typer.Option(..., "--original", help="directory of the original (unpruned) model"),
    pruned: Path = typer.Option(..., "--pruned", help="directory of the pruned model (compressor output)"),
    out: Path = typer.Option(..., "--out", help="where report.json, report.md and the plots go"),
    onnx_dir: Path = typer.Option(None, "--onnx-dir", help="ONNX export directory (one variant or one per sub-dir)"),
    recipe: Path = typer.Option(None, "--recipe", help="recipe whose data and bench settings to use"),
    batch_sizes: str = typer.Option(None, "--batch-sizes", help="comma-separated, e.g. 1,8,32,64"),
    seq_lens: str = typer.Option(
        None, "--seq-lens", "--seq-len", help="comma-separated tokens per synthetic timing example, e.g. 64,128"
    ),
    threads: int = typer.Option(None, "--threads", help="intra-op threads for PyTorch and ONNX Runtime"),
    rounds: int = typer.Option(None, "--rounds", help="interleaved timing rounds"),
    eval_examples: int = typer.Option(None, "--eval-examples", help="test examples for quality (default: all)"),
    no_quality: bool = typer.Option(False, "--no-quality", help="time only; skip the accuracy comparison"),
) -> None:
    """Compare original and pruned models (PyTorch and ONNX): accuracy with confidence intervals and throughput."""
    from compressor import bench as lib
    from compressor.checkpoint import load_pruned
    from compressor.recipe import load_recipe

    r = load_recipe(recipe) if recipe is not None else None
    sizes = parse_batch_sizes(batch_sizes) if batch_sizes is not None else None
    lengths = parse_int_list(seq_lens, "--seq-lens", "64,128") if seq_lens is not None else None
    spec = bench_spec(
        r, batch_sizes=sizes, seq_lens=lengths, threads=threads, rounds=rounds, eval_examples=eval_examples
    )
    _model_dir(original, "--original")
    _model_dir(pruned, "--pruned")
    lib.check_out_dir(out)
    variants = onnx_variants(onnx_dir) if onnx_dir is not None else {}
    lib.set_threads(spec.threads)
    orig_model = load_pruned(original, attn_implementation="sdpa")
    pruned_model = load_pruned(pruned, attn_implementation="sdpa")
    candidates = [
        lib.pytorch_candidate("pytorch-original", orig_model, spec.seq_lens, original),
        lib.pytorch_candidate("pytorch-pruned", pruned_model, spec.seq_lens, pruned),
    ]
    for name, path in variants.items():
        candidates.append(
            lib.onnx_candidate(
                f"onnx-{name}", path, spec.threads, candidates[1].flops_by_seq_len, candidates[1].heads_per_layer
            )
        )
    batches = None
    if not no_quality:
        batches = bench_batches(r, pruned, pruned_model.config.num_labels, spec.eval_examples)
    result = lib.bench(candidates, batches, spec, out, reference="pytorch-original")
    for name, s in result["summary"].items():
        acc = "" if s.get("accuracy") is None else f"accuracy {100 * s['accuracy']:.2f}%, "
        ideal = "" if s["flop_ideal_speedup"] is None else f" (FLOP-ideal {s['flop_ideal_speedup']:.2f}×)"
        where = f"batch {s['headline_batch']}, {s['headline_seq_len']} tokens"
        typer.echo(f"{name}: {acc}speed-up {s['headline_speedup']:.2f}× at {where}{ideal}")
    typer.echo(f"report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
