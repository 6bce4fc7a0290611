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
- `traceable_masks()`: below transformers 5.9 (`MASK_LENGTH_BC`), `masking_utils.sdpa_mask` reads a tensor
  `q_length` as the deprecated `cache_position` (a 1-D tensor of positions), and the TorchScript tracer hands it the
  query length as a 0-d tensor, so the trace fails there (IndexError). While a model is traced, the shim passes that
  length on as the positions it stands for (`arange(q_length) + q_offset`), which keeps the axis dynamic; 5.9 removed
  the branch and needs nothing.
- `scripted_helpers_as_python(model)`: transformers 5.5's DeBERTa-v2 compiles its relative-position helpers with
  `torch.jit.script`; traced, `build_rpos` becomes an ONNX `If` whose output rank is dynamic, which OpenVINO's CPU
  plugin cannot compile. While a model is traced, its modeling modules' scripted functions are their Python source
  (torch keeps it as `_torchdynamo_inline`), which the tracer follows like the rest of the model (the query and key
  lengths of self-attention are equal, so the branch it takes is the one every input takes); later releases script
  none. `traceable(model)` applies both.

Why the floor is 5.5: it is what optimum-intel 2.2 (the library x86 users serve OpenVINO models with) resolves to
(transformers < 5.6, huggingface-hub < 1.22): installed together, pip keeps optimum-intel's versions (a venv of
optimum-intel alone: docs/versions.md, Clients), and the fast suite passes there (`make test-compat`, whose venv
holds optimum-intel). Below 5.9 the TorchScript tracer needs
`traceable(model)` (above); 5.5's `save_pretrained` writes LayerNorm weights under their legacy names (`gamma`, `beta`),
which `surgery.checkpoint` reads as transformers does. In 5.0, ModernBERT's attention reshapes by its configured head
count, so a pruned ModernBERT cannot run there (run, and failed); 5.1 to 5.4 were not run.
"""

from __future__ import annotations

import os
import platform
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from compressor.core.errors import UserError

REQUIRED: dict[str, str] = {
    "transformers": ">=5.5",
    "torch": ">=2.13",
    "onnxruntime": ">=1.32",
    "accelerate": ">=1.15",
}
CHECKED_AT_RUN_TIME = ("transformers", "torch")  # the two whose wrong version fails deep inside a model class
OUTPUT_CAPTURING = "transformers.utils.output_capturing"
MASK_LENGTH_BC = "<5.9"  # transformers releases whose sdpa_mask reads a tensor q_length as cache_position


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


@contextmanager
def traceable(model) -> Iterator[None]:
    """What the TorchScript tracer needs to trace `model` on the installed transformers (module docstring)."""
    with traceable_masks(), scripted_helpers_as_python(model):
        yield


@contextmanager
def scripted_helpers_as_python(model) -> Iterator[None]:
    """The `torch.jit.script`ed functions of `model`'s modeling modules replaced by their Python source while in the
    block, and restored on exit; a model without any is left as it is."""
    import sys

    import torch

    modules = {sys.modules[type(m).__module__] for m in model.modules() if type(m).__module__ in sys.modules}
    swapped = [
        (module, name, value)
        for module in modules
        for name, value in vars(module).items()
        if isinstance(value, torch.jit.ScriptFunction) and callable(getattr(value, "_torchdynamo_inline", None))
    ]
    for module, name, value in swapped:
        setattr(module, name, value._torchdynamo_inline)
    try:
        yield
    finally:
        for module, name, value in swapped:
            setattr(module, name, value)


@contextmanager
def traceable_masks() -> Iterator[None]:
    """For a TorchScript trace: transformers' SDPA and eager masks take a traced (0-d tensor) query length, on
    releases in `MASK_LENGTH_BC`; elsewhere nothing changes. Restored on exit."""
    found = installed("transformers")
    if found is None or not _within(found, MASK_LENGTH_BC):
        yield
        return
    import torch
    from transformers import masking_utils

    original = masking_utils.sdpa_mask
    mapping = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping

    def sdpa_mask(*args, **kwargs):
        length = kwargs.get("q_length")
        if isinstance(length, torch.Tensor) and length.dim() == 0:
            kwargs["q_length"] = torch.arange(length, device=length.device) + kwargs.pop("q_offset", 0)
        return original(*args, **kwargs)

    masking_utils.sdpa_mask, mapping["sdpa"] = sdpa_mask, sdpa_mask
    try:
        yield
    finally:
        masking_utils.sdpa_mask, mapping["sdpa"] = original, original
