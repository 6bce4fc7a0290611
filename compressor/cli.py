"""`compressor` command line: a thin shell over subcommand modules in `compressor.commands`.

Every expected failure (bad recipe, missing file, unsupported model, an unsupported transformers or torch) is printed
as one line on stderr with exit code 2; tracebacks are reserved for bugs.
"""

from __future__ import annotations

import sys

import typer

from compressor.commands import analyze, bench, export, init, pick, run, validate
from compressor.core import compat
from compressor.core.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
for module in (run, validate, init, export, bench, pick, analyze):
    module.register(app)


def _print_version(value: bool) -> None:
    if value:
        from compressor import __version__

        typer.echo(compat.versions_report(__version__))
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="print the versions of compressor and the libraries it runs on (installed and supported), then exit",
    ),
) -> None:
    """Make transformer classifiers smaller and faster by removing attention heads, and ship the result."""


def main() -> None:
    """The console script: the library versions are checked first (`--version` still reports them)."""
    if "--version" not in sys.argv[1:]:
        try:
            compat.require_supported()
        except UserError as err:
            print(f"compressor: error: {err}", file=sys.stderr)
            sys.exit(2)
    try:
        app()
    except KeyboardInterrupt:
        print("compressor: interrupted", file=sys.stderr)
        sys.exit(130)
