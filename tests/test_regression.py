"""Regression checks against a saved baseline: the file, the decision, the refusals, the outputs, the command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from compressor import regression, regression_report
from compressor.regression import Baseline, BaselineError, Measured, Metric

FAST = {"rounds": 3, "warmup": 1, "min_time_s": 0.005, "batch_sizes": [1, 4], "seq_lens": [16], "threads": 1}


def noisy(centre: float, n: int = 10, spread: float = 0.05, seed: int = 0) -> list[float]:
    """Per-round values around `centre` with multiplicative noise (log-normal, sd `spread`)."""
    return list(centre * np.exp(np.random.default_rng(seed).normal(0, spread, n)))


def metric(kind: str, direction: str = "higher", value: float = 1.0, rounds=None, **tolerance) -> Metric:
    tolerance = tolerance or regression.DEFAULT_TOLERANCES[kind]
    per_round = rounds if rounds is not None else (noisy(value) if kind in regression.PER_ROUND_KINDS else None)
    return Metric(kind=kind, direction=direction, value=value, tolerance=tolerance, per_round=per_round)


def measured(kind: str, value: float, seed: int = 1) -> Measured:
    if kind in regression.PER_ROUND_KINDS:
        rounds = noisy(value, seed=seed)
        return Measured(kind, regression._geomean(rounds), rounds)
    return Measured(kind, value)


# ------------------------------------------------------------------------------------------------ decision


@pytest.mark.parametrize("kind", ["ratio", "throughput"])
def test_per_round_noise_passes_and_a_15_percent_slowdown_fails(kind: str) -> None:
    ref = metric(kind, value=1.3)
    for seed in range(1, 11):  # 5% per-round noise, unchanged: never a false alarm
        assert regression.decide("m", ref, measured(kind, 1.3, seed), 0.95).status == "ok"
    slow = regression.decide("m", metric("ratio", value=1.3), measured("ratio", 1.3 * 0.85), 0.95)
    assert slow.status == "REGRESSION" and slow.change == pytest.approx(-0.15, abs=0.04)
    assert slow.bound is not None and slow.bound < slow.limit == pytest.approx(-0.08)


def test_per_round_decision_uses_the_confidence_bound_not_the_point() -> None:
    """A mean 10% below the baseline (beyond the 8% tolerance) but with wide noise is not a regression; the same
    mean with tight rounds is."""
    ref = metric("ratio", value=1.0, rounds=noisy(1.0, spread=0.01))
    wide = Measured("ratio", 0.9, noisy(0.9, n=4, spread=0.3, seed=3))
    tight = Measured("ratio", 0.9, noisy(0.9, spread=0.01, seed=3))
    assert regression.decide("m", ref, wide, 0.95).status == "ok"
    assert regression.decide("m", ref, tight, 0.95).status == "REGRESSION"


@pytest.mark.parametrize("kind", ["ratio", "throughput", "quality"])
def test_direction_is_honoured_for_every_kind(kind: str) -> None:
    """Down 20% is a regression when higher is better and an improvement when lower is; up 20% the reverse."""
    tol = {"relative": 0.08}
    down, up = measured(kind, 0.8), measured(kind, 1.2)
    assert regression.decide("m", metric(kind, "higher", **tol), down, 0.95).status == "REGRESSION"
    assert regression.decide("m", metric(kind, "higher", **tol), up, 0.95).status == "better"
    assert regression.decide("m", metric(kind, "lower", **tol), down, 0.95).status == "better"
    assert regression.decide("m", metric(kind, "lower", **tol), up, 0.95).status == "REGRESSION"


def test_quality_absolute_tolerance_and_two_point_drop() -> None:
    ref = metric("quality", value=0.83, absolute=0.01)
    assert regression.decide("accuracy:c", ref, Measured("quality", 0.822), 0.95).status == "ok"
    assert regression.decide("accuracy:c", ref, Measured("quality", 0.82), 0.95).status == "ok"  # exactly 1 point
    drop = regression.decide("accuracy:c", ref, Measured("quality", 0.81), 0.95)
    assert drop.status == "REGRESSION" and drop.change == pytest.approx(-0.02) and drop.tolerance == "0.01"


def baseline_of(**metrics: Metric) -> Baseline:
    return Baseline(format=regression.FORMAT, identity={}, cpu_model="cpu", metrics=metrics)


def test_compare_refuses_a_different_metric_set_and_skips_throughput_on_another_cpu() -> None:
    base = baseline_of(**{"ratio:c:s16:b4": metric("ratio"), "throughput:c:s16:b4": metric("throughput")})
    now = {"ratio:c:s16:b4": measured("ratio", 1.0), "throughput:c:s16:b4": measured("throughput", 0.5)}
    with pytest.raises(BaselineError, match=r"missing now \['throughput:c:s16:b4'\]"):
        regression.compare(base, {"ratio:c:s16:b4": now["ratio:c:s16:b4"]}, same_cpu=True)
    assert [v.status for v in regression.compare(base, now, same_cpu=True)] == ["ok", "REGRESSION"]
    skipped = regression.compare(base, now, same_cpu=False)
    assert [v.status for v in skipped] == ["ok", "skipped"] and "not this one" in skipped[1].note
    assert regression.passed(skipped)


def test_regression_table_names_was_now_tolerance_direction() -> None:
    base = baseline_of(**{"accuracy:c": metric("quality", value=0.83), "agreement:c": metric("quality")})
    verdicts = regression.compare(
        base, {"accuracy:c": Measured("quality", 0.80), "agreement:c": measured("quality", 1)}, True
    )
    md = regression_report.render_markdown(verdicts, "base.json", 0.95)
    assert md.startswith("## compressor bench: FAIL against `base.json`")
    regressed = md.split("### Regressed")[1].split("### All metrics")[0]
    assert "| `accuracy:c` | higher is better | 0.83 | 0.8 | -0.0300 | – | 0.01 | **REGRESSION** |" in regressed
    assert "agreement:c" not in regressed


def test_outputs_and_github_step_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base = baseline_of(**{"ratio:c:s16:b4": metric("ratio")})
    verdicts = regression.compare(base, {"ratio:c:s16:b4": measured("ratio", 0.7)}, True)
    md = regression_report.render_markdown(verdicts, "b.json", 0.95)
    paths = regression_report.write_outputs(verdicts, md, tmp_path / "out")
    assert [p.name for p in paths] == list(regression_report.REGRESSION_FILES) and all(p.is_file() for p in paths)
    assert summary.read_text() == "earlier step\n" + md + "\n"
    payload = json.loads((tmp_path / "out" / "regression.json").read_text())
    assert payload["passed"] is False and payload["verdicts"][0]["status"] == "REGRESSION"


# ------------------------------------------------------------------------------------------------ baseline file


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b["metrics"]["m"].update(direction="up"), r"metrics\.m\.direction"),
        (lambda b: b["metrics"]["m"].update(tolerance={"relativ": 0.1}), r"metrics\.m\.tolerance\.relativ"),
        (lambda b: b["metrics"]["m"].update(tolerance={"absolute": 0.1}), "expected relative for a ratio metric"),
        (lambda b: b["metrics"]["m"].pop("per_round"), "per_round: expected positive per-round values"),
        (lambda b: b.update(format="other/9"), "format"),
        (lambda b: b.update(metrics={}), "metrics"),
    ],
)
def test_invalid_baseline_is_one_line_naming_the_field(tmp_path: Path, edit, message: str) -> None:
    data = {
        "format": regression.FORMAT,
        "identity": {},
        "cpu_model": "cpu",
        "metrics": {"m": {"kind": "ratio", "direction": "higher", "value": 1.0, "tolerance": {"relative": 0.1},
                          "per_round": [1.0, 1.1]}},
    }  # fmt: skip
    edit(data)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=message) as err:
        regression.load_baseline(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_unreadable_baseline(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="not found"):
        regression.load_baseline(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(BaselineError, match="not a readable JSON file"):
        regression.load_baseline(tmp_path / "bad.json")


def test_identity_mismatch_names_every_difference() -> None:
    base = baseline_of(m=metric("quality"))
    base.identity = {"threads": 1, "seq_lens": [64], "reference": "abc"}
    regression.check_identity(base, dict(base.identity))
    with pytest.raises(BaselineError, match=r"seq_lens \[64\] there, \[128\] now; threads 1 there, 2 now"):
        regression.check_identity(base, {"threads": 2, "seq_lens": [128], "reference": "abc"})


def test_fingerprint_changes_with_the_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "README.md").write_text("not part of the model")
    first = regression.fingerprint(tmp_path)
    (tmp_path / "README.md").write_text("edited")
    assert regression.fingerprint(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"weightz")
    assert regression.fingerprint(tmp_path) != first


# ------------------------------------------------------------------------------------------------ command line


def _cli(*args: str):
    from compressor.cli import app

    return CliRunner().invoke(app, ["bench", *args])


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir, tiny_csv) -> tuple[Path, Path, Path]:
    """(model dir, recipe, saved baseline) of a tiny model checked against itself."""
    tmp = tmp_path_factory.mktemp("regression")
    recipe = tmp / "r.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"source": str(tiny_csv), "max_length": 16}, "bench": FAST}))
    base = tmp / "baseline.json"
    res = _cli("--reference", str(tiny_model_dir), "--candidate", str(tiny_model_dir), "--recipe", str(recipe),
               "--out", str(tmp / "first"), "--save-baseline", str(base))  # fmt: skip
    assert res.exit_code == 0, res.output
    return tiny_model_dir, recipe, base


def check(setup, out: Path, *extra: str, baseline: Path | None = None):
    model, recipe, base = setup
    return _cli("--reference", str(model), "--candidate", str(model), "--recipe", str(recipe), "--out", str(out),
                "--baseline", str(baseline or base), *extra)  # fmt: skip


def test_cli_baseline_round_trip(setup) -> None:
    model, _, base = setup
    loaded = regression.load_baseline(base)
    assert set(loaded.metrics) == {
        "ratio:pytorch-candidate:s16:b1", "ratio:pytorch-candidate:s16:b4",
        "throughput:pytorch-reference:s16:b1", "throughput:pytorch-reference:s16:b4",
        "throughput:pytorch-candidate:s16:b1", "throughput:pytorch-candidate:s16:b4",
        "agreement:pytorch-candidate", "accuracy:pytorch-reference", "accuracy:pytorch-candidate",
    }  # fmt: skip
    assert loaded.identity["reference"] == regression.fingerprint(model)
    assert loaded.identity["batch_sizes"] == [1, 4] and loaded.identity["threads"] == 1
    assert loaded.metrics["agreement:pytorch-candidate"].value == 1.0
    ratio = loaded.metrics["ratio:pytorch-candidate:s16:b4"]
    assert len(ratio.per_round) == 3 and ratio.tolerance.relative == 0.08
    assert json.loads(base.read_text()) == json.loads(json.dumps(loaded.model_dump(exclude_none=True)))


def test_cli_quality_regression_fails_with_the_table(setup, tmp_path: Path) -> None:
    """The baseline claims 5 points more accuracy than the model has: exit 1, the metric named in the table,
    whose summary also lands in $GITHUB_STEP_SUMMARY and the output directory."""
    data = json.loads(setup[2].read_text())
    data["metrics"]["accuracy:pytorch-candidate"]["value"] += 0.05
    for m in data["metrics"].values():  # no timing metric may decide this test on a noisy machine
        if m["kind"] != "quality":
            m["tolerance"] = {"relative": 0.99}
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    summary = tmp_path / "summary.md"
    res = CliRunner(env={"GITHUB_STEP_SUMMARY": str(summary)}).invoke(
        __import__("compressor.cli", fromlist=["app"]).app,
        ["bench", "--reference", str(setup[0]), "--candidate", str(setup[0]), "--recipe", str(setup[1]),
         "--out", str(tmp_path / "out"), "--baseline", str(edited)],
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    regressed = res.output.split("### Regressed")[1].split("### All metrics")[0]
    assert "`accuracy:pytorch-candidate`" in regressed and "**REGRESSION**" in regressed
    assert "accuracy:pytorch-reference" not in regressed
    assert "FAIL" in summary.read_text() and (tmp_path / "out" / "regression.png").is_file()
    assert (tmp_path / "out" / "report.json").is_file()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--batch-sizes", "1,8"], "batch_sizes [1, 4] there, [1, 8] now"),
        (["--seq-lens", "8"], "seq_lens [16] there, [8] now"),
        (["--threads", "2"], "threads 1 there, 2 now"),
        (["--no-quality"], "eval_data"),
        (["--eval-examples", "20"], "eval_data"),
    ],
)
def test_cli_mismatch_is_exit_2_in_one_line(setup, tmp_path: Path, extra: list[str], message: str) -> None:
    res = check(setup, tmp_path / "out", *extra)
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything was timed or written


def test_cli_other_reference_and_runtime_are_refused(setup, tmp_path: Path) -> None:
    data = json.loads(setup[2].read_text())
    data["identity"]["runtime"]["torch"] = "0.0.1"
    data["identity"]["reference"] = "0" * 16
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    res = check(setup, tmp_path / "out", baseline=edited)
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "reference '0000000000000000' there" in res.output and "'torch': '0.0.1'" in res.output


def test_cli_refuses_both_baseline_options_and_missing_model(setup, tmp_path: Path) -> None:
    res = check(setup, tmp_path / "out", "--save-baseline", str(tmp_path / "x.json"))
    assert res.exit_code == 2 and "--save-baseline/--baseline: expected one of them" in res.output
    res = _cli("--reference", str(tmp_path), "--candidate", str(setup[0]), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "--reference: " in res.output and "config.json" in res.output
    res = _cli("--candidate", str(setup[0]), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "--reference/--original: expected exactly one" in res.output
