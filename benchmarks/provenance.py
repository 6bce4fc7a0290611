"""What every timing benchmark's result names beside its figures, in one place: the commit it measured, the CPU (its
int8 features and the identity `compressor.core.machine.cpu_identity` compares), what else ran on the machine and how
long the benchmark took. Imported by the scripts after they have put the repository on `sys.path`."""

from __future__ import annotations

import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from compressor.core.machine import cpu_identity, cpu_summary, int8_features

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str | None:
    """This checkout's short HEAD, with "+dirty" when tracked files have uncommitted changes (the figure then measured
    code no commit holds; new result files do not count); None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        status = ["git", "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, cwd=ROOT, capture_output=True, text=True).stdout
    except OSError:
        return None
    name = head.stdout.strip()
    return (name + ("+dirty" if dirty.strip() else "")) if head.returncode == 0 and name else None


def measured_on(else_running: str | None = None, started: float | None = None) -> dict:
    """The provenance fields: commit, cpu, cpu_identity, else_running ("not stated" when the caller said nothing) and,
    given the `time.perf_counter()` the benchmark started at, its seconds so far."""
    out = {"commit": commit(), "cpu": cpu_summary(), "cpu_identity": cpu_identity()}
    out["else_running"] = else_running or "not stated"
    if started is not None:
        out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def made_here(else_running: str, ran_at: str | None = None) -> dict:
    """Where something is being made, as a result's `Provenance` and a stored part's record both name it: the commit
    (`ran_at`, the one it ran at, by default this checkout's), the UTC date, the CPU's model, its int8 features and
    identity, and what else ran."""
    cpu = cpu_summary()
    return {
        "commit": ran_at or commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu["model"],
        "int8_features": int8_features(cpu),
        "cpu_identity": cpu_identity(),
        "else_running": else_running,
    }
