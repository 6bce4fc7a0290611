"""`compressor pick RUN_DIR --max-drop 1.0 [--runtime onnx-int8] [--batch-size 32] [--out DIR]`: the fastest model of
a finished run within an accuracy drop, read from the frontier in its `report.json` (`compressor.bench.frontier`,
the same call the report's recommendation makes), optionally copied to a directory of the user's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import typer

from compressor.core.errors import UserError, one_line_errors
from compressor.core.runtimes import NAMES

NOTHING_QUALIFIES = 1  # exit code when the run has no member within the drop (a result, not a usage error)


def read_frontier(run_dir: Path) -> list[dict]:
    """The frontier rows of the finished run in `run_dir` (a family run's, else a one-target run's), read through
    the typed report (`report.schema.RunReport`)."""
    from compressor.report.schema import RunReport

    path = run_dir / "report.json"
    if not path.is_file():
        raise UserError(f"RUN_DIR: '{run_dir}' holds no report.json; expected the output_dir of a finished run")
    rows = RunReport.read(path).frontier_rows()
    if not rows:
        raise UserError(f"RUN_DIR: the run in '{run_dir}' has no frontier (was bench disabled?); expected a benchmark")
    return [row.dump() for row in rows]


def parse_drop(text: str) -> float | None:
    """'1.0' → 1.0 points; 'none' → no limit."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"--max-drop: expected accuracy points (e.g. 1.0) or 'none', got '{text}'") from None
    if not value >= 0:
        raise UserError(f"--max-drop: expected a non-negative number of points, got {text}")
    return value


def check_choice(rows: list[dict], runtime: str | None, batch: int | None) -> None:
    """A runtime and batch size the run measured, or one line naming the option and what the run has."""
    from compressor.bench.frontier import CHOICES

    members = [r for r in rows if r["role"] in CHOICES]
    runtimes = sorted({r["runtime"] for r in members})
    if runtime is not None and runtime not in runtimes:
        raise UserError(f"--runtime: the run has no member on '{runtime}'; expected one of {', '.join(runtimes)}")
    batches = sorted({int(b) for r in members for b in r["speedup_by_batch"]})
    if batch is not None and batch not in batches:
        raise UserError(f"--batch-size: the run measured batch sizes {batches}; expected one of them, got {batch}")


def check_validation(rows: list[dict], drop: float | None) -> None:
    """A drop limit needs the rows' validation accuracy (choices are made on validation, never on test): a run
    benchmarked before the bench scored validation is refused in one line."""
    if drop is not None and all(r.get("val_drop_points") is None for r in rows):
        raise UserError(
            "RUN_DIR: its report.json has no validation accuracy (benchmarked before choices were made on "
            "validation); expected a run benchmarked by this version: rerun it, or pass --max-drop none"
        )


def copy_choice(source: Path, out: Path) -> Path:
    """Copy the picked model or ONNX variant directory to `out` (which must not exist or be empty), whole or not at
    all: into a sibling temporary directory first, renamed when complete."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out: '{out}' exists and is not an empty directory; expected a new directory")
    if not source.is_dir():
        raise UserError(f"RUN_DIR: the picked model's directory '{source}' is missing; was the run moved in part?")
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out


@one_line_errors
def pick(
    run_dir: Path = typer.Argument(..., help="a finished run's output_dir"),
    max_drop: str = typer.Option("1.0", help="validation accuracy points below the original allowed, or 'none'"),
    runtime: str | None = typer.Option(None, help=f"only this runtime: one of {', '.join(NAMES)}"),
    batch_size: int | None = typer.Option(None, help="compare speed at this batch size (default: the run's)"),
    out: Path | None = typer.Option(None, help="copy the picked model (or ONNX variant) directory here"),
    as_json: bool = typer.Option(False, "--json", help="print the picked frontier row as JSON"),
) -> None:
    """Print the fastest model and runtime of a run within --max-drop validation points of the original (chosen on
    validation; its test accuracy is reported); exit 1 if none. The
    fastest may be a reference (`bench.references`: another model fine-tuned on the task) or the original exported
    to a runtime (quantize-only, no pruning), which the line says."""
    from compressor.bench.frontier import not_a_member
    from compressor.bench.frontier import pick as choose

    rows = read_frontier(run_dir)
    drop = parse_drop(max_drop)
    check_validation(rows, drop)
    check_choice(rows, runtime, batch_size)
    chosen = choose(rows, drop, batch_size, runtime)
    if chosen is None:
        typer.echo(nothing_qualifies(rows, drop, batch_size, runtime), err=True)
        raise typer.Exit(NOTHING_QUALIFIES)
    source = Path(chosen["path"])
    source = source if source.is_absolute() else run_dir / source
    if out is not None:
        copy_choice(source, out)
    if as_json:
        typer.echo(json.dumps(chosen, indent=2))
        return
    copied = f"; copied to {out}" if out is not None else ""
    p_value = "–" if chosen["mcnemar_p"] is None else f"{chosen['mcnemar_p']:.3g}"
    what = f" ({words})" if (words := not_a_member(chosen)) else ""
    typer.echo(
        f"{chosen['name']}{what}: {chosen['speedup']:.2f}x the PyTorch original at batch {chosen['batch']}, "
        f"{chosen['seq_len']} tokens; {_chosen(drop, chosen.get('val_drop_points'))}; test "
        f"accuracy {100 * chosen['accuracy']:.2f}% ({-chosen['drop_points']:+.2f} points; McNemar p {p_value})"
        f"{int8_cpu(chosen)}; {source}{copied}"
    )


def nothing_qualifies(rows: list[dict], drop: float | None, batch: int | None, runtime: str | None) -> str:
    """The line when `pick` returns nothing: the limit no choice met, and each optimised graph on the asked runtime
    that was passed over for running slower than the graph it was built from (`frontier.slower_than_source`)."""
    from compressor.bench.frontier import slower_than_source

    where = f" on {runtime}" if runtime else ""
    limit = "qualifies at any accuracy" if drop is None else f"is within {drop:g} validation points of the original"
    by_name = {r["name"]: r for r in rows}
    slower = [why for name, why in slower_than_source(rows, batch).items()
              if runtime is None or by_name[name]["runtime"] == runtime]  # fmt: skip
    never = f" ({'; '.join(slower)}: never picked)" if slower else ""
    return f"no member, reference or exported original{where} {limit}{never}"


def _chosen(limit: float | None, drop: float | None) -> str:
    """How the choice was made, in words: on validation with its validation drop in signed points ("chosen on
    validation (-0.40 points)"), or, without a limit (`--max-drop none`), as the fastest at any accuracy."""
    if limit is None:
        return "the fastest at any accuracy (--max-drop none)"
    return f"chosen on validation ({'not measured' if drop is None else f'{-drop:+.2f} points'})"


def int8_cpu(row: dict) -> str:
    """'; int8 measured on a CPU with <features>' for an int8 row (its speed-up holds on such CPUs only), else ''."""
    features = row.get("cpu_int8_features")
    return f"; int8 measured on a CPU with {features}" if features else ""


def register(app: typer.Typer) -> None:
    app.command("pick")(pick)
