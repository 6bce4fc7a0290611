"""Run one experiment: its steps (product commands) in order, then its reader, into `results/NAME.json`.

Resumable at three levels: a finished experiment's result is kept (unless `force`); a step whose output is finished
(its `done` file exists) is skipped; an unfinished step is run again without `--force`, and the product resumes it
(`compressor run` keeps finished steps, members and seed repeats), from the parts an earlier session stored
(`benchmarks.parts`) when the output is gone. With `force` every step reruns from scratch
(`compressor run ... --force`) and the result is replaced. A failed step writes no result. One provenance record
goes with the result: commit, CPU and its int8 features, what else ran (the caller must say), the cache's state
when the experiment started, and its seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import parts, provenance
from benchmarks.readers import READERS
from benchmarks.schema import Provenance, Result, read_result, write_result
from benchmarks.suite import RESULTS, ROOT, Experiment
from compressor.core.errors import UserError
from compressor.core.machine import cache_root


def cache_state(root: Path | None = None) -> str:
    """'empty' when `$COMPRESSOR_CACHE` is absent or holds nothing (base fine-tunes, tables and exports will be
    made), else 'warm'."""
    root = cache_root() if root is None else root
    return "warm" if root.is_dir() and any(root.iterdir()) else "empty"


def argv(command: list[str], force: bool) -> list[str]:
    """The process to start: `compressor ...` as this interpreter's `-m compressor`, `python ...` as this
    interpreter; `--force` added to `compressor run` when forced."""
    head, rest = command[0], command[1:]
    if head == "compressor":
        rest = rest + (["--force"] if force and rest[:1] == ["run"] and "--force" not in rest else [])
        return [sys.executable, "-m", "compressor", *rest]
    return [sys.executable, *rest] if head == "python" else command


def run_steps(exp: Experiment, force: bool, log=print) -> None:
    """Each step not yet finished (every step when forced), in order; a failing one stops the experiment."""
    for step, command, shown in zip(exp.steps, exp.commands(), exp.shown(), strict=True):
        done = ROOT / exp.output(step) / step.done
        if done.exists() and not force:
            log(f"{exp.name}: kept finished step: {shown}")
            continue
        log(f"{exp.name}: running: {shown}")
        code = subprocess.run(argv(command, force), cwd=ROOT, env={**os.environ, **exp.env}).returncode
        if code != 0:
            raise UserError(f"{exp.name}: step failed (exit {code}): {shown}; rerun to resume it")
        if not done.exists():
            raise UserError(f"{exp.name}: step finished without writing {exp.output(step)}/{step.done}")


def run_experiment(exp: Experiment, else_running: str, force: bool = False, results: Path = RESULTS,
                   log=print) -> Result:  # fmt: skip
    """Run `exp` (resuming) and write its result; a finished result is returned untouched unless `force`."""
    if not else_running.strip():
        raise UserError("--else-running: say what else ran on the machine (e.g. 'nothing heavy')")
    path = results / f"{exp.name}.json"
    if path.exists() and not force:
        log(f"{exp.name}: finished; kept {path.name} (--force to run it again)")
        return read_result(path)
    started, cache = time.perf_counter(), cache_state()
    for part in [] if force else parts.restore_parts(exp, results):
        log(f"{exp.name}: restored {part} (made in an earlier session)")
    run_steps(exp, force, log)
    rows = READERS[exp.reader](exp, exp.last_output(), **exp.reader_args)
    record = Provenance(
        **provenance.made_here(else_running),
        cache=cache,
        seconds=round(time.perf_counter() - started, 1),
        commands=exp.shown(),
        parts=[] if force else parts.records(exp, results),
    )
    result = Result(experiment=exp.name, figure=exp.figure, goal=exp.goal, rows=rows, provenance=record)
    write_result(path, result)
    log(f"{exp.name}: wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return result
