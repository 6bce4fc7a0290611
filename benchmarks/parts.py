"""An experiment finished over several sessions: the parts of a step's output that a later session resumes from.

A figure over three whole-pipeline seeds can outlast a session on a slow CPU, and a machine keeps no `runs/` from one
session to the next. A step's `parts` globs name the small files its command resumes from (a finished `--seeds`
repeat's `report.json` and `recipe.resolved.yaml`: `compressor run --seeds` keeps such a repeat and runs the rest).
`python -m benchmarks parts NAME --else-running TEXT` copies them into `benchmarks/results/NAME.parts/step-K/`
(committed; this machine's paths written as `$COMPRESSOR_CACHE` and `.`) with a record of where each was made
(`parts.json`: commit, CPU, date, what else ran); `run` restores the missing ones into the step's output before the
step runs, and the result's provenance lists the parts, so a figure whose repeats ran on two machines says which ran
where.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import provenance
from benchmarks.suite import RESULTS, ROOT, Experiment
from compressor.core import atomic
from compressor.core.errors import UserError
from compressor.core.machine import cache_root

PARTS_FILE = "parts.json"


def parts_dir(exp: Experiment, results: Path = RESULTS) -> Path:
    return results / f"{exp.name}.parts"


def records(exp: Experiment, results: Path = RESULTS) -> list[dict]:
    """The stored parts' records (empty when none were stored), each with its `part` path under the parts folder."""
    path = parts_dir(exp, results) / PARTS_FILE
    return json.loads(path.read_text()) if path.exists() else []


def store_parts(exp: Experiment, else_running: str, results: Path = RESULTS, commit: str | None = None) -> list[str]:
    """Copy each step's `parts` matches into the parts folder, recording where they were made (`commit`: the one
    they ran at, by default this checkout's; a part stored again replaces its record); returns the parts' paths.
    None matching is a one-line `UserError`."""
    if not else_running.strip():
        raise UserError("--else-running: say what else ran while the parts were made (e.g. 'nothing heavy')")
    stored = {r["part"]: r for r in records(exp, results)}
    made = provenance.made_here(else_running, commit)
    for k, step in enumerate(exp.steps):
        out = ROOT / exp.output(step)
        for pattern in step.parts:
            for path in sorted(out.glob(pattern)):
                part = f"step-{k}/{path.relative_to(out).as_posix()}"
                target = parts_dir(exp, results) / part
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic.write_text(target, without_machine_paths(path.read_text()))
                stored[part] = {"part": part, **made}
    if not stored:
        raise UserError(f"{exp.name}: nothing in the steps' outputs matches their parts patterns; nothing stored")
    atomic.write_text(parts_dir(exp, results) / PARTS_FILE, json.dumps(sorted(stored.values(), key=_key), indent=1))
    return sorted(stored)


def without_machine_paths(text: str) -> str:
    """`text` with this machine's cache root and checkout named as `$COMPRESSOR_CACHE` and `.`: a report names the
    cached fine-tunes it used by their paths, and nothing committed names a path of the machine it was made on."""
    for path, name in ((cache_root(), "$COMPRESSOR_CACHE"), (ROOT, ".")):
        text = text.replace(str(path.resolve()), name).replace(str(path), name)
    return text


def _key(record: dict) -> str:
    return record["part"]


def restore_parts(exp: Experiment, results: Path = RESULTS) -> list[str]:
    """Copy every stored part missing from its step's output back into it; returns those restored. A record naming
    no step of the experiment, a file the parts folder lacks, or one none of that step's `parts` patterns matches
    (the experiment was edited since the parts were stored) is a one-line `UserError` before anything is copied."""
    targets = [(record["part"], _target(exp, record["part"], results)) for record in records(exp, results)]
    restored = []
    for part, target in targets:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(parts_dir(exp, results) / part, target)
            restored.append(part)
    return restored


def _target(exp: Experiment, part: str, results: Path) -> Path:
    """Where the stored `part` (`step-K/inner`) goes in step K's output, checked against the experiment as it is."""
    step, _, inner = part.partition("/")
    k = step.removeprefix("step-")
    folder = parts_dir(exp, results)
    where = f"{folder.name}/{PARTS_FILE}"
    if not (k.isdigit() and int(k) < len(exp.steps)):
        raise UserError(f"{where}: part {part!r} names no step of {exp.name} (it has {len(exp.steps)}); store again")
    chosen = exp.steps[int(k)]
    if not (folder / part).is_file():
        raise UserError(f"{where}: part {part!r} is not in {folder.name}/")
    if not any(folder / part in (folder / step).glob(pattern) for pattern in chosen.parts):  # matched as stored
        raise UserError(f"{where}: part {part!r} matches none of step {k}'s parts patterns {chosen.parts}; store again")
    return ROOT / exp.output(chosen) / inner
