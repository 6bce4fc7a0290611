"""The engines, one module each: importing this package registers every module in it with `compressor.core.runtimes`.

An engine module subclasses `compressor.core.runtimes.Engine` (how its runtimes are built at export, loaded for the
bench, timed for the latency table, and its version) and calls `register(engine, Runtime(...), ...)` with its
runtime declarations. Nothing else names it: export, the bench, the latency table, `compressor pick` and the report
iterate over the registry. A module imports only `core` at its top (the rest inside its methods), since it is
imported before the recipe schema reads the registry's tables.
"""

from __future__ import annotations

import importlib
import pkgutil

from compressor.core.runtimes import mark_complete


def _import_all() -> None:
    """Import (and so register) every module of this package."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")
    mark_complete()


_import_all()
