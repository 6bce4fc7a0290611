"""Lazily imported package attributes: a package names what it offers without importing every module behind it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, names: Mapping[str, str], before: Callable[[], None] | None = None
) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package` that imports `names[attr]` (a module path) on first access,
    calling `before` first (a check that raises instead of letting the import fail deep inside)."""

    def __getattr__(name: str) -> Any:
        if name in names:
            if before is not None:
                before()
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
