"""Reading user input safely: bounded YAML parsing, short quotes of bad values, one-line pydantic errors.

Kept apart from the recipe schema (`compressor.recipe`) because the same rules serve every input a user types:
recipes, criterion parameters and command-line settings. A message never echoes more than a short prefix of a bad
value, and parsing a recipe takes bounded memory and time (size and alias limits).
"""

from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from compressor.errors import UserError


class RecipeError(UserError, ValueError):
    """A recipe (or its inputs) is invalid; the message is one line naming the field."""


MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML; refuse anything that could take real memory to parse
MAX_ALIASES = 100  # YAML aliases may share nodes; a few are normal, thousands are an expansion bomb


class _ShortRepr(reprlib.Repr):
    """`reprlib` limits for containers; strings and big numbers keep only a prefix (never head...tail)."""

    def repr_str(self, x: str, level: int) -> str:
        return repr(x) if len(x) <= self.maxstring else repr(x[: self.maxstring]) + "..."

    def repr_int(self, x: int, level: int) -> str:
        return str(x) if x.bit_length() < 128 else f"an integer of {x.bit_length()} bits"


_SHORT = _ShortRepr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 2, 60, 60
_SHORT.maxdict = _SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = _SHORT.maxfrozenset = 4


def short(value: Any) -> str:
    """`repr(value)` cut to a short prefix, in bounded time and memory (nested and shared values included), so an
    error message never echoes a huge value."""
    return _SHORT.repr(value)


def short_key(key: Any) -> str:
    """A recipe key for an error message: as written, cut to a short prefix."""
    text = str(key)
    return text if len(text) <= _SHORT.maxstring else text[: _SHORT.maxstring] + "..."


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """ONE line for a pydantic error: `<prefix><field>: <what was expected> (got <short value>)`.

    Used for recipes, criterion parameters and command-line settings alike; the value is quoted by `short`.
    """
    first = err.errors(include_url=False)[0]
    loc = prefix + ".".join(short_key(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key (not allowed here)"
    got = first.get("input")
    quiet = first["type"] in ("extra_forbidden", "missing") or isinstance(got, dict) or "got " in msg
    tail = "" if quiet else f" (got {short(got)})"
    if loc and not loc.endswith(".") and re.match(r"[\w.]+: ", msg):  # a validator's message naming a sub-field
        return f"{loc}.{msg}{tail}"
    return f"{loc.rstrip('.')}: {msg}{tail}" if loc.rstrip(".") else f"{msg}{tail}"


class _BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses more than `MAX_ALIASES` aliases (a nested-alias 'billion laughs' document
    builds a tiny graph that any later walk of it, validation or printing, would expand exponentially)."""

    aliases = 0

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 (PyYAML's signature)
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise RecipeError(f"recipe: more than {MAX_ALIASES} YAML aliases (*name); expected a plain recipe")
        return super().compose_node(parent, index)


def read_yaml(path: Path) -> Any:
    """Parse a recipe file with bounded size and alias count; problems become one-line `RecipeError`s."""
    if path.stat().st_size > MAX_RECIPE_BYTES:
        raise RecipeError(f"{path}: {path.stat().st_size} bytes; expected a recipe under {MAX_RECIPE_BYTES} bytes")
    try:
        loader = _BoundedLoader(path.read_text(encoding="utf-8"))
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except UnicodeDecodeError as err:
        raise RecipeError(
            f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start}); expected a YAML recipe"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(f"{path}: malformed YAML{where}: {short(getattr(err, 'problem', err))}") from None
