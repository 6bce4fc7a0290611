"""The run's log (`compressor.pipeline.runlog`): what is logged before the run's directory is claimed (the
preflight's timings) is printed and held, then written at the top of the run.log that opens next, and only there."""

from __future__ import annotations

import logging

import pytest

from compressor.pipeline import runlog

log = logging.getLogger("compressor.pruning.latency.table")  # a stage's logger, as the preflight's timings use


def _lines(path) -> list[str]:
    return [line.split(" INFO ", 1)[1] for line in (path / runlog.RUN_LOG).read_text().splitlines()]


def test_what_is_logged_before_the_run_log_opens_is_written_at_its_top_and_only_there(tmp_path, capsys):
    runlog.open_run_log(tmp_path / "earlier", main=True)  # whatever an earlier test left held goes there
    runlog.hold(main=True)
    log.info("latency table: timing a shape")
    runlog.hold(main=True)  # a second hold (another repeat's preflight) keeps what the first held
    log.info("budget: the reference measured")
    runlog.open_run_log(tmp_path / "one", main=True)
    log.info("fine-tunes on cpu")
    assert _lines(tmp_path / "one") == ["latency table: timing a shape", "budget: the reference measured",
                                        "fine-tunes on cpu"]  # fmt: skip
    assert "latency table: timing a shape" in capsys.readouterr().err  # printed when it happened, once
    runlog.hold(main=True)  # the next repeat
    log.info("seed 1: running")
    runlog.open_run_log(tmp_path / "two", main=True)
    assert _lines(tmp_path / "two") == ["seed 1: running"]
    assert "seed 1: running" not in (tmp_path / "one" / runlog.RUN_LOG).read_text()


def test_a_helper_process_prints_nothing_and_writes_no_log(tmp_path, capsys):
    runlog.hold(main=False)
    log.info("latency table: timing a shape")
    runlog.open_run_log(tmp_path / "run", main=False)
    log.info("fine-tunes on cpu")
    assert not (tmp_path / "run").exists() and "fine-tunes" not in capsys.readouterr().err


def test_a_failed_preflights_lines_reach_no_later_run_log(tmp_path, capsys):
    """A preflight that fails (a bad recipe in `compressor.prune`, caught by the caller) drops what it held, after
    printing it; the next run in the same process starts its log with its own lines only."""
    runlog.open_run_log(tmp_path / "earlier", main=True)
    with pytest.raises(ValueError, match="out of reach"), runlog.held(main=True):
        log.info("latency table: timing a shape")
        raise ValueError("out of reach")
    assert "latency table: timing a shape" in capsys.readouterr().err
    with runlog.held(main=True):
        log.info("budget: the reference measured")
    runlog.open_run_log(tmp_path / "next", main=True)
    assert _lines(tmp_path / "next") == ["budget: the reference measured"]
