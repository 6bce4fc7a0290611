"""The library versions compressor runs on, checked before anything imports them, and every version-dependent path.

`REQUIRED` is the declared range (pyproject.toml's dependencies carry the same specifiers; tests/test_compat.py
keeps the two equal). Each floor is the lowest release on which the fast suite was run and passed
(`make test-compat` runs it at the floor; README, "Versions"); no upper cap is declared where no break is known.

`outside()` reads the installed versions from package metadata, so an unsupported transformers or torch is
reported as one line (`UnsupportedVersionError`, exit 2 from the CLI) before a model class is ever imported:
`compressor/__init__.py` skips its eager imports on such a stack, the CLI checks first thing, and the Python API's
lazy attributes check before importing their module.

Version-dependent code paths (each named once, here; none is an `if version` check elsewhere). The one there is
lives in `compressor/surgery/portable.py`, which ships standalone inside every saved model (it may import only torch
and transformers) and so carries its own fallback:
- `OUTPUT_CAPTURING`: the module whose hook records a layer's hidden state; portable.py installs it on a removed
  layer so `output_hidden_states` keeps one entry per layer. Absent in transformers 5.0 (the removed layer's entry is
  then missing); in 5.5 its hook takes no `capture_initial_hidden_state` argument, which 5.9 has (portable.py
  passes it only where the recorder has it).

Why the floor is 5.9 (found by running the suite, README "Versions"): up to 5.8.1, exporting with the TorchScript
tracer fails inside `transformers.masking_utils.sdpa_mask` (an IndexError in its deprecated `cache_position`
branch, which the traced graph enters; seen at 5.5.4, 5.7.0 and 5.8.1); in 5.0, ModernBERT's attention also
reshapes by its configured head count, so a pruned ModernBERT cannot run, and ORT's attention fusion finds no heads
in the export. torch.export (the exporter "auto" falls back to, `deploy.exporters`) takes every architecture at 5.5.4
(the per-architecture export parity tests pass there, but for ModernBERT's fused graph that ONNX Runtime refuses, now
replaced by the unfused one); the whole suite has not been run below 5.9, so the floor stays until it has.
"""

from __future__ import annotations

import os
import platform
import warnings
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from compressor.core.errors import UserError

REQUIRED: dict[str, str] = {
    "transformers": ">=5.9",
    "torch": ">=2.13",
    "onnxruntime": ">=1.32",
    "accelerate": ">=1.15",
}
CHECKED_AT_RUN_TIME = ("transformers", "torch")  # the two whose wrong version fails deep inside a model class
OUTPUT_CAPTURING = "transformers.utils.output_capturing"


class UnsupportedVersionError(UserError):
    """An installed library outside the range compressor supports (one line: installed vs supported)."""


def installed(package: str) -> str | None:
    """The installed version of `package` from its metadata (nothing is imported), or None if it is absent."""
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _within(found: str, spec: str) -> bool:
    """Whether version string `found` (a local tag like '+cpu' ignored) satisfies `spec`."""
    try:
        return Version(found) in SpecifierSet(spec)
    except InvalidVersion:
        return False


def outside(packages: tuple[str, ...] = CHECKED_AT_RUN_TIME) -> dict[str, str | None]:
    """The packages of `packages` that are missing (None) or installed outside `REQUIRED`, with their versions."""
    found = {name: installed(name) for name in packages}
    return {name: v for name, v in found.items() if v is None or not _within(v, REQUIRED[name])}


ALLOW_ENV = "COMPRESSOR_ALLOW_UNSUPPORTED"  # "1": run on an untested installed version anyway, with a warning


def runnable() -> bool:
    """Whether compressor runs here: transformers and torch within the range, or installed and allowed anyway
    (`COMPRESSOR_ALLOW_UNSUPPORTED=1`). `import compressor` imports nothing heavy where this is False."""
    wrong = outside()
    return not wrong or _allowed(wrong)


def _allowed(wrong: dict[str, str | None]) -> bool:
    """Whether the out-of-range packages `wrong` may run anyway: all installed, and `COMPRESSOR_ALLOW_UNSUPPORTED=1`."""
    return os.environ.get(ALLOW_ENV) == "1" and all(v is not None for v in wrong.values())


def require_supported() -> None:
    """Raise `UnsupportedVersionError` naming the installed and the supported versions if transformers or torch
    is outside the declared range. With `COMPRESSOR_ALLOW_UNSUPPORTED=1` (an installed torch older than the floor
    that a user's platform pins, e.g. a GPU image) the same line is a warning instead: the floors are the oldest
    versions tested, and the parity checks of every run still guard what it ships."""
    wrong = outside()
    if not wrong:
        return
    found = "; ".join(f"{name} {v} is installed" if v else f"{name} is not installed" for name, v in wrong.items())
    wanted = [f"{name}{REQUIRED[name]}" for name in wrong]
    quoted = " ".join(f"'{w}'" for w in wanted)
    message = f"{found}; compressor supports {', '.join(wanted)} (pip install {quoted})"
    if _allowed(wrong):  # the same line as a warning
        warnings.warn(f"{message}; running anyway ({ALLOW_ENV}=1)", stacklevel=2)
        return
    raise UnsupportedVersionError(message)


def versions_report(compressor_version: str) -> str:
    """The lines `compressor --version` prints: compressor's version, then each library's installed version with
    its supported range (flagged where outside it), then Python's."""
    lines = [f"compressor {compressor_version}"]
    for name, spec in REQUIRED.items():
        found = installed(name)
        flag = "" if found and _within(found, spec) else "  UNSUPPORTED"
        lines.append(f"{name} {found or 'not installed'} (supported {spec}){flag}")
    lines.append(f"python {platform.python_version()}")
    return "\n".join(lines)
