"""`compressor bench`: quality and throughput of an original model, its pruned version and their ONNX variants."""

from __future__ import annotations

from pathlib import Path

import typer

from compressor.core.errors import UserError, one_line_errors


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

    from compressor.recipe import DataSpec
    from compressor.sources import load_task_data
    from compressor.sources.batches import eval_batches

    spec = recipe.data if recipe is not None else DataSpec()
    data = load_task_data(spec)
    if data.num_labels != num_labels:
        raise UserError(
            f"--recipe: the data has {data.num_labels} labels but the model has {num_labels}; "
            "expected a recipe whose data matches the model"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return eval_batches(data, tokenizer, "test", spec.max_length, examples, seed=0, by_length=True)


def is_onnx_dir(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*.onnx"))


def load_model_candidate(role: str, path: Path, option: str, spec):
    """A saved model directory (PyTorch, named `pytorch-ROLE`) or an ONNX export directory (`onnx-ROLE`) as a
    bench candidate."""
    from transformers import AutoConfig

    from compressor import bench as lib
    from compressor.surgery.checkpoint import load_pruned

    if is_onnx_dir(path):
        if not (path / "config.json").is_file():
            raise UserError(f"{option}: ONNX directory '{path}' has no config.json (expected a compressor export)")
        candidate = lib.onnx_candidate(f"onnx-{role}", path, spec.threads)
        candidate.vocab_size = AutoConfig.from_pretrained(path).vocab_size
        return candidate
    model = load_pruned(_model_dir(path, option), attn_implementation="sdpa")
    return lib.pytorch_candidate(f"pytorch-{role}", model, spec.seq_lens, path)


def num_labels(path: Path) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(path).num_labels)


def check_baseline_options(save_baseline: Path | None, baseline: Path | None):
    """The validated baseline to check against (None when not checking); refuses both options at once."""
    from compressor.guard import baseline as regression

    if save_baseline is not None and baseline is not None:
        raise UserError("--save-baseline/--baseline: expected one of them, not both")
    if save_baseline is not None and save_baseline.is_dir():
        raise UserError(f"--save-baseline: '{save_baseline}' is a directory; expected a file path")
    return regression.load_baseline(baseline) if baseline is not None else None


def run_bench(
    reference: Path,
    candidate: Path,
    out: Path,
    spec,
    *,
    onnx_dir: Path | None = None,
    batches_for=None,
    save_baseline: Path | None = None,
    baseline: Path | None = None,
    roles: tuple[str, str] = ("reference", "candidate"),
    options: tuple[str, str] = ("--reference", "--candidate"),
    tolerances: dict | None = None,
) -> int:
    """Benchmark `candidate` (and ONNX variants) against `reference`; optionally save a baseline or check one.

    `batches_for(candidate_dir, num_labels)` gives the evaluation batches (None: time only); `tolerances`
    ({kind: {"relative"|"absolute": x}}) override the defaults written into a new baseline. Everything that can be
    refused (options, baseline file, identity) is refused before anything is timed; a baseline whose rounds are
    too dispersed to resolve its tolerances is refused after timing, before it is written. Returns the exit code:
    0 pass, 1 a regression or an inconclusive metric (rounds too noisy to decide); invalid input raises UserError
    (exit 2). The keyword arguments are `compressor bench`'s options after it resolved them.
    """
    from compressor import bench as lib
    from compressor.guard import baseline as regression
    from compressor.guard import report as regression_report

    expected = check_baseline_options(save_baseline, baseline)
    for path, option in zip((reference, candidate), options, strict=True):
        if not is_onnx_dir(path):
            _model_dir(path, option)
    variants = onnx_variants(onnx_dir) if onnx_dir is not None else {}
    lib.check_out_dir(out)  # an earlier regression check's files are the bench's own: the new report replaces them
    threads = lib.set_threads(spec.threads)
    dirs = (reference, candidate)
    candidates = [load_model_candidate(r, p, o, spec) for r, p, o in zip(roles, dirs, options, strict=True)]
    for name, path in variants.items():
        flops, heads = candidates[1].flops_by_seq_len or None, candidates[1].heads_per_layer
        candidates.append(lib.onnx_candidate(f"onnx-{name}", path, spec.threads, flops, heads))
    batches = batches_for(candidate, num_labels(candidate)) if batches_for is not None else None
    names = [c.name for c in candidates]
    identity = regression.run_identity(
        regression.fingerprint(reference), spec, threads, names, regression.batches_fingerprint(batches)
    )
    if expected is not None:
        regression.check_identity(expected, identity)
    result = lib.bench(candidates, batches, spec, out, reference=candidates[0].name)
    print_summary(result, out)
    if save_baseline is not None:
        prints = {c: regression.fingerprint(p) for c, p in zip(names, (*dirs, *variants.values()), strict=True)}
        regression.save_baseline(regression.new_baseline(result, identity, prints, tolerances), save_baseline)
        typer.echo(f"baseline written: {save_baseline}")
    if expected is None:
        return 0
    return 0 if regression_report.check_result(expected, result, baseline, out) else 1


def print_summary(result: dict, out: Path) -> None:
    for name, s in result["summary"].items():
        acc = "" if s.get("accuracy") is None else f"accuracy {100 * s['accuracy']:.2f}%, "
        ideal = "" if s["flop_ideal_speedup"] is None else f" (FLOP-ideal {s['flop_ideal_speedup']:.2f}×)"
        where = f"batch {s['headline_batch']}, {s['headline_seq_len']} tokens"
        typer.echo(f"{name}: {acc}speed-up {s['headline_speedup']:.2f}× at {where}{ideal}")
    typer.echo(f"report: {out / 'report.md'}")


def _one_of(new: Path | None, old: Path | None, options: str) -> Path:
    if (new is None) == (old is None):
        raise UserError(f"{options}: expected exactly one of them (a saved model or ONNX export directory)")
    return new if new is not None else old


@one_line_errors
def bench(
    out: Path = typer.Option(..., "--out", help="where report.json, report.md and the plots go"),
    reference: Path = typer.Option(None, "--reference", help="reference: saved model dir or ONNX export dir"),
    candidate: Path = typer.Option(None, "--candidate", help="candidate: saved model dir or ONNX export dir"),
    original: Path = typer.Option(None, "--original", help="directory of the original (unpruned) model"),
    pruned: Path = typer.Option(None, "--pruned", help="directory of the pruned model (compressor output)"),
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
    save_baseline: Path = typer.Option(None, "--save-baseline", help="write this run's metrics as a baseline file"),
    baseline: Path = typer.Option(
        None, "--baseline", help="check against a baseline file: exit 0 pass, 1 regression/inconclusive, 2 mismatch"
    ),
) -> None:
    """Compare a candidate with a reference (PyTorch or ONNX): accuracy with confidence intervals and throughput;
    optionally save a baseline or check against one (docs/ci.md). Each parameter is one command-line option."""
    from compressor.recipe import load_recipe

    legacy = original is not None or pruned is not None
    ref = _one_of(reference, original, "--reference/--original")
    cand = _one_of(candidate, pruned, "--candidate/--pruned")
    r = load_recipe(recipe) if recipe is not None else None
    sizes = parse_batch_sizes(batch_sizes) if batch_sizes is not None else None
    lengths = parse_int_list(seq_lens, "--seq-lens", "64,128") if seq_lens is not None else None
    spec = bench_spec(
        r, batch_sizes=sizes, seq_lens=lengths, threads=threads, rounds=rounds, eval_examples=eval_examples
    )

    def batches_for(model_dir: Path, labels: int) -> list[dict]:
        return bench_batches(r, model_dir, labels, spec.eval_examples)

    code = run_bench(
        ref,
        cand,
        out,
        spec,
        onnx_dir=onnx_dir,
        batches_for=None if no_quality else batches_for,
        save_baseline=save_baseline,
        baseline=baseline,
        roles=("original", "pruned") if legacy else ("reference", "candidate"),
        options=("--original", "--pruned") if legacy else ("--reference", "--candidate"),
    )
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
