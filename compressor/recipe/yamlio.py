"""Reading user input safely: bounded YAML parsing, short quotes of bad values, one-line pydantic errors.

Kept apart from the recipe schema (`compressor.recipe`) because the same rules serve every input a user types:
recipes, criterion parameters and command-line settings. A message never echoes more than a short prefix of a bad
value, and parsing a recipe takes bounded memory and time (size and alias limits).
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from compressor.core.errors import UserError


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


def _numeric_text(value: Any) -> bool:
    """Whether `value` is a number written as text (a quoted `"0.5"`), which the strict number fields refuse."""
    try:
        return isinstance(value, str) and len(value) < 100 and math.isfinite(float(value))
    except ValueError:
        return False


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """ONE line for a pydantic error: `<prefix><field>: <what was expected> (got <short value>)`.

    Used for recipes, criterion parameters and command-line settings alike; the value is quoted by `short`.
    """
    first = err.errors(include_url=False)[0]
    loc = prefix + ".".join(short_key(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    got = first.get("input")
    if first["type"] == "extra_forbidden":
        msg = "unknown key (not allowed here)"
    elif first["type"] in ("int_type", "float_type") and _numeric_text(got):
        msg += ", not text: write the number without quotes"
    quiet = first["type"] in ("extra_forbidden", "missing") or isinstance(got, dict) or "got " in msg
    tail = "" if quiet else f" (got {short(got)})"
    if loc and not loc.endswith(".") and re.match(r"[\w.]+: ", msg):  # a validator's message naming a sub-field
        return f"{loc}.{msg}{tail}"
    return f"{loc.rstrip('.')}: {msg}{tail}" if loc.rstrip(".") else f"{msg}{tail}"


class _BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` for recipes: refuses more than `MAX_ALIASES` aliases (a nested-alias 'billion laughs'
    document builds a tiny graph that any later walk of it, validation or printing, would expand exponentially),
    refuses a key given twice in one mapping (PyYAML would silently keep the last value), and reads `5e-5` as the
    number YAML 1.2 says it is (YAML 1.1 makes it text, which the strict number fields would refuse)."""

    aliases = 0

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 (PyYAML's signature)
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise RecipeError(f"recipe: more than {MAX_ALIASES} YAML aliases (*name); expected a plain recipe")
        return super().compose_node(parent, index)

    def construct_document(self, node: yaml.Node) -> Any:
        """Check every mapping for repeated keys (on the composed nodes, before `<<` merges are applied: a merge
        followed by an explicit key is an override, not a repetition), then build the document."""
        _check_unique_keys(node, self.construct_object)
        return super().construct_document(node)


_BoundedLoader.add_implicit_resolver(  # exponent floats YAML 1.1 reads as text: 5e-5, 1e3, 1.0e5, .5E-3
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def _check_unique_keys(root: yaml.Node, construct: Callable[[yaml.Node], Any]) -> None:
    """Refuse a key that appears twice in one mapping, naming its dotted path and both lines. Each node is
    visited once (aliases share nodes), so the walk is linear in the document's size."""
    stack, seen = [(root, "")], set()
    while stack:
        node, path = stack.pop()
        if id(node) in seen or isinstance(node, yaml.ScalarNode):
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}{i}.") for i, item in enumerate(node.value))
            continue
        lines: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key, line = _plain_key(key_node, construct), key_node.start_mark.line + 1
            if key in lines:
                raise RecipeError(
                    f"{path}{short_key(key)}: given twice (lines {lines[key]} and {line}); a recipe key may appear once"
                )
            if key is not None:
                lines[key] = line
            stack.append((value_node, f"{path}{short_key(key_node.value)}."))


def _plain_key(node: yaml.Node, construct: Callable[[yaml.Node], Any]) -> Any:
    """A mapping key as Python compares it (`1` and `1.0` collide, as in the dict PyYAML builds), or None for keys
    that are not repeatable scalars (`<<` merges, complex keys)."""
    if not isinstance(node, yaml.ScalarNode) or node.tag == "tag:yaml.org,2002:merge":
        return None
    try:
        key = construct(node)
        hash(key)
    except (yaml.YAMLError, TypeError):
        return None
    return key


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


MAX_SETTING_CHARS = 4096  # one `--set` value: a number, a name or a short list, never a document


def parse_setting(text: str) -> tuple[str, Any]:
    """`--set prune.steps=4` as `("prune.steps", 4)`: a dotted key of recipe fields, `=`, a YAML value (`null`,
    `[heads, neurons]`, `{kind: heads, values: [0.5]}`), read as a recipe is (bounded, YAML 1.2 numbers)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set: expected KEY=VALUE such as prune.steps=4, got {short(text)}")
    key = key.strip()
    if not all(part.isidentifier() for part in key.split(".")):
        raise RecipeError(f"--set: expected a dotted key of recipe fields such as prune.steps, got {short(key)}")
    if len(value) > MAX_SETTING_CHARS:
        raise RecipeError(f"--set {key}: a value of {len(value)} characters; expected at most {MAX_SETTING_CHARS}")
    loader = _BoundedLoader(value)
    try:
        return key, loader.get_single_data()
    except yaml.YAMLError as err:
        raise RecipeError(f"--set {key}: malformed YAML value: {short(getattr(err, 'problem', err))}") from None
    finally:
        loader.dispose()


def apply_settings(data: Any, settings: dict[str, Any]) -> Any:
    """`data` (a parsed recipe) with each dotted key set to its value, missing sections created; a copy, so the
    file's own mapping is untouched. A key through something that is not a mapping is one line naming it."""
    if not settings or not isinstance(data, dict):
        return data
    out = dict(data)
    for key, value in settings.items():
        node, parts = out, key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise RecipeError(f"--set {key}: '{where}' is {short(child)}, not a section; expected a mapping there")
            node[part] = child = dict(child)
            node = child
        node[parts[-1]] = value
    return out


def settings_of(texts: list[str] | None) -> dict[str, Any]:
    """The command line's `--set KEY=VALUE` options as overrides; a key given twice is one line."""
    out: dict[str, Any] = {}
    for text in texts or []:
        key, value = parse_setting(text)
        if key in out:
            raise RecipeError(f"--set {key}: given twice; expected each key once")
        out[key] = value
    return out
