"""The one output-directory guard: where a run may write, decided before any data or model loads.

Rules (README, "Input rules"):
- `output_dir` is a path of its own: `~` expands explicitly (as for model and data sources); the home directory,
  the working directory, its parents and `/` are refused, and so is a symbolic link (give its target instead).
- A run writes only into an absent or empty directory, or into its own earlier run. A directory is a compressor run
  when it holds `IDENTITY_FILE` (a run id and the SHA-256 of the resolved recipe) whose hash matches the
  `recipe.resolved.yaml` next to it; a user's folder that merely has a `state/` or `model/` in it is not one.
- `--force` replaces an earlier run only: the previous run is moved aside to `.NAME.previous` once every input has
  loaded (`claim`), and deleted when the new run has finished (`finish`, also run at process exit); a failed new
  run leaves it there.
- One run per directory: `claim` takes an exclusive `flock` on the sibling `.NAME.lock`; a second run is refused
  with one line, at `check` already when the first one holds the lock.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from compressor.core import atomic
from compressor.core.errors import UserError

IDENTITY_FILE = ".compressor-run.json"
RESOLVED_FILE = "recipe.resolved.yaml"  # the same names as the runner's
DONE_FILE = "report.json"
_HELD: dict[Path, int] = {}  # absolute output directory -> file descriptor of its held lock
SYSTEM_FILESYSTEMS = frozenset(  # kernel interfaces, never storage: creating a file there fails even for root
    {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs", "configfs", "pstore", "bpf",
     "efivarfs", "fusectl", "binfmt_misc", "mqueue", "autofs", "nsfs"}
)  # fmt: skip


@dataclass(frozen=True)
class RunDir:
    """The checked target of a run: `mode` is 'new' (absent or empty), 'resume' (own unfinished run) or 'replace'
    (an earlier run, with --force)."""

    path: Path
    mode: str


def target_path(output_dir: str) -> Path:
    """`output_dir` as a path, `~` expanded; refuses the home directory, the working directory and its parents."""
    path = Path(output_dir).expanduser()
    resolved, cwd = path.resolve(), Path.cwd().resolve()
    if resolved in (Path.home().resolve(), cwd) or resolved in cwd.parents:
        raise UserError(
            f"output_dir: '{output_dir}' is the home or working directory (or a parent); expected a directory of "
            "its own, e.g. runs/NAME"
        )
    return path


def is_run(out: Path) -> bool:
    """Whether `out` holds a compressor run: a readable identity whose recipe hash matches the resolved recipe."""
    try:
        identity = json.loads((out / IDENTITY_FILE).read_text())
        resolved = (out / RESOLVED_FILE).read_text()
        return bool(identity.get("run_id")) and identity.get("recipe_sha256") == _sha256(resolved)
    except (OSError, ValueError, AttributeError):
        return False


def check_run_dir(output_dir: str, force: bool, same_recipe: Callable[[Path], bool]) -> RunDir:
    """Decide, writing nothing, whether a run may use `output_dir`; a refusal is one line naming `output_dir`.

    `same_recipe(resolved_file)` tells whether an unfinished run was started with this run's recipe (resumable).
    """
    out = target_path(output_dir)
    if out.is_symlink():
        raise UserError(f"output_dir: '{out}' is a symbolic link; expected a real directory (give the link's target)")
    _check_writable(out)
    if not out.exists() or not any(out.iterdir()):
        return RunDir(out, "new")
    if not is_run(out):
        raise UserError(
            f"output_dir: '{out}' is not empty and holds no compressor run, so nothing there is replaced; "
            "expected a new, empty or earlier run's directory"
        )
    _check_unlocked(out)
    if force:
        return RunDir(out, "replace")
    if (out / DONE_FILE).exists():
        raise UserError(f"output_dir: '{out}' holds a finished run; pass --force to overwrite it")
    if not same_recipe(out / RESOLVED_FILE):
        raise UserError(
            f"output_dir: '{out}' holds an unfinished run of a different recipe; pass --force to start over "
            "or choose another output_dir"
        )
    return RunDir(out, "resume")


def claim(target: RunDir, resolved_recipe: str) -> Path:
    """Take the directory for this run (main process, after every input has loaded): lock it, move an earlier run
    aside (`replace`), create it and write the run's identity and resolved recipe. Returns the directory."""
    out = target.path
    _lock(out)
    if target.mode == "replace":
        _set_aside(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _cannot_create(out, err) from None
    old = _read_identity(out)
    run_id = old.get("run_id") if target.mode == "resume" and old.get("run_id") else uuid.uuid4().hex
    atomic.write_text(out / RESOLVED_FILE, resolved_recipe)
    identity = {"tool": "compressor", "run_id": run_id, "recipe_sha256": _sha256(resolved_recipe)}
    atomic.write_text(out / IDENTITY_FILE, json.dumps(identity, indent=2))
    return out


def previous_path(out: Path) -> Path:
    """Where `--force` keeps the run it replaces until the new one finishes."""
    return out.parent / f".{out.name}.previous"


def finish(out: Path) -> None:
    """Delete the replaced run once `out` holds a finished one, and release the lock (idempotent)."""
    if (out / DONE_FILE).exists():
        shutil.rmtree(previous_path(out), ignore_errors=True)
    fd = _HELD.pop(out.absolute(), None)
    if fd is not None:
        _lock_path(out).unlink(missing_ok=True)
        os.close(fd)


def _set_aside(out: Path) -> None:
    """Move the earlier run to `.NAME.previous`; an unfinished replacement of a run already aside is dropped."""
    previous = previous_path(out)
    if not out.exists():
        return
    if previous.exists() and not (out / DONE_FILE).exists():
        shutil.rmtree(out)  # our own unfinished replacement; the last finished run stays aside
        return
    shutil.rmtree(previous, ignore_errors=True)
    out.rename(previous)


def _read_identity(out: Path) -> dict:
    try:
        found = json.loads((out / IDENTITY_FILE).read_text())
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _check_writable(out: Path) -> None:
    """`out` (or its nearest existing parent) must be a directory we can create files in; nothing is created."""
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"output_dir: '{out}' is not usable ('{probe}' is a file); expected a writable directory")
    if not os.access(probe, os.W_OK | os.X_OK) or os.statvfs(probe).f_flag & os.ST_RDONLY:
        raise UserError(f"output_dir: '{out}' is not writable; expected a writable directory")
    kind = _filesystem_type(probe)
    if kind in SYSTEM_FILESYSTEMS:
        raise UserError(
            f"output_dir: '{out}' is on the system filesystem {kind} ('{probe}'), where no run can be written; "
            "expected a writable directory"
        )


def _filesystem_type(path: Path) -> str | None:
    """The type of the filesystem holding `path` (the longest mount point above it in `/proc/self/mountinfo`), or
    None where that is unknown (not Linux). Root passes every permission check, so a kernel filesystem such as
    /proc is only recognised by its type."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target, best, kind = str(path.resolve()), "", None
    for line in mounts:
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # spaces are \040
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # a later mount on the same point hides the earlier one
            best, kind = point, fields[fields.index("-", 6) + 1]
    return kind


def _lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


def _check_unlocked(out: Path) -> None:
    """Refuse `out` while another process holds its lock (probing takes and drops the lock, creating nothing)."""
    if out.absolute() in _HELD or not _lock_path(out).exists():
        return
    try:
        fd = os.open(_lock_path(out), os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise _in_use(out) from None
    finally:
        os.close(fd)


def _lock(out: Path) -> None:
    """Hold an exclusive lock on `.NAME.lock` until `finish(out)` or process exit; refuse when another run has it."""
    if out.absolute() in _HELD:
        return
    path = _lock_path(out)
    while True:
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise _in_use(out) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino  # the holder before us may have unlinked it
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[out.absolute()] = fd


def _open_lock(path: Path) -> int:
    """Create (with the directories above it) and open the lock file; where nothing can be written (a file system
    the up-front check could not know to be unwritable) the run stops with one line, before it has written anything."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise _cannot_create(path, err) from None


def _cannot_create(path: Path, err: OSError) -> UserError:
    reason = err.strerror or type(err).__name__
    return UserError(f"output_dir: cannot create '{path}' ({reason}); expected a writable directory")


def _in_use(out: Path) -> UserError:
    return UserError(f"output_dir: '{out}' is in use by another compressor run; expected one run per output_dir")


@atexit.register
def _finish_all() -> None:
    """At exit the new run is finished or not: drop the replaced run in the first case, release every lock."""
    for out in list(_HELD):
        finish(out)
