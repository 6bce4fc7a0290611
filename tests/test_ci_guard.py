"""The CI guards themselves: bench-ci's committed baseline and labels, the atomic directory swap, the criteria
benchmark's override parsing and results merge. Nothing here times anything."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import bench_script as script

from compressor.core import atomic
from compressor.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ bench-ci baseline


def test_committed_baseline_is_valid_and_matches_what_bench_ci_measures(tmp_path: Path) -> None:
    """benchmarks/baseline_ci.json loads, was taken on the models, shapes, threads and evaluation data bench_ci
    builds now (else `make bench-ci` would exit 2), and passes against its own values."""
    from compressor.guard import baseline as regression
    from compressor.surgery.checkpoint import save_pruned

    ci = script("bench_ci")
    baseline = regression.load_baseline(ci.BASELINE)
    identity = baseline.identity
    assert identity["batch_sizes"] == ci.BATCH_SIZES and identity["seq_lens"] == [ci.SEQ_LEN]
    assert identity["threads"] == 1 and identity["candidates"] == ["onnx-fp32", "pytorch-original", "pytorch-pruned"]
    original, _ = ci.build_models()
    assert identity["reference"] == regression.fingerprint(save_pruned(original, tmp_path / "original"))
    reference = ci.bench.pytorch_candidate("pytorch-original", original, ci.SEQ_LEN)
    labelled = ci.labelled_by(reference, ci.synthetic_eval_batches())
    assert identity["eval_data"] == regression.batches_fingerprint(labelled)
    kinds = {m.kind for m in baseline.metrics.values()}
    assert kinds == {"ratio", "throughput", "quality"}
    assert baseline.metrics["accuracy:pytorch-pruned"].tolerance.absolute == 0.01
    assert baseline.metrics["throughput:pytorch-pruned:s128:b32"].tolerance.relative == 0.5
    same = {name: regression.Measured(m.kind, m.value, m.per_round) for name, m in baseline.metrics.items()}
    verdicts = regression.compare(baseline, same, same_cpu=True)
    assert regression.passed(verdicts) and {v.status for v in verdicts} == {"ok"}


def test_labelled_by_uses_the_reference_predictions() -> None:
    """The CI quality path's labels: the reference scores 1.0 on them and the batches keep their inputs."""
    import numpy as np
    import torch

    from compressor import bench

    ci = script("bench_ci")
    batches = ci.synthetic_eval_batches(n=8, batch=4)

    def predict(batch):  # deterministic stand-in model: class = parity of the first token
        first = batch["input_ids"][:, 0].numpy()
        return np.stack([(first % 2 == 0), (first % 2 == 1)], axis=1).astype(np.float32)

    ref = bench.Candidate("pytorch-original", predict, 0, None, "pytorch")
    labelled = ci.labelled_by(ref, batches)
    assert len(labelled) == 2 and all(
        torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(labelled, batches, strict=True)
    )
    assert all("labels" not in b for b in batches)
    q = bench.measure_quality([ref], labelled, "pytorch-original")
    assert q["has_labels"] and q["results"]["pytorch-original"]["accuracy"] == 1.0


# ------------------------------------------------------------------------------------------------ atomic directory


def fill(path: Path, text: str) -> None:
    (path / "weights.bin").write_text(text)
    (path / "config.json").write_text(json.dumps({"text": text}))


def content(path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(path.iterdir())}


def test_check_replaceable_one_rule(tmp_path: Path) -> None:
    """Absent, empty, or only the writer's own names: replaceable. Anything else: one line naming the option."""
    own = ("report.json", "report.md")
    assert atomic.check_replaceable(tmp_path / "absent", own, "x output") == tmp_path / "absent"
    (tmp_path / "empty").mkdir()
    atomic.check_replaceable(tmp_path / "empty", own, "x output")
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "report.json").write_text("{}")
    atomic.check_replaceable(earlier, own, "x output")
    (earlier / "notes.txt").write_text("mine")  # a user's file beside an earlier output: the whole dir is refused
    for name in ("a", "b", "c"):
        (earlier / name).mkdir()
    refused = r"^x output: '.*earlier' holds other files \(a, b, c, \.\.\.\); expected"
    with pytest.raises(UserError, match=refused) as err:
        atomic.check_replaceable(earlier, own, "x output")
    assert "\n" not in str(err.value)
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"^x output: '.*file' is a file; expected a directory$"):
        atomic.check_replaceable(tmp_path / "file", own, "x output")
    assert (earlier / "notes.txt").read_text() == "mine"


def test_directory_replaces_and_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with atomic.directory(out) as tmp:
        fill(tmp, "old")
    with atomic.directory(out) as tmp:
        fill(tmp, "new")
    assert content(out) == {"config.json": '{"text": "new"}', "weights.bin": "new"}
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_directory_error_while_filling_keeps_the_old(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with atomic.directory(out) as tmp:
        fill(tmp, "old")
    with pytest.raises(RuntimeError), atomic.directory(out) as tmp:
        fill(tmp, "half")
        raise RuntimeError("killed while writing")
    assert content(out)["weights.bin"] == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_directory_failed_rename_in_restores_the_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old one has been renamed aside when moving the new one in fails: it is put back, the new one removed."""
    out = tmp_path / "model"
    with atomic.directory(out) as tmp:
        fill(tmp, "old")
    real_rename = Path.rename

    def rename(self, target):
        if Path(target) == out and self != atomic.aside_path(out):  # only the new one's move in fails
            assert not out.exists() and atomic.aside_path(out).is_dir()  # the old one is aside, not deleted
            raise OSError("disk went away")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="disk went away"), atomic.directory(out) as tmp:
        fill(tmp, "new")
    monkeypatch.undo()
    assert content(out)["weights.bin"] == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_directory_killed_between_renames_recovers_the_old(tmp_path: Path) -> None:
    """A kill after the old one went aside and before the new one came in: the next call puts the old one back,
    and if that call fails too the old content is still there."""
    out = tmp_path / "model"
    with atomic.directory(out) as tmp:
        fill(tmp, "old")
    out.rename(atomic.aside_path(out))  # the state such a kill leaves (plus a stray temp dir)
    (tmp_path / ".model.tmp-stray").mkdir()
    with pytest.raises(RuntimeError), atomic.directory(out) as tmp:
        assert content(out)["weights.bin"] == "old"
        raise RuntimeError("fails again")
    assert content(out)["weights.bin"] == "old" and not atomic.aside_path(out).exists()
    with atomic.directory(out) as tmp:
        fill(tmp, "new")
    assert content(out)["weights.bin"] == "new" and not atomic.aside_path(out).exists()


def test_directory_killed_before_deleting_the_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill while deleting the old one: the new one is already complete; the next call clears the leftover."""
    out = tmp_path / "model"
    with atomic.directory(out) as tmp:
        fill(tmp, "old")
    real_rmtree = shutil.rmtree

    class Killed(BaseException):
        pass

    def rmtree(path, *args, **kwargs):
        if Path(path) == atomic.aside_path(out):
            raise Killed  # the process dies here
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(atomic.shutil, "rmtree", rmtree)
    with pytest.raises(Killed), atomic.directory(out) as tmp:
        fill(tmp, "new")
    monkeypatch.undo()
    assert content(out) == {"config.json": '{"text": "new"}', "weights.bin": "new"}
    assert atomic.aside_path(out).is_dir()
    atomic.recover(out)
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and content(out)["weights.bin"] == "new"


def test_directory_first_write_and_recover_noop(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "model"
    atomic.recover(out)  # nothing there: nothing to do
    with atomic.directory(out) as tmp:
        fill(tmp, "only")
    assert content(out)["weights.bin"] == "only" and oct(out.stat().st_mode & 0o777) == "0o755"
