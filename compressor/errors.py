"""Turning expected failures into one clear line and exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import TypeVar

from compressor.layout import UnsupportedArchitectureError
from compressor.recipe import RecipeError

F = TypeVar("F", bound=Callable)
EXPECTED = (RecipeError, UnsupportedArchitectureError, FileNotFoundError, FileExistsError, PermissionError)


class UserError(RuntimeError):
    """A problem with the user's input or environment, reported as one line (exit 2)."""


def one_line_errors(fn: F) -> F:
    """Decorator for CLI commands: expected errors → `compressor: <message>` on stderr, exit 2."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UserError, *EXPECTED) as err:
            message = " ".join(str(err).split())
            print(f"compressor: error: {message}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper  # type: ignore[return-value]
