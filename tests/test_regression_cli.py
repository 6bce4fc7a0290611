"""`compressor bench --save-baseline/--baseline` end to end on a tiny model: round trip, refusals (exit 2), failing
checks (exit 1: a regression or rounds too noisy to decide), ONNX export directories as reference or candidate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from compressor.guard import baseline as regression

FAST = {"rounds": 3, "warmup": 1, "min_time_s": 0.005, "batch_sizes": [1, 4], "seq_lens": [16], "threads": 1}


def _cli(*args: str):
    from compressor.cli import app

    return CliRunner().invoke(app, ["bench", *args])


def save(reference: Path, candidate: Path, recipe: Path, out: Path, base: Path, *extra: str):
    """`--save-baseline` without the noise refusal: 3 rounds of a tiny model on a loaded test machine may be too
    dispersed to resolve 10%, and these tests are about the file and the refusals, not about timing."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(regression, "check_noise", lambda _baseline: None)
        return _cli("--reference", str(reference), "--candidate", str(candidate), "--recipe", str(recipe),
                    "--out", str(out), "--save-baseline", str(base), *extra)  # fmt: skip


def timing_ignored(path: Path, out: Path) -> Path:
    """A copy of a baseline whose timing metrics tolerate 99%: neither noise nor a slow machine decides a test."""
    data = json.loads(path.read_text())
    for m in data["metrics"].values():
        if m["kind"] != "quality":
            m["tolerance"] = {"relative": 0.99}
    out.write_text(json.dumps(data))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir, tiny_csv) -> tuple[Path, Path, Path]:
    """(model dir, recipe, saved baseline) of a tiny model checked against itself."""
    tmp = tmp_path_factory.mktemp("regression")
    recipe = tmp / "r.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"source": str(tiny_csv), "max_length": 16}, "bench": FAST}))
    base = tmp / "baseline.json"
    res = save(tiny_model_dir, tiny_model_dir, recipe, tmp / "first", base)
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
    assert len(ratio.per_round) == 3 and ratio.tolerance.relative == 0.10
    assert json.loads(base.read_text()) == json.loads(json.dumps(loaded.model_dump(exclude_none=True)))


def test_cli_quality_regression_fails_with_the_table(setup, tmp_path: Path) -> None:
    """The baseline claims 5 points more accuracy than the model has: exit 1, the metric named in the table,
    whose summary also lands in $GITHUB_STEP_SUMMARY and the output directory."""
    edited = timing_ignored(setup[2], tmp_path / "edited.json")
    data = json.loads(edited.read_text())
    data["metrics"]["accuracy:pytorch-candidate"]["value"] += 0.05
    edited.write_text(json.dumps(data))
    summary = tmp_path / "summary.md"
    res = CliRunner(env={"GITHUB_STEP_SUMMARY": str(summary)}).invoke(
        __import__("compressor.cli", fromlist=["app"]).app,
        ["bench", "--reference", str(setup[0]), "--candidate", str(setup[0]), "--recipe", str(setup[1]),
         "--out", str(tmp_path / "out"), "--baseline", str(edited)],
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    regressed = res.output.split("### Regressed or inconclusive")[1].split("### All metrics")[0]
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


def test_cli_save_refuses_rounds_too_few_to_resolve_the_tolerance(setup, tmp_path: Path) -> None:
    """One round has no known spread: the baseline is refused (exit 2, one error line), nothing is written."""
    model, recipe, _ = setup
    base = tmp_path / "b.json"
    res = _cli("--reference", str(model), "--candidate", str(model), "--recipe", str(recipe),
               "--out", str(tmp_path / "out"), "--save-baseline", str(base), "--rounds", "1")  # fmt: skip
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if "--save-baseline" in line]
    assert len(errors) == 1 and "rounds too dispersed" in errors[0] and "raise --rounds" in errors[0]
    assert not base.exists()


def test_cli_check_with_rounds_too_noisy_is_inconclusive_exit_1(setup, tmp_path: Path) -> None:
    """A check whose own rounds cannot resolve the tolerance fails (exit 1) as inconclusive, never a silent pass,
    even though the model is unchanged and quality is identical."""
    res = check(setup, tmp_path / "out", "--rounds", "1")
    assert res.exit_code == 1, res.output
    failing = res.output.split("### Regressed or inconclusive")[1].split("### All metrics")[0]
    assert "`ratio:pytorch-candidate:s16:b4`" in failing and "**inconclusive**" in failing
    assert "re-run on a quiet machine or raise --rounds" in failing and "**REGRESSION**" not in failing
    assert "accuracy:" not in failing


@pytest.fixture(scope="module")
def onnx_export(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model's fp32 ONNX export directory (graph, config.json, tokenizer)."""
    import torch

    from compressor.deploy.export import export_onnx

    ids = torch.randint(5, 30, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    exported = export_onnx(tiny_model_dir, tmp_path_factory.mktemp("onnx"), ["fp32"], [batch])
    return Path(exported["fp32"]["dir"])


def test_cli_onnx_export_as_reference_and_candidate(setup, onnx_export, tmp_path: Path) -> None:
    """An ONNX export directory works as the reference (saved, then checked: exit 0) and as the candidate; the
    fingerprint is the export's; swapping the candidate's kind is a mismatch (exit 2, one line)."""
    model, recipe, _ = setup
    base = tmp_path / "onnx.json"
    res = save(onnx_export, model, recipe, tmp_path / "first", base)
    assert res.exit_code == 0, res.output
    loaded = regression.load_baseline(base)
    assert loaded.identity["reference"] == regression.fingerprint(onnx_export) != regression.fingerprint(model)
    assert loaded.identity["candidates"] == ["onnx-reference", "pytorch-candidate"]
    assert loaded.metrics["agreement:pytorch-candidate"].value == 1.0
    assert "ratio:pytorch-candidate:s16:b4" in loaded.metrics
    lenient = timing_ignored(base, tmp_path / "lenient.json")
    res = _cli("--reference", str(onnx_export), "--candidate", str(model), "--recipe", str(recipe),
               "--out", str(tmp_path / "check"), "--baseline", str(lenient))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "## compressor bench: PASS" in res.output and "`accuracy:pytorch-candidate`" in res.output
    res = _cli("--reference", str(onnx_export), "--candidate", str(onnx_export), "--recipe", str(recipe),
               "--out", str(tmp_path / "swap"), "--baseline", str(lenient))  # fmt: skip
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert (
        "candidates ['onnx-reference', 'pytorch-candidate'] there, ['onnx-candidate', 'onnx-reference'] now"
        in res.output
    )
