"""`compressor analyze` (placeholder: being written)."""

import typer


def register(app: typer.Typer) -> None:
    pass
