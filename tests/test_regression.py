"""Regression checks against a saved baseline: the file, the decision, the refusals, the outputs (the command line:
test_regression_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compressor.guard import baseline as regression
from compressor.guard import report as regression_report
from compressor.guard.baseline import Baseline, BaselineError, Measured, Metric


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


def exact_rounds(centre: float, sd: float, n: int = 10, seed: int = 0) -> list[float]:
    """Rounds whose logs have mean log(`centre`) and standard deviation `sd` exactly (geometric mean = centre)."""
    z = np.random.default_rng(seed).normal(size=n)
    return list(centre * np.exp(sd * (z - z.mean()) / z.std(ddof=1)))


def decide_rounds(was: list[float], now: list[float], direction: str = "higher", relative: float = 0.10):
    ref = metric("ratio", direction, value=regression._geomean(was), rounds=was, relative=relative)
    return regression.decide("m", ref, Measured("ratio", regression._geomean(now), now), 0.95)


@pytest.mark.parametrize("kind", ["ratio", "throughput"])
def test_per_round_noise_passes_and_a_15_percent_slowdown_fails(kind: str) -> None:
    ref = metric(kind, value=1.3)
    for seed in range(1, 11):  # 5% per-round noise, unchanged: never a false alarm
        assert regression.decide("m", ref, measured(kind, 1.3, seed), 0.95).status == "ok"
    slow = regression.decide("m", metric(kind, value=1.3, relative=0.10), measured(kind, 1.3 * 0.85), 0.95)
    assert slow.status == "REGRESSION" and slow.change == pytest.approx(-0.15, abs=0.04)
    assert slow.p_value < 0.05 and slow.low < slow.change < slow.high < 0
    assert slow.limit == pytest.approx(-0.10)


def test_the_estimate_decides_not_the_confidence_bound() -> None:
    """A true 14% slowdown measured with realistic 8% per-round noise: the estimate is beyond the 10% tolerance and
    significant, so it is flagged even though the interval reaches inside the tolerance (the old rule missed it)."""
    v = decide_rounds(exact_rounds(1.0, 0.08), exact_rounds(0.86, 0.08, seed=1))
    assert v.status == "REGRESSION" and v.change == pytest.approx(-0.14)
    assert v.high > v.limit  # part of the interval lies within the tolerance


@pytest.mark.parametrize(("direction", "centre", "status"), [("higher", 1.12, "better"), ("higher", 1.09, "ok"),
                                                         ("lower", 0.88, "better"), ("lower", 0.91, "ok")])  # fmt: skip
def test_better_is_a_change_beyond_the_relative_tolerance_in_the_good_direction(direction, centre, status) -> None:
    assert decide_rounds(exact_rounds(1.0, 0.02), exact_rounds(centre, 0.02, seed=1), direction).status == status


def test_significant_but_within_tolerance_is_ok() -> None:
    v = decide_rounds(exact_rounds(1.0, 0.01), exact_rounds(0.95, 0.01, seed=1))
    assert v.p_value < 1e-6 and v.change == pytest.approx(-0.05) and v.status == "ok"


def test_beyond_tolerance_but_not_significant_is_inconclusive_not_a_regression() -> None:
    """-11% with 17% per-round noise on both sides: each side resolves the tolerance alone, the difference is not
    significant (p ≈ 0.07), so it is not flagged, yet it fails the check as inconclusive (no silent pass)."""
    v = decide_rounds(exact_rounds(1.0, 0.17), exact_rounds(0.89, 0.17, seed=1))
    assert v.change == pytest.approx(-0.11) and 0.05 < v.p_value < 0.2
    assert v.status == "inconclusive" and "not significant" in v.note and not regression.passed([v])


def test_huge_noise_12_percent_slowdown_is_not_flagged_but_inconclusive() -> None:
    v = decide_rounds(exact_rounds(1.0, 0.03), exact_rounds(0.88, 0.5, seed=1))
    assert v.change == pytest.approx(-0.12) and v.p_value > 0.05 and v.status == "inconclusive"
    assert v.note == regression.NOISY_ADVICE and "raise --rounds" in v.note


def test_too_noisy_rounds_are_inconclusive_whatever_the_estimate() -> None:
    """A current run that cannot resolve its tolerance decides nothing, even when it looks unchanged or better."""
    for centre in (1.0, 1.3):
        v = decide_rounds(exact_rounds(1.0, 0.03), exact_rounds(centre, 0.4, seed=2))
        assert v.status == "inconclusive"
    assert decide_rounds(exact_rounds(1.0, 0.03), [0.7]).status == "inconclusive"  # one round: no spread known


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_per_round_direction_with_realistic_noise(direction: str) -> None:
    """15% down with 5% noise regresses when higher is better and is 'better' when lower is; 15% up the reverse."""
    was = exact_rounds(1.0, 0.05)
    down, up = (
        decide_rounds(was, exact_rounds(0.85, 0.05, seed=1), direction),
        decide_rounds(was, exact_rounds(1.15, 0.05, seed=1), direction),
    )
    bad, good = (down, up) if direction == "higher" else (up, down)
    assert bad.status == "REGRESSION" and bad.p_value < 0.05 and good.status == "better" and good.p_value > 0.95


def test_half_width_and_too_noisy_threshold() -> None:
    """The half-width is the one-sided t bound of the mean log; too noisy exactly when it exceeds the tolerance."""
    rounds = exact_rounds(1.0, 0.1)
    assert regression.half_width(rounds, 0.95) == pytest.approx(1.8331 * 0.1 / np.sqrt(10), rel=1e-4)
    assert regression.half_width([1.0], 0.95) == float("inf")
    edge = 1.8331 * 0.1 / np.sqrt(10)  # 5.8% in log units
    assert regression.too_noisy(rounds, 1 - np.exp(-edge) - 0.001, "higher", 0.95)
    assert not regression.too_noisy(rounds, 1 - np.exp(-edge) + 0.001, "higher", 0.95)
    assert not regression.too_noisy(rounds, np.exp(edge) - 1 + 0.001, "lower", 0.95)


def test_save_refuses_a_noisy_baseline_in_one_line(tmp_path: Path) -> None:
    quiet = {"kind": "ratio", "direction": "higher", "value": 1.0, "tolerance": {"relative": 0.1},
             "per_round": exact_rounds(1.0, 0.05)}  # fmt: skip
    data = {"format": regression.FORMAT, "identity": {}, "cpu_model": "cpu", "metrics": {"ratio:a": quiet}}
    assert regression.save_baseline(data, tmp_path / "ok.json").is_file()
    loud = dict(quiet, per_round=exact_rounds(1.0, 0.3))
    data["metrics"] |= {"ratio:b": loud, "throughput:c": dict(loud, kind="throughput")}
    with pytest.raises(BaselineError) as err:
        regression.save_baseline(data, tmp_path / "noisy.json")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--save-baseline: rounds too dispersed to resolve the tolerance of 2 metric(s) (")
    assert "ratio:b ±19% vs 10.0%, throughput:c ±19% vs 10.0%)" in message and "ratio:a" not in message
    assert message.endswith("; re-run on a quiet machine or raise --rounds")
    assert not (tmp_path / "noisy.json").exists()


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
    now["throughput:c:s16:b4"] = Measured("throughput", 1.0, [0.3, 3.0])  # too noisy, but not compared: skipped
    skipped = regression.compare(base, now, same_cpu=False)
    assert [v.status for v in skipped] == ["ok", "skipped"] and "not this one" in skipped[1].note
    assert regression.passed(skipped)


def test_ratios_on_the_cpus_own_kernels_are_skipped_on_another_cpu_and_compared_on_its_own() -> None:
    """A speed-up of ONNX Runtime (or of int8) over PyTorch is set by the CPU's kernels: on another CPU model it is
    skipped with the reason (a 20% drop there says nothing about the change), on the baseline's CPU it is decided;
    a PyTorch-vs-PyTorch ratio is decided everywhere."""
    names = ("ratio:onnx:s16:b4", "ratio:pruned:s16:b4")
    base = baseline_of(**{n: metric("ratio") for n in names})
    now = {n: measured("ratio", 0.7) for n in names}
    now[names[0]].cpu_bound = True
    other = regression.compare(base, now, same_cpu=False)
    assert [v.status for v in other] == ["skipped", "REGRESSION"]
    assert other[0].note == "runtime kernels differ by CPU: baseline CPU 'cpu' is not this one"
    assert [v.status for v in regression.compare(base, now, same_cpu=True)] == ["REGRESSION", "REGRESSION"]


def test_measured_metrics_mark_ratios_of_another_engine_or_of_int8_as_cpu_bound() -> None:
    rounds = {"seconds_per_round": [0.1, 0.1]}
    names = ("pytorch-original", "pytorch-pruned", "onnx-fp32", "pytorch-int8")
    result = {
        "reference": "pytorch-original",
        "summary": {
            "pytorch-original": {"kind": "pytorch"},
            "pytorch-pruned": {"kind": "pytorch"},
            "onnx-fp32": {"kind": "onnx"},
            "pytorch-int8": {"kind": "pytorch", "cpu_int8_features": "avx2"},
        },
        "throughput": {n: {"16": {"4": rounds}} for n in names},
        "speedups": {n: {"16": {"4": {"per_round": [1.5, 1.6]}}} for n in names},
    }
    bound = {k: m.cpu_bound for k, m in regression.measured_metrics(result).items() if k.startswith("ratio:")}
    assert bound == {"ratio:pytorch-pruned:s16:b4": False, "ratio:onnx-fp32:s16:b4": True,
                     "ratio:pytorch-int8:s16:b4": True}  # fmt: skip


def test_regression_table_names_was_now_tolerance_direction() -> None:
    base = baseline_of(**{"accuracy:c": metric("quality", value=0.83), "agreement:c": metric("quality")})
    verdicts = regression.compare(
        base, {"accuracy:c": Measured("quality", 0.80), "agreement:c": measured("quality", 1)}, True
    )
    md = regression_report.render_markdown(verdicts, "base.json", 0.95)
    assert md.startswith("## compressor bench: FAIL against `base.json`")
    regressed = md.split("### Regressed")[1].split("### All metrics")[0]
    assert "| `accuracy:c` | higher is better | 0.83 | 0.8 | -0.0300 | – | – | 0.01 | **REGRESSION** |" in regressed
    assert "agreement:c" not in regressed


def test_table_shows_estimate_interval_p_and_inconclusive_advice() -> None:
    was = exact_rounds(1.0, 0.05)
    base = baseline_of(**{"ratio:a": metric("ratio", rounds=was), "ratio:b": metric("ratio", rounds=was)})
    now = {"ratio:a": Measured("ratio", 0.8, exact_rounds(0.8, 0.05, seed=1)), "ratio:b": Measured("ratio", 1.0, [1.0])}
    verdicts = regression.compare(base, now, True)
    md = regression_report.render_markdown(verdicts, "b.json", 0.95)
    a, b = verdicts
    assert "| change | 90% interval | p (worse) | tolerance | status |" in md
    interval = f"[{100 * a.low:+.1f}%, {100 * a.high:+.1f}%]"
    assert (
        f"| `ratio:a` | higher is better | 1 | 0.8 | -20.0% | {interval} | {a.p_value:.2g} | 10.0% | **REGRESSION** |"
        in md
    )
    assert b.status == "inconclusive" and f"**inconclusive** ({regression.NOISY_ADVICE})" in md
    assert md.startswith("## compressor bench: FAIL") and "1 of 2 metrics regressed; 1 inconclusive" in md


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
