"""benchmarks/provenance.py: the commit a benchmark result names, "+dirty" only for changes to tracked files."""

from __future__ import annotations

import subprocess
import time

from conftest import bench_script

provenance = bench_script("provenance")


def _git(repo, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_commit_is_dirty_for_tracked_changes_only(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-qm", "first")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    assert provenance.commit() == head
    (tmp_path / "result.json").write_text("{}")  # a new result file is not a change to the measured code
    assert provenance.commit() == head
    (tmp_path / "a.txt").write_text("two\n")
    assert provenance.commit() == f"{head}+dirty"


def test_commit_outside_a_checkout_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert provenance.commit() is None


def test_measured_on_names_what_else_ran_and_the_seconds(monkeypatch):
    monkeypatch.setattr(provenance, "commit", lambda: "abc1234")
    fields = provenance.measured_on("", time.perf_counter() - 2.0)
    assert fields["commit"] == "abc1234" and fields["else_running"] == "not stated"
    assert fields["seconds"] >= 2.0 and {"cpu", "cpu_identity"} <= set(fields)
    assert "seconds" not in provenance.measured_on("a pytest run")
    assert provenance.measured_on("a pytest run")["else_running"] == "a pytest run"
