"""The run report's typed models (`compressor.report.schema`): a report round-trips with exactly its keys, and a
file that is not a report (bad JSON, a newer schema, a missing or mistyped key) is one line naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from compressor.cli import app
from compressor.core.errors import UserError
from compressor.report.schema import SCHEMA_VERSION, MemberSection, RunReport

SCORE = {"accuracy": 0.8, "loss": 0.4, "n": 10}
PRUNED = {
    "test": SCORE, "heads_left": 3, "heads_total": 4, "heads_per_layer": [2, 1], "model_dir": "model",
    "plan": {"0": [0, 1], "1": [2]}, "parameters": 100, "encoder_flops_per_example": 50, "flop_ratio": 1.5,
    "masked_vs_pruned_max_abs_diff": 0.0, "units_removed": {"heads": 1, "neurons": 0, "layers": 0},
}  # fmt: skip
ROW = {
    "name": "2x/pytorch", "model": "2x", "role": "member", "runtime": "pytorch", "path": "members/2x/model",
    "rejected": False, "speedup": 2.1, "speedup_by_batch": {"32": 2.1}, "batch": 32, "seq_len": 64, "accuracy": 0.8,
    "drop_points": 0.5, "val_accuracy": 0.81, "val_drop_points": 0.4, "mcnemar_p": 0.3, "size_bytes": 10,
    "recovery": "finetune", "cpu_int8_features": None, "pareto": True,
}  # fmt: skip


def one_target() -> dict:
    """A one-target run's report as the pipeline assembles it (the extra keys stand for untyped detail)."""
    return json.loads(json.dumps({
        "schema_version": SCHEMA_VERSION, "name": "r", "status": "complete", "model_source": "m",
        "data_source": "d", "labels": ["neg", "pos"], "base_finetune": {"cached": None},
        "original": {"validation": SCORE, "test": SCORE, "parameters": 120, "encoder_flops_per_example": 75},
        "steps": [{"heads_left": 3, "seconds": 1.5}], "pruned": PRUNED,
        "export": {"fp32": {"dir": "onnx/fp32", "size_bytes": 1}}, "frontier": [ROW],
        "budget": {"kind": "heads", "value": 0.25, "target": 0.25, "flop_ratio": 1.5}, "seconds": 3.0,
        "timings": {"bench": 1.0}, "recommendation": None,
    }))  # fmt: skip


def family() -> dict:
    member = {"target": 2.0, "label": "2x", "step": 1, "pruned": PRUNED, "budget": {"target": 2.0, "flop_ratio": 1.5}}
    report = {k: v for k, v in one_target().items() if k not in ("pruned", "export", "frontier", "budget")}
    section = {"targets": [2.0], "kind": "speedup", "runtime": "pytorch", "members": [member], "frontier": [ROW],
               "pick": ROW | {"chosen_on": "validation"}}  # fmt: skip
    return report | {"family": section}


@pytest.mark.parametrize("make", [one_target, family])
def test_a_report_round_trips_with_exactly_its_keys(make, tmp_path) -> None:
    report = make()
    typed = RunReport.of(report)
    assert typed.dump() == report  # nothing added, nothing dropped, untyped detail kept
    typed.write(tmp_path / "report.json")
    back = RunReport.read(tmp_path / "report.json")
    assert back.dump() == report
    assert [r.name for r in back.frontier_rows()] == ["2x/pytorch"]
    assert back.original.test.accuracy == 0.8 and back.steps[0]["heads_left"] == 3
    if back.family is not None:  # the pick says which split chose it, typed
        assert back.family.pick.chosen_on == "validation" and back.family.pick.val_drop_points == 0.4


def test_plan_keys_are_layer_numbers_in_the_model_and_strings_in_the_file() -> None:
    typed = RunReport.of(one_target())
    assert typed.pruned.plan == {0: [0, 1], 1: [2]}
    assert json.loads(json.dumps(typed.dump()))["pruned"]["plan"] == {"0": [0, 1], "1": [2]}


def _write(tmp_path, data) -> object:
    path = tmp_path / "report.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["pruned"].pop("model_dir"), "pruned.model_dir: Field required"),
        (lambda r: r["original"]["test"].update(accuracy="high"), "original.test.accuracy: Input should be a valid"),
        (lambda r: r.update(status="running"), "status: Input should be 'complete'"),
        (lambda r: r.update(family=family()["family"]), "either 'pruned' (one target) or 'family'"),
        (lambda r: r["frontier"][0].update(role="winner"), "frontier.0.role: Input should be"),
    ],
)
def test_a_broken_report_is_one_line_naming_the_field(change, message, tmp_path) -> None:
    report = one_target()
    change(report)
    with pytest.raises(UserError) as err:
        RunReport.read(_write(tmp_path, report))
    assert message in str(err.value) and "\n" not in str(err.value) and "report.json" in str(err.value)


def test_a_newer_schema_and_bad_json_are_refused_in_one_line(tmp_path) -> None:
    with pytest.raises(UserError, match=rf"report schema {SCHEMA_VERSION + 1}, newer than this compressor's"):
        RunReport.read(_write(tmp_path, one_target() | {"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(UserError, match="is not valid JSON"):
        RunReport.read(_write(tmp_path, "{not json"))


def test_pick_reads_through_the_schema(tmp_path) -> None:
    """`compressor pick` refuses a report it cannot read in one line (exit 2) and picks from one it can."""
    _write(tmp_path, one_target() | {"schema_version": SCHEMA_VERSION + 1})
    result = CliRunner().invoke(app, ["pick", str(tmp_path)])
    assert result.exit_code == 2 and "newer than this compressor's" in result.output
    _write(tmp_path, one_target())
    result = CliRunner().invoke(app, ["pick", str(tmp_path), "--max-drop", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["name"] == "2x/pytorch"


def test_a_one_target_run_is_a_family_of_one(tmp_path) -> None:
    """`members()` gives a one-target run's model as its one member "pruned" (its sections from the top), a family
    its members; `member_models` finds each model in a run directory moved since the run."""
    typed = RunReport.of(one_target())
    (member,) = typed.members()
    assert (member.label, member.target, member.step, member.pruned) == ("pruned", 0.25, 1, typed.pruned)
    assert member.budget == typed.budget and member.export == typed.export
    assert [m.label for m in RunReport.of(family()).members()] == ["2x"]
    without = {k: v for k, v in one_target().items() if k != "budget"}
    with pytest.raises(UserError, match="one-target run report without its 'budget' section"):
        RunReport.of(without).members()
    moved = tmp_path / "moved"
    report = family()
    report["family"]["members"][0]["pruned"] = PRUNED | {"model_dir": "/gone/run/members/2x/model"}
    _write(tmp_path, report)
    (tmp_path / "members" / "2x" / "model").mkdir(parents=True)
    models = RunReport.read(tmp_path / "report.json").member_models(tmp_path)
    assert [(m.label, d) for m, d in models] == [("2x", tmp_path / "members" / "2x" / "model")]
    moved.mkdir()
    _write(moved, one_target())
    ((_, found),) = RunReport.read(moved / "report.json").member_models(moved)
    assert found == Path("model")  # nowhere to be found: as the report names it


def test_a_member_section_round_trips(tmp_path) -> None:
    section = family()["family"]["members"][0]
    MemberSection.of(section).write(tmp_path / "member.json")
    assert MemberSection.read(tmp_path / "member.json").dump() == section


@pytest.mark.parametrize("precision", [None, "no", "bf16"])
def test_the_report_says_what_precision_the_fine_tunes_ran_in(precision) -> None:
    from compressor.report.summary import time_lines

    report = one_target() | ({} if precision is None else {"mixed_precision": precision})
    first = time_lines(RunReport.of(report))[0]
    assert first.endswith(" Fine-tunes ran in bf16 autocast.") is (precision == "bf16")
    assert "autocast" not in first or precision == "bf16"


@pytest.mark.parametrize(
    ("device", "precision", "words"),
    [
        ("cpu", "bf16", " Fine-tunes ran in bf16 autocast."),
        ("cuda:0 (NVIDIA H200)", "bf16", " Fine-tunes ran on cuda:0 (NVIDIA H200) in bf16 autocast."),
        ("cuda:0 (NVIDIA H200)", "no", " Fine-tunes ran on cuda:0 (NVIDIA H200)."),
        ("cpu", "no", ""),
    ],
)
def test_the_report_says_where_the_fine_tunes_ran(device, precision, words) -> None:
    """A GPU is named beside the precision; the CPU, where every run's timing happens anyway, is not."""
    from compressor.report.summary import time_lines

    report = one_target() | {"mixed_precision": precision, "device": device}
    first = time_lines(RunReport.of(report))[0]
    assert first == f"Total time: 3 s.{words}"


def test_family_final_finetune_sentence_names_baselines_only_where_the_members_have_them():
    """A family run with `prune.baseline: null` does not say its (absent) layer-drop baselines had the same last
    fine-tune; one with baselines does. The one-target report says it through the same sentence."""
    from compressor.report.family import _finetune_lines

    ft = {"val_before": {"accuracy": 0.8}, "val_after": {"accuracy": 0.85}, "seconds": 12.0}
    members = [MemberSection(target=t, label=f"{t:g}x", step=i, member_finetune=ft, pruned=PRUNED)
               for i, t in enumerate((2.0, 4.0), start=1)]  # fmt: skip
    alone = " ".join(_finetune_lines(members))
    assert "2x 80.00 → 85.00% (12 s); 4x 80.00 → 85.00% (12 s)" in alone
    assert "baseline had the same" not in alone
    with_baseline = [m.model_copy(update={"baseline": {"layers_dropped": 6}}) for m in members]
    assert " ".join(_finetune_lines(with_baseline)).endswith("; the layer-drop baseline had the same.")
