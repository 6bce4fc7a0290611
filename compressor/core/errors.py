"""The one base class of user-facing errors, and the CLI decorator that turns them into one line and exit 2.

`UserError` is a problem with the user's input or environment (a recipe field, a path, a missing optional
package): its message is one line naming the field and what was expected. `recipe.RecipeError` and
`surgery.arch.UnsupportedArchitectureError` derive from it. Anything else, a `FileNotFoundError` from a bug included,
stays a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import TypeVar

F = TypeVar("F", bound=Callable)


class UserError(RuntimeError):
    """A problem with the user's input or environment, reported as one line (exit 2)."""


def one_line_errors(fn: F) -> F:
    """Decorator for CLI commands: user errors → `compressor: error: <message>` on stderr, exit 2."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            message = " ".join(str(err).split())
            print(f"compressor: error: {message}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper  # type: ignore[return-value]
