"""The CI guards themselves: bench-ci's baseline comparison, the atomic directory swap, the criteria benchmark's
override parsing and results merge. Nothing here times anything."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from functools import cache
from pathlib import Path

import pytest

from compressor import atomic

ROOT = Path(__file__).resolve().parents[1]


@cache
def script(name: str):
    """benchmarks/NAME.py imported as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_bench_script_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def entry(value: float, direction: str = "higher", **tolerance: float) -> dict:
    return {"value": value, "direction": direction, "tolerance": tolerance}


def verdicts(metrics: dict, baseline_metrics: dict) -> tuple[dict[str, str], bool]:
    """metric name → its verdict column from compare(), and the overall verdict."""
    lines, ok = script("bench_ci").compare(metrics, {"metrics": baseline_metrics})
    assert lines[0].split()[0] == "metric"
    return {line.split()[0]: line.split("  ")[-1].strip() for line in lines[1:]}, ok


# ------------------------------------------------------------------------------------------------ bench-ci compare


@pytest.mark.parametrize(
    ("value", "expected", "passes"),
    [
        (1.0, "ok", True),
        (0.81, "ok", True),  # 19% down: inside the 20% relative tolerance
        (0.79, "REGRESSION", False),
        (1.19, "ok", True),
        (1.21, "better (consider --update-baseline)", True),
    ],
)
def test_compare_relative_tolerance_higher(value: float, expected: str, passes: bool) -> None:
    shown, ok = verdicts({"speedup": value}, {"speedup": entry(1.0, relative=0.2)})
    assert shown == {"speedup": expected} and ok is passes


@pytest.mark.parametrize(
    ("value", "expected", "passes"),
    [(0.99, "ok", True), (0.985, "ok", True), (0.9799, "REGRESSION", False), (1.0, "ok", True)],
)
def test_compare_absolute_tolerance(value: float, expected: str, passes: bool) -> None:
    shown, ok = verdicts({"accuracy": value}, {"accuracy": entry(0.99, absolute=0.01)})
    assert shown == {"accuracy": expected} and ok is passes


def test_compare_zero_tolerance_is_exact() -> None:
    assert verdicts({"agree": 1.0}, {"agree": entry(1.0, absolute=0.0)})[1]
    assert verdicts({"agree": 0.998}, {"agree": entry(1.0, absolute=0.0)}) == ({"agree": "REGRESSION"}, False)


def test_compare_lower_is_better() -> None:
    baseline = {"latency_ratio": entry(0.5, "lower", relative=0.2)}  # limit 0.6, better below 0.4
    assert verdicts({"latency_ratio": 0.59}, baseline) == ({"latency_ratio": "ok"}, True)
    assert verdicts({"latency_ratio": 0.61}, baseline) == ({"latency_ratio": "REGRESSION"}, False)
    shown, ok = verdicts({"latency_ratio": 0.39}, baseline)
    assert ok and shown["latency_ratio"].startswith("better")
    # a drop of a lower-is-better metric far beyond the tolerance is not a regression
    assert verdicts({"latency_ratio": 0.1}, baseline)[1]


def test_compare_missing_metric_fails_and_extra_metric_is_reported() -> None:
    baseline = {"speedup": entry(1.3, relative=0.2), "agreement": entry(1.0, absolute=0.0)}
    shown, ok = verdicts({"speedup": 1.3, "accuracy_new": 0.5}, baseline)
    assert not ok
    assert shown == {"speedup": "ok", "agreement": "MISSING (fail)", "accuracy_new": "not in baseline"}


def test_compare_any_failure_fails_the_whole_check() -> None:
    baseline = {"a": entry(1.0, relative=0.2), "b": entry(1.0, relative=0.2)}
    assert verdicts({"a": 5.0, "b": 0.5}, baseline) == (
        {"a": "better (consider --update-baseline)", "b": "REGRESSION"},
        False,
    )


@pytest.mark.parametrize("direction", ["up", "Higher", None, ""])
def test_compare_rejects_bad_direction_naming_the_metric(direction) -> None:
    ci = script("bench_ci")
    bad = {"value": 1.0, "tolerance": {"relative": 0.1}} | ({} if direction is None else {"direction": direction})
    baseline = {"metrics": {"fine": entry(1.0, relative=0.1), "speedup_b32": bad}}
    with pytest.raises(ValueError, match=r"'speedup_b32'.*direction"):
        ci.compare({"fine": 1.0, "speedup_b32": 1.0}, baseline)
    with pytest.raises(ValueError, match="'speedup_b32'"):
        ci.check_baseline(baseline)


def test_check_baseline_rejects_unknown_tolerance_and_non_numbers() -> None:
    ci = script("bench_ci")
    with pytest.raises(ValueError, match=r"'x'.*unknown tolerance \['relativ'\]"):
        ci.check_baseline({"metrics": {"x": entry(1.0, relativ=0.2)}})
    with pytest.raises(ValueError, match="'x'.*numbers"):
        ci.check_baseline({"metrics": {"x": {"value": "1.0", "direction": "higher", "tolerance": {}}}})
    with pytest.raises(ValueError, match="metrics"):
        ci.check_baseline({"format": 1})


def test_committed_baseline_is_valid_and_covers_every_metric() -> None:
    """The committed baseline names a direction for every metric, includes the quality figure, and passes
    against its own values; a new baseline round-trips through compare."""
    ci = script("bench_ci")
    baseline = json.loads(ci.BASELINE.read_text())
    ci.check_baseline(baseline)
    assert set(baseline["metrics"]) == set(ci.TOLERANCES)
    quality = baseline["metrics"]["accuracy_pruned"]
    assert quality["direction"] == "higher" and quality["tolerance"] == {"absolute": 0.01}
    values = {name: ref["value"] for name, ref in baseline["metrics"].items()}
    lines, ok = ci.compare(values, baseline)
    assert ok and all(line.endswith("ok") for line in lines[1:])
    context = {"flop_ideal_speedup": 1.38, "measured_on": {}, "threads": 1}
    fresh = ci.new_baseline(values, context)
    ci.check_baseline(fresh)
    assert fresh["threads"] == 1 and ci.compare(values, fresh)[1]


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


# ------------------------------------------------------------------------------------------------ criteria benchmark


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.05", 0.05),
        ("1e-3", 1e-3),
        ("150", 150),
        ("-2", -2),
        ("true", True),
        ("False", False),
        ("layer", "layer"),
        ("", ""),
    ],
)
def test_criteria_override_values_are_typed(text: str, value) -> None:
    parsed = script("criteria").parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_criteria_spec_applies_typed_overrides() -> None:
    bench_criteria = script("criteria")
    name, params = bench_criteria.parse_spec("l0:lr=0.05,steps=20,hard=true")
    assert name == "l0" and params == {"steps": 20, "lr": 0.05, "hard": True}
    assert type(params["steps"]) is int
    with pytest.raises(SystemExit, match="not key=value"):
        bench_criteria.parse_spec("l0:lr")


def test_criteria_merge_refuses_other_settings_naming_them() -> None:
    bench_criteria = script("criteria")
    settings = {"model": "/m", "eval_examples": 400, "score_examples": 256, "max_length": 64, "threads": 1}
    earlier = {**settings, "criteria": {"taylor": {"accuracy": [0.9]}}}
    assert bench_criteria.merge_previous(earlier, settings) == earlier["criteria"]
    assert bench_criteria.merge_previous({}, settings) == {}
    # a setting the older file did not record is not checked
    assert bench_criteria.merge_previous(earlier, {**settings, "train_batch": 8}) == earlier["criteria"]
    with pytest.raises(ValueError, match=r"eval_examples 400 there, 200 now; max_length 64 there, 128 now"):
        bench_criteria.merge_previous(earlier, {**settings, "eval_examples": 200, "max_length": 128})
    # an empty earlier file has nothing to mislabel
    assert bench_criteria.merge_previous({**settings, "max_length": 32, "criteria": {}}, settings) == {}
