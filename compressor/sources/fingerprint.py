"""What identifies a model or dataset source for caching: stable across clones and venvs, new when the files change.

The base fine-tune is cached under a hash of its inputs. Keying on a filesystem path alone would miss the cache
whenever the same built-in package sits in another venv, and would reuse a stale fine-tune after a local model
directory or data file is overwritten. So: built-ins are named with their package version, local paths with the
size and modification time of their files, hub ids stay as they are (the revision is keyed separately).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def package_source(source: str, package: str) -> str:
    """`source@version` for a built-in that ships in `package` (several packages joined by '+')."""
    try:
        return source + "@" + "+".join(f"{name}=={version(name)}" for name in package.split("+"))
    except PackageNotFoundError:
        return source


def local_source(path: str | Path) -> str:
    """The absolute path plus (name, size, mtime) of every file under it: changes when any file is rewritten."""
    path = Path(path).expanduser().resolve()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    stamps = [f"{p.relative_to(path.parent)}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return f"{path}|{'|'.join(stamps)}"


def source_fingerprint(source: str, builtins: dict[str, str]) -> str:
    """Fingerprint of a recipe `source` string; `builtins` maps built-in names to the package that ships them."""
    if source in builtins:
        return package_source(source, builtins[source])
    if Path(source).expanduser().exists():
        return local_source(source)
    return source
