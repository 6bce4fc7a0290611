"""The report's recommendation: the fastest shipped variant that passes every gate, accuracy included."""

from __future__ import annotations

import pytest

from compressor.recipe import RecipeError, parse_recipe
from compressor.report import _recommendation_line, recommendation


def _report(accuracies: dict[str, float], max_drop: float | None = 0.01, rejected: tuple[str, ...] = ()) -> dict:
    """A report whose bench has the original at 85% and the given variants (faster in the order given)."""
    summary = {"pytorch-original": {"accuracy": 0.85, "headline_speedup": 1.0, "headline_batch": 32}}
    for speed, (name, acc) in enumerate(accuracies.items(), start=2):
        summary[name] = {
            "accuracy": acc,
            "headline_speedup": float(speed),
            "headline_batch": 32,
            "headline_seq_len": 64,
        }
    export = {name.removeprefix("onnx-"): {"status": "passed"} for name in accuracies if name.startswith("onnx-")}
    export |= {name.removeprefix("onnx-"): {"status": "rejected"} for name in rejected}
    return {"bench": {"summary": summary, "max_drop": max_drop}, "export": export, "original": {"test": {}}}


def test_the_fastest_variant_within_the_gate_is_recommended() -> None:
    # onnx-int8 is fastest but 3 points down; onnx-fp32 loses 0.5 points and is next fastest.
    report = _report({"pytorch-pruned": 0.845, "onnx-fp32": 0.845, "onnx-int8": 0.82})
    rec = recommendation(report)
    assert rec["variant"] == "onnx-fp32" and rec["speedup"] == 3.0 and rec["max_drop"] == 0.01
    assert "**Recommendation: `onnx-fp32`**" in _recommendation_line(report) and "within 1.00 points" in (
        _recommendation_line(report)
    )


def test_the_gate_is_inclusive_and_the_int8_gate_still_applies() -> None:
    report = _report({"pytorch-pruned": 0.84, "onnx-int8": 0.85}, rejected=("onnx-int8",))
    rec = recommendation(report)
    assert rec["variant"] == "pytorch-pruned" and rec["rejected"] == ["onnx-int8"]  # exactly 1 point down passes


def test_no_variant_accurate_enough_is_said_in_one_line() -> None:
    report = _report({"pytorch-pruned": 0.577, "onnx-int8": 0.571})
    rec = recommendation(report)
    assert rec["variant"] is None
    assert rec["reason"] == (
        "no shipped variant's test accuracy is within 1.00 points of the original's 85.00% (bench.max_drop 0.01); "
        "the best is pytorch-pruned at 57.70%"
    )
    line = _recommendation_line(report)
    assert line.startswith("**Recommendation: none**: no shipped variant") and "\n" not in line


def test_a_null_gate_recommends_the_fastest() -> None:
    assert recommendation(_report({"pytorch-pruned": 0.577, "onnx-int8": 0.571}, max_drop=None))["variant"] == (
        "onnx-int8"
    )


def test_max_drop_parses_with_a_default_and_names_the_field() -> None:
    assert parse_recipe({}).bench.max_drop == 0.01
    assert parse_recipe({"bench": {"max_drop": None}}).bench.max_drop is None
    with pytest.raises(RecipeError, match="bench.max_drop: Input should be greater than or equal to 0"):
        parse_recipe({"bench": {"max_drop": -0.5}})
