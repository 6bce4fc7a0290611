"""Timing beside other processes: how much of the CPU they took during a round, read from /proc/stat against our own
CPU time, and a round they crowded timed again once they are gone, within limits, and said in the log."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compressor.core import contention, timing
from compressor.core.contention import Quiet, Snapshot, others_cores, snapshot, wait_budget
from compressor.core.errors import UserError
from compressor.pruning.latency.probe import timed_rounds

STAT = """cpu  500 0 100 900 0 0 0 0 0 0
cpu0 100 0 50 400 10 0 0 0 0 0
cpu1 400 0 50 500 0 5 5 40 30 0

intr 1 2 3
"""


def test_snapshot_counts_the_busy_time_of_our_cpus_only(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    both, one = snapshot(stat, {0, 1}), snapshot(stat, {1})
    hz = os.sysconf("SC_CLK_TCK")
    # user + nice + system + irq + softirq + steal: idle, iowait and guest (already in user) are not busy
    assert both.machine == pytest.approx((150 + 500) / hz) and one.machine == pytest.approx(500 / hz)
    assert snapshot(tmp_path / "absent") is None
    (tmp_path / "other").write_text("intr 1 2\n")
    (tmp_path / "garbled").write_text("cpu0 12 x 3\n")
    assert snapshot(tmp_path / "other") is None and snapshot(tmp_path / "garbled") is None


def test_others_cores_is_the_machines_busy_time_beside_ours() -> None:
    before = Snapshot(wall=10.0, machine=100.0, own=5.0)
    assert others_cores(before, Snapshot(wall=12.0, machine=104.0, own=7.0)) == pytest.approx(1.0)
    assert others_cores(before, Snapshot(wall=12.0, machine=104.0, own=9.0)) == 0.0
    assert others_cores(before, Snapshot(wall=10.2, machine=104.0, own=5.0)) is None, "too short to tell"
    assert others_cores(None, before) is None


def fake_machine(monkeypatch, loads: list[float]) -> None:
    """Rounds see `loads` in turn (then calm); waiting costs nothing."""
    seen = iter(loads)
    monkeypatch.setattr(timing, "others_cores", lambda before, after: next(seen, 0.0))
    monkeypatch.setattr(Quiet, "wait", lambda self: True)


def test_a_round_crowded_by_others_is_timed_again(monkeypatch, caplog) -> None:
    fake_machine(monkeypatch, [0.0, 1.0, 0.1])
    made: list[str] = []
    calls = {"a": lambda: made.append("a"), "b": lambda: made.append("b")}
    quiet = Quiet(max_wait_s=10)
    with caplog.at_level(logging.INFO, logger="compressor"):
        per_round = timed_rounds(calls, 2, 0.0, min_calls=1, warmup=0, quiet=quiet)
    assert {k: len(v) for k, v in per_round.items()} == {"a": 2, "b": 2}, (
        "one figure per round, the crowded one replaced"
    )
    assert made == ["a", "b", "b", "a", "b", "a"], "round 2 (rotated) timed twice"
    assert quiet.loads == [1.0] and quiet.contended == 0
    assert "kept 1.0 cores busy during a round; waiting for the CPU" in caplog.text
    assert "kept up to 1.0 cores busy in 1 rounds; waited 0 s for the CPU and timed 1 again" in caplog.text
    assert "may be off" not in caplog.text


def test_timing_gives_up_on_a_busy_machine_within_its_limits(monkeypatch, caplog) -> None:
    fake_machine(monkeypatch, [2.0] * 100)
    calls = {"a": lambda: None}
    quiet = Quiet(max_wait_s=10, max_retries=2)
    with caplog.at_level(logging.INFO, logger="compressor"):
        per_round = timed_rounds(calls, 3, 0.0, min_calls=1, warmup=0, quiet=quiet)
    assert len(per_round["a"]) == 3
    assert len(quiet.loads) == 5 and quiet.contended == 3, "two retries in all, then every round kept and counted"
    assert "timed 2 again; 3 of 3 rounds still ran beside them: its figures may be off" in caplog.text


def test_no_waiting_when_the_budget_is_zero(monkeypatch, caplog) -> None:
    monkeypatch.setenv(contention.WAIT_ENV, "0")
    monkeypatch.setattr(timing, "others_cores", lambda before, after: 1.5)
    waited = []
    monkeypatch.setattr(Quiet, "wait", lambda self: waited.append(1) or True)
    quiet = Quiet()
    with caplog.at_level(logging.INFO, logger="compressor"):
        timed_rounds({"a": lambda: None}, 2, 0.0, min_calls=1, warmup=0, quiet=quiet)
    assert quiet.max_wait_s == 0 and not waited and quiet.contended == 2
    assert "not waiting ($COMPRESSOR_TIMING_WAIT_S is 0)" in caplog.text and "timed" not in caplog.text


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_wait_budget_is_one_line(monkeypatch, value) -> None:
    monkeypatch.setenv(contention.WAIT_ENV, value)
    with pytest.raises(UserError, match=rf"COMPRESSOR_TIMING_WAIT_S: expected seconds .* got '{value}'") as err:
        wait_budget()
    assert "\n" not in str(err.value)


@pytest.mark.skipif(snapshot() is None, reason="needs Linux /proc/stat")
def test_a_busy_process_beside_a_round_is_seen() -> None:
    """The real thing: a process spinning on a core while we time a call that sleeps (takes no CPU itself)."""
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 5: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        quiet = Quiet(max_wait_s=0)
        timed_rounds({"nap": lambda: time.sleep(0.2)}, 1, 0.8, min_calls=1, warmup=0, quiet=quiet)
    finally:
        spin.kill()
        spin.wait()
    assert quiet.contended == 1 and quiet.loads and quiet.loads[0] > 0.5
