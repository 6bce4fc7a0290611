"""The report's recommendation: `bench.frontier.pick` on the run's frontier (chosen on validation, test reported),
with why each faster choice was passed over."""

from __future__ import annotations

import pytest

from compressor.bench.frontier import pick
from compressor.core.candidates import CandidateName
from compressor.recipe import RecipeError, parse_recipe
from compressor.report.recommendation import _recommendation_line, recommendation
from compressor.report.summary import _budget_lines


def _row(name: str, speed: float, acc: float, val: float | None = None, rejected: bool = False) -> dict:
    """A frontier row of a one-target run (`bench.frontier.frontier`'s keys); the original is at 85% on both
    splits, `val` defaults to the test accuracy `acc` (None: a row from before the bench scored validation)."""
    cid = CandidateName.parse(name)
    path = None if name == "pytorch-original" else f"{cid.model}/{cid.runtime}"
    return {"name": name, "model": cid.model, "role": cid.kind, "runtime": cid.runtime, "path": path,
            "rejected": rejected, "speedup": speed, "speedup_by_batch": {"32": speed}, "batch": 32, "seq_len": 64,
            "accuracy": acc, "drop_points": 100 * (0.85 - acc), "val_accuracy": val,
            "val_drop_points": None if val is None else 100 * (0.85 - val), "mcnemar_p": 0.5}  # fmt: skip


def _report(accuracies: dict[str, float], max_drop: float | None = 0.01, rejected: tuple[str, ...] = ()) -> dict:
    """A one-target report whose frontier has the original at 85% and the given variants (faster in the order
    given, from 2x), at the same accuracy on validation and test; the names in `rejected` failed their int8 gate."""
    frontier = [_row("pytorch-original", 1.0, 0.85, 0.85)]
    frontier += [_row(name, float(speed), acc, acc, name in rejected)
                 for speed, (name, acc) in enumerate(accuracies.items(), start=2)]  # fmt: skip
    export = {name.removeprefix("onnx-"): {"status": "rejected" if name in rejected else "passed"}
              for name in accuracies if name.startswith("onnx-")}  # fmt: skip
    return {"bench": {"max_drop": max_drop}, "frontier": frontier, "export": export, "original": {"test": {}}}


def _by_name(report: dict) -> dict[str, dict]:
    return {row["name"]: row for row in report["frontier"]}


def test_the_fastest_variant_within_the_gate_is_recommended() -> None:
    # onnx-int8 is fastest but 3 points down; onnx-fp32 loses 0.5 points and is next fastest.
    report = _report({"pytorch-pruned": 0.845, "onnx-fp32": 0.845, "onnx-int8": 0.82})
    rec = recommendation(report)
    assert rec["variant"] == rec["name"] == "onnx-fp32" and rec["speedup"] == 3.0 and rec["max_drop"] == 0.01
    line = _recommendation_line(rec)
    assert "**Recommendation: `onnx-fp32`**" in line and "within 1.00 validation points" in line
    assert "(chosen on validation; test reported)" in line and "`compressor pick <run dir> --max-drop 1`" in line


def test_the_recommendation_is_the_pick_and_reads_validation_not_test() -> None:
    """onnx-int8 is 3 points down on test but within the gate on validation, onnx-fp32 the other way round: the
    recommendation is `bench.frontier.pick`'s choice (the call `compressor pick` makes), onnx-int8, and it reports
    that variant's test accuracy. A frontier from before the bench scored validation recommends nothing, saying so."""
    report = _report({"pytorch-pruned": 0.845, "onnx-fp32": 0.845, "onnx-int8": 0.82})
    rows = _by_name(report)
    rows["onnx-int8"] |= {"val_accuracy": 0.845, "val_drop_points": 0.5}
    rows["onnx-fp32"] |= {"accuracy": 0.85, "val_accuracy": 0.80, "val_drop_points": 5.0}
    rec = recommendation(report)
    assert rec["variant"] == "onnx-int8" and rec["accuracy"] == 0.82 and rec["chosen_on"] == "validation"
    assert rec["drop_points"] == pytest.approx(3.0), "the test drop is reported for the choice"
    assert rec["name"] == pick(report["frontier"], 1.0)["name"]
    for row in report["frontier"]:
        row |= {"val_accuracy": None, "val_drop_points": None}
    old = recommendation(report)
    assert old["variant"] is None and "no validation accuracy was measured (rerun the bench)" in old["reason"]
    assert "its validation accuracy was not measured" in old["not_recommended"][0]["reason"]


def test_a_recommendation_stored_by_an_older_compressor_renders_as_chosen_on_test() -> None:
    old = {"variant": "onnx-fp32", "speedup": 3.0, "batch": 32, "seq_len": 64, "accuracy": 0.845, "max_drop": 0.01,
           "rejected": [], "not_recommended": []}  # fmt: skip
    assert "within 1.00 test points of the original (chosen on test; test reported)" in _recommendation_line(old)


def test_the_gate_is_inclusive_and_the_int8_gate_still_applies() -> None:
    report = _report({"pytorch-pruned": 0.84, "onnx-int8": 0.85}, rejected=("onnx-int8",))
    rec = recommendation(report)
    assert rec["variant"] == "pytorch-pruned" and rec["rejected"] == ["onnx-int8"]  # exactly 1 point down passes


def test_no_variant_accurate_enough_is_said_in_one_line() -> None:
    report = _report({"pytorch-pruned": 0.577, "onnx-int8": 0.571})
    rec = recommendation(report)
    assert rec["variant"] is None
    assert rec["reason"] == (
        "no member, reference or exported original is within 1.00 validation points of the original's 85.00% "
        "(bench.max_drop 0.01); the best is pytorch-pruned at 57.70%"
    )
    first, *why_not = _recommendation_line(recommendation(report)).splitlines()
    assert first.startswith("**Recommendation: none**: no member, reference or exported original")
    assert why_not == [
        "- not recommended: onnx-int8: 3.00× but 27.90 points below the original on validation; the gate allows 1.00 "
        "(bench.max_drop).",
        "- not recommended: pytorch-pruned: 2.00× but 27.30 points below the original on validation; the gate allows "
        "1.00 (bench.max_drop).",
    ]


def test_each_faster_variant_passed_over_says_why_in_one_line() -> None:
    # The fresh AVX2 machine's case: int8 fastest but 1.02 points down; fp32 recommended.
    report = _report({"pytorch-pruned": 0.85, "onnx-fp32": 0.8495, "onnx-int8": 0.8398, "onnx-int8_static": 0.85},
                     rejected=("onnx-int8_static",))  # fmt: skip
    _by_name(report)["onnx-int8"]["speedup"] = 1.89
    report["export"]["int8_static"]["gate"] = {"drop": 0.0094, "max_drop": 0.008, "agreement_with_fp32": 0.985,
                                               "min_agreement": 0.99}  # fmt: skip
    rec = recommendation(report)
    assert rec["variant"] == "onnx-fp32" and rec["rejected"] == ["onnx-int8_static"]
    assert [r["reason"] for r in rec["not_recommended"]] == [
        "onnx-int8_static: 5.00× but 0.94 validation points below its fp32 graph; its int8 gate allows 0.80 and "
        "agrees with its fp32 graph on 98.50% of validation predictions; its int8 gate asks 99.00%",
    ]  # int8 at 1.89× is slower than fp32's 3×: nothing to explain
    _by_name(report)["onnx-int8"]["speedup"] = 4.5
    reasons = [r["reason"] for r in recommendation(report)["not_recommended"]]
    assert reasons[1] == (
        "onnx-int8: 4.50× but 1.02 points below the original on validation; the gate allows 1.00 (bench.max_drop)"
    )
    lines = _recommendation_line(recommendation(report)).splitlines()
    assert lines[0].startswith("**Recommendation: `onnx-fp32`**") and len(lines) == 3
    assert lines[2] == f"- not recommended: {reasons[1]}."


def test_the_quantized_original_is_recommended_when_it_wins_and_says_so() -> None:
    """A one-target run's recommendation is the pick: the original's own int8, faster than every pruned variant
    within the gate, is recommended, and the line says it is the original, not pruned."""
    report = _report({"pytorch-pruned": 0.85, "onnx-fp32": 0.85})
    report["frontier"].append(_row("onnx-int8-original", 4.0, 0.848, 0.848))
    rec = recommendation(report)
    assert rec["variant"] == "onnx-int8-original" and rec["role"] == "original"
    assert "**the original on onnx-int8, not pruned**" in _recommendation_line(rec)


def test_the_report_has_a_stage_time_table() -> None:
    from compressor.report.summary import _timings_table

    rows = _timings_table({"base fine-tune": 300.0, "pruning steps": 200.0, "bench": 100.0}, 600.0)
    assert rows[2:] == ["| base fine-tune | 300 | 50% |", "| pruning steps | 200 | 33% |", "| bench | 100 | 17% |"]


def test_a_null_gate_recommends_the_fastest() -> None:
    report = _report({"pytorch-pruned": 0.577, "onnx-int8": 0.571}, max_drop=None)
    rec = recommendation(report)
    assert rec["variant"] == "onnx-int8" and "within" not in _recommendation_line(rec)
    assert "--max-drop none" in _recommendation_line(rec)
    assert recommendation({**report, "frontier": report["frontier"][:1]}) is None, "the PyTorch original alone"


def test_max_drop_parses_with_a_default_and_names_the_field() -> None:
    assert parse_recipe({}).bench.max_drop == 0.01
    assert parse_recipe({"bench": {"max_drop": None}}).bench.max_drop is None
    with pytest.raises(RecipeError, match="bench.max_drop: Input should be greater than or equal to 0"):
        parse_recipe({"bench": {"max_drop": -0.5}})


def test_a_speedup_budget_shows_the_bench_spread_beside_the_steps_timing() -> None:
    budget = {"kind": "speedup", "runtime": "pytorch", "batch_size": 32, "seq_len": 64, "value": 7.0,
              "predicted_speedup": 7.3, "measured_in_run": 7.22, "measured_speedup": 6.18,
              "measured_iqr": [5.72, 7.3], "within_10pct": False, "steps_run": 8}  # fmt: skip
    text = "\n".join(_budget_lines(budget))
    assert "| 6.18× (5.72–7.30) |" in text and "| 7.22× |" in text and "NOT within 10%" in text
    del budget["measured_iqr"]  # a report written before the spread was recorded
    assert "| 6.18× |" in "\n".join(_budget_lines(budget))


def test_an_optimised_graph_slower_than_its_fp32_graph_is_passed_over_with_its_reason() -> None:
    report = _report({"pytorch-pruned": 0.85, "onnx-fp32": 0.85, "onnx-optimized": 0.85})
    _by_name(report)["onnx-optimized"]["speedup"] = 2.5  # fp32 runs 3.0x
    rec = recommendation(report)
    assert rec["variant"] == "onnx-fp32"
    (over,) = [r for r in rec["not_recommended"] if r["variant"] == "onnx-optimized"]
    assert over["reason"] == "onnx-optimized: 2.50x, slower than onnx-fp32 (3.00x) it was built from"
    _by_name(report)["onnx-optimized"]["speedup"] = 3.5  # faster than its source: it may win
    assert recommendation(report)["variant"] == "onnx-optimized"
