"""Whether other processes competed for the CPU while we timed: the CPU time of the cores we may run on beside ours.

A paired ratio (the original's time over the pruned model's, round by round) survives a machine that is slower for
a while, but not a neighbour that takes a core: on two cores, one busy process beside our two threads slows a big
model's and a small model's calls by different factors, and a pruning step's calibration then reads a 2x model at
1.1x and gives units back, or at 2.5x and takes too many. `/proc/stat` says how many CPU seconds the cores we may run on
spent (steal included: a hypervisor's other guests compete too) and `os.times` how many were ours, so their difference
over a round is what others used. `Quiet` turns that into a decision: a round timed beside more than `cores` busy
cores of others is timed again once they are gone, waiting at most `max_wait_s` per timing in all.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from compressor.core.errors import UserError

PROC_STAT = Path("/proc/stat")
MIN_WINDOW_S = 0.5
WAIT_ENV = "COMPRESSOR_TIMING_WAIT_S"  # the most seconds one timing waits for the CPU (0: never wait, only say so)
# A /proc/stat per-CPU line: cpuN user nice system idle iowait irq softirq steal guest guest_nice (guest time is
# already inside user and nice, so it is not added again).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class Snapshot:
    """The busy CPU seconds of the cores this process may run on and its own CPU seconds, at one wall-clock time."""

    wall: float
    machine: float
    own: float


def _ours() -> set[int] | None:
    """The CPUs this process may run on (None where the platform does not say)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def snapshot(stat: Path = PROC_STAT, cpus: set[int] | None = None) -> Snapshot | None:
    """Now; None where the machine's CPU time cannot be read (no Linux `/proc/stat`). Only the CPUs this process
    may run on count (`cpus`, default its affinity): on a large machine, others busy on other cores do not take
    ours."""
    cpus = _ours() if cpus is None else cpus
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    busy, seen = 0, 0
    for line in lines:
        name, *values = line.split() or [""]
        if not name.startswith("cpu") or not name[3:].isdigit() or (cpus is not None and int(name[3:]) not in cpus):
            continue
        try:
            ticks = [int(v) for v in values[:8]]
        except ValueError:
            return None
        busy += sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks))
        seen += 1
    if not seen:
        return None
    own = os.times()
    return Snapshot(time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system)


def others_cores(before: Snapshot | None, after: Snapshot | None) -> float | None:
    """The average number of cores other processes kept busy between two snapshots; None when unknown, or over less
    than `MIN_WINDOW_S` (CPU time is counted in ticks of 10 ms: a shorter window cannot tell one core from none)."""
    if before is None or after is None or after.wall - before.wall < MIN_WINDOW_S:
        return None
    foreign = (after.machine - before.machine) - (after.own - before.own)
    return max(0.0, foreign / (after.wall - before.wall))


def wait_budget(default: float = 120.0) -> float:
    """The seconds one timing may wait for the CPU: `$COMPRESSOR_TIMING_WAIT_S`, else `default`."""
    text = os.environ.get(WAIT_ENV)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise UserError(f"{WAIT_ENV}: expected seconds to wait for the CPU (a number >= 0; 0: never), got '{text}'")
    return value


@dataclass
class Quiet:
    """How timing treats other processes: a round beside more than `cores` of their busy cores (averaged over the
    round) is timed again once a `window_s` sample shows them below it: at most `max_retries` rounds again and
    `max_wait_s` of waiting in all for one timing (a benchmark round of many candidates lasts minutes), then it goes
    on and says so. `waited_s`, `loads` (others' cores in each contended round) and `contended` (rounds kept beside
    them) keep what happened."""

    cores: float = 0.25
    max_wait_s: float = field(default_factory=wait_budget)
    max_retries: int = 4
    window_s: float = 1.0
    waited_s: float = 0.0
    contended: int = 0
    loads: list[float] = field(default_factory=list)

    def calm(self, load: float | None) -> bool:
        """Whether a round timed beside `load` other cores stands (unknown load: it does)."""
        return load is None or load <= self.cores

    def retry(self) -> bool:
        """Whether to time a contended round again: retries left and, waiting, the CPU calm within the time left."""
        return len(self.loads) <= self.max_retries and self.max_wait_s > 0 and self.wait()

    def wait(self) -> bool:
        """Wait until others use at most `cores`, sampling `window_s` at a time; False once `max_wait_s` is spent."""
        while self.waited_s < self.max_wait_s:
            before = snapshot()
            time.sleep(self.window_s)
            self.waited_s += self.window_s
            if self.calm(others_cores(before, snapshot())):
                return True
        return False

    def summary(self, rounds: int) -> str | None:
        """A log line about the timing's neighbours, or None if every round ran alone."""
        if not self.loads:
            return None
        retimed = len(self.loads) - self.contended
        line = f"timing: other processes kept up to {max(self.loads):.1f} cores busy in {len(self.loads)} rounds"
        if retimed:
            line += f"; waited {self.waited_s:.0f} s for the CPU and timed {retimed} again"
        if self.contended:
            line += (
                f"; {self.contended} of {rounds} rounds still ran beside them: its figures may be off (time on a "
                "machine to yourself)"
            )
        return line
