"""`compressor` command line: a thin shell over subcommand modules in `compressor.commands`.

Every expected failure (bad recipe, missing file, unsupported model) is printed as one line on stderr with exit
code 2; tracebacks are reserved for bugs.
"""

from __future__ import annotations

import sys

import typer

from compressor.commands import analyze, bench, export, pick, run, validate

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
for module in (run, validate, export, bench, pick, analyze):
    module.register(app)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        print("compressor: interrupted", file=sys.stderr)
        sys.exit(130)
