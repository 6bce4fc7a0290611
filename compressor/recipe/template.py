"""A starter recipe generated from the schema: every field with its default and a comment saying what it is.

`compressor init` writes it, so a user who installed the wheel needs no copy of the repository's recipes/. It is
generated from the pydantic models (`Recipe` and its sections), so it cannot drift from what `load_recipe` accepts:
a section that is off by default (`null`, e.g. `prune.budget`) is followed by its own fields commented out.
"""

from __future__ import annotations

import json
import textwrap
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from compressor.recipe.recovery import step_names
from compressor.recipe.schema import Recipe

# Fields whose allowed values are registered by other packages, not written in their type: the names each takes.
REGISTERED = {"recovery": step_names}
INDENT = "  "
WIDTH = 118  # comment lines are wrapped to this many characters


def _scalar(value: Any) -> str:
    """`value` as one line of YAML (flow style for lists and mappings)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _constraints(info: FieldInfo) -> str:
    """The field's range, e.g. '>= 1, <= 65536', from its pydantic metadata."""
    bounds = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "min length", "max_length": "max length"}
    found = []
    for meta in info.metadata:
        for attr, word in bounds.items():
            value = getattr(meta, attr, None)
            if value is not None and attr not in ("max_length",):
                found.append(f"{word} {value}")
    return ", ".join(found)


def _type_text(annotation: Any) -> str:
    """A short reading of a field's type: 'int | null', "'linear' | 'geometric'", 'list of str', 'section'."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is Annotated:
        return _type_text(args[0])
    if origin in (Union, UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is list:
        return f"list of {_type_text(args[0])}"
    if origin is dict:
        return f"mapping of {_type_text(args[0])} to {_type_text(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", "any").lower() if annotation is not Any else "any"


def _comment(info: FieldInfo, model: type[BaseModel] | None, name: str = "") -> str:
    """The comment above a field: its description (or its section's docstring's first sentence), type and range,
    and for a field of registered names (`REGISTERED`), the names registered."""
    text = info.description or ""
    if not text and model is not None and model.__doc__:
        text = " ".join(model.__doc__.split("\n\n")[0].split())
    if model is not None:
        return text
    registered = f"registered: {', '.join(REGISTERED[name]())}" if name in REGISTERED else ""
    detail = ", ".join(part for part in (_type_text(info.annotation), _constraints(info), registered) if part)
    return f"{text} [{detail}]"


def _section_type(info: FieldInfo) -> type[BaseModel] | None:
    """The recipe section class a field holds (also when it may be null), or None for a plain value."""
    candidates = [info.annotation, *getattr(info.annotation, "__args__", ())]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _lines(model: type[BaseModel], values: dict[str, Any], depth: int, prefix: str = "") -> list[str]:
    """The YAML lines of `model`'s fields at `values` (its dumped defaults), commented, indented `depth` levels;
    `prefix` ('# ') comments the lines out (a section that is null by default)."""
    pad = INDENT * depth
    out: list[str] = []
    for name, info in model.model_fields.items():
        section = _section_type(info)
        value = values.get(name)
        out.extend(
            textwrap.wrap(
                _comment(info, section, name), WIDTH - len(pad), initial_indent=pad + "# ", subsequent_indent=pad + "# "
            )
        )
        if section is not None and isinstance(value, dict):
            out.append(f"{pad}{prefix}{name}:")
            out.extend(_lines(section, value, depth + 1, prefix))
        elif section is not None:
            out.append(f"{pad}{prefix}{name}: null  # or, to turn it on:")
            out.append(f"{pad}# {name}:")
            out.extend(_lines(section, _defaults(section), depth + 1, "# "))
        else:
            out.append(f"{pad}{prefix}{name}: {_scalar(value)}")
    return out


def _defaults(section: type[BaseModel]) -> dict[str, Any]:
    """A section's defaults as plain JSON values."""
    return json.loads(section().model_dump_json())


def starter_recipe(model: str | None = None, data: str | None = None, name: str = "run") -> str:
    """The text of a starter recipe: every field at its default with a comment, `model.source` / `data.source` set
    where given, `name` and `output_dir` (runs/NAME) from `name`. It loads with `load_recipe` as written."""
    values = json.loads(Recipe().model_dump_json())
    values["name"], values["output_dir"] = name, f"runs/{name}"
    if model:
        values["model"]["source"] = model
    if data:
        values["data"]["source"] = data
    header = [
        "# A compressor recipe: `compressor validate` checks it, `compressor run` runs it.",
        "# Every field is shown at its default; delete what you do not change. Bracketed: type and allowed range.",
    ]
    return "\n".join([*header, *_lines(Recipe, values, 0)]) + "\n"
