"""Atomic outputs: readers see either the old file/directory or the complete new one, never half of it.

`check_replaceable` is the one guard of the writers that replace an output directory as a whole (ONNX export, bench
report, analysis); a run's own directory is guarded by `compressor.core.outdir`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from compressor.core.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | Path, text: str) -> None:
    """Write a file via a temp file in the same directory and a rename; the file gets the mode any other file
    would (0644 under the usual umask), not mkstemp's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_replaceable(out_dir: str | Path, produces: Collection[str], option: str) -> Path:
    """Refuse, before anything is computed, an output directory that `directory(out_dir)` must not replace.

    The one rule: a directory is replaced only when it is absent, empty, or holds nothing but names in `produces`
    (what that writer writes, its manifest included). Anything else in it is someone else's and would be deleted
    with the directory, so it is refused with a one-line `UserError` starting with `option` (the option or field
    that named the directory). Returns `out_dir` as a path.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"{option}: '{out}' is a file; expected a directory")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in produces)
        if other:
            shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
            raise UserError(
                f"{option}: '{out}' holds other files ({shown}); expected a new or empty directory or an earlier "
                "output of this command (it is replaced as a whole)"
            )
    return out


@contextmanager
def directory(out_dir: str | Path) -> Iterator[Path]:
    """Yield a hidden sibling temp directory to fill; on success it replaces `out_dir`, on error it is removed.

    One complete version is always on disk: the old `out_dir` is renamed aside (`.NAME.old`), the new one renamed
    in, then the old one deleted. A process killed between the renames leaves the old one aside; the next call for
    the same `out_dir` puts it back (or, when the new one is already in, deletes it). Not for concurrent writers of
    one `out_dir`.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    recover(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; outputs are meant to be shared
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def aside_path(out_dir: str | Path) -> Path:
    """Where `directory` keeps the previous `out_dir` during a swap."""
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}.old"


def recover(out_dir: str | Path) -> None:
    """Finish or undo a swap that a killed process left half done (no-op when there is nothing to do)."""
    out_dir, old = Path(out_dir), aside_path(out_dir)
    if not (old.exists() or old.is_symlink()):
        return
    if out_dir.exists() or out_dir.is_symlink():
        _remove(old)  # the new one made it in; only the delete of the old one was missed
    else:
        old.rename(out_dir)  # killed between the two renames: the old one is the last complete output


def _swap_in(new: Path, out_dir: Path) -> None:
    old = aside_path(out_dir)
    had_old = out_dir.exists() or out_dir.is_symlink()
    if had_old:
        _remove(old)
        out_dir.rename(old)
    try:
        new.rename(out_dir)
    except BaseException:
        if had_old and not (out_dir.exists() or out_dir.is_symlink()):
            old.rename(out_dir)
        raise
    if had_old:
        _remove(old, ignore_errors=True)


def _remove(path: Path, ignore_errors: bool = False) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=ignore_errors)
    elif path.exists() or path.is_symlink():
        try:
            path.unlink()
        except OSError:
            if not ignore_errors:
                raise
