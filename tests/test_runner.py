"""The spine end to end on a tiny BERT: run, outputs, caching, --force, resume after SIGKILL, accelerate."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_recipe
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from compressor.bench.frontier import pick
from compressor.core.errors import UserError
from compressor.core.machine import int8_features
from compressor.core.runtimes import cannot_pay
from compressor.deploy.openvino import missing as openvino_missing
from compressor.pipeline.runner import run_recipe
from compressor.recipe import parse_recipe
from compressor.report.schema import RunReport
from compressor.surgery.checkpoint import load_pruned

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, model_dir: Path, data: Path, name: str = "out", **overrides) -> dict:
    return run_recipe(parse_recipe(tiny_recipe(model_dir, data, tmp_path / name, **overrides)))


def test_run_end_to_end(tmp_path, tiny_model_dir, tiny_csv, cache_dir) -> None:
    report = _run(tmp_path, tiny_model_dir, tiny_csv)
    out = tmp_path / "out"
    for name in ("recipe.resolved.yaml", "report.json", "report.md", "run.log", "model/model.safetensors"):
        assert (out / name).exists(), name
    saved = json.loads((out / "report.json").read_text())
    assert saved["status"] == "complete" and saved["schema_version"] == 1
    assert RunReport.read(out / "report.json").dump() == saved == report  # written and read through the schema
    assert report["original"]["test"]["accuracy"] >= 0.9  # the base fine-tune really learned the task
    assert report["pruned"]["heads_left"] == 6 and report["pruned"]["heads_total"] == 12
    assert [s["heads_left"] for s in report["steps"]] == [9, 6]
    for step in report["steps"]:
        assert {"val_after_prune", "val_after_finetune", "heads_per_layer", "seconds", "removed"} <= set(step)
    assert report["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-5
    assert report["pruned"]["flop_ratio"] > 1.0
    # The resolved recipe round-trips through the schema.
    assert parse_recipe(yaml.safe_load((out / "recipe.resolved.yaml").read_text())).name == "tiny"


def test_saved_model_loads_in_plain_transformers(tmp_path, tiny_model_dir, tiny_csv, cache_dir) -> None:
    report = _run(tmp_path, tiny_model_dir, tiny_csv, **{"prune.min_heads_per_layer": 1})
    model_dir = Path(report["pruned"]["model_dir"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = tok(["the film was great fun", "a dull and boring plot"], padding=True, return_tensors="pt")
    vanilla = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True).eval()
    ours = load_pruned(model_dir)
    with torch.inference_mode():
        assert torch.allclose(vanilla(**batch).logits, ours(**batch).logits, atol=1e-6)
    assert vanilla.config.pruned_heads  # original head ids recorded
    assert sum(len(v) for v in vanilla.config.pruned_heads.values()) == 6


def test_base_finetune_is_cached(tmp_path, tiny_model_dir, tiny_csv, cache_dir) -> None:
    first = _run(tmp_path, tiny_model_dir, tiny_csv, name="a")
    second = _run(
        tmp_path,
        tiny_model_dir,
        tiny_csv,
        name="b",
        prune={"criterion": {"name": "taylor"}, "target": 0.25, "steps": 1, "score_examples": 32, "finetune": None},
    )
    assert "steps" in first["base_finetune"]  # trained
    assert "steps" not in second["base_finetune"]  # loaded from the cache
    assert second["base_finetune"]["cached"] == first["base_finetune"]["cached"]
    assert second["original"]["test"] == first["original"]["test"]


def test_finished_run_needs_force(tmp_path, tiny_model_dir, tiny_csv, cache_dir) -> None:
    _run(tmp_path, tiny_model_dir, tiny_csv)
    before = (tmp_path / "out" / "report.json").read_text()
    with pytest.raises(UserError, match="holds a finished run; pass --force"):
        _run(tmp_path, tiny_model_dir, tiny_csv)
    assert (tmp_path / "out" / "report.json").read_text() == before
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "out"))
    assert run_recipe(recipe, force=True)["status"] == "complete"


def _cli_env(cache: Path) -> dict:
    return {**os.environ, "COMPRESSOR_CACHE": str(cache), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.e2e
@pytest.mark.parametrize("distill", [None, {"alpha": 0.7, "hidden_weight": 0.5}], ids=["plain", "distill"])
def test_resume_after_sigkill(tmp_path, tiny_model_dir, tiny_csv, cache_dir, distill) -> None:
    """Kill a real `compressor run` after its first checkpoint; rerunning finishes like an uninterrupted run (with
    distillation: reusing the teacher targets the killed attempt cached)."""
    finetune = {"epochs": 2, "lr": 5e-4, "batch_size": 8, "max_examples": 160, "distill": distill}
    overrides = {"prune.steps": 3, "prune.finetune": finetune}
    reference = _run(tmp_path, tiny_model_dir, tiny_csv, name="ref", **overrides)  # also fills the base cache
    out = tmp_path / "killed"
    recipe_path = tmp_path / "killed.yaml"
    recipe_path.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, out, **overrides)))
    cmd = [sys.executable, "-m", "compressor", "run", str(recipe_path)]
    proc = subprocess.Popen(cmd, env=_cli_env(cache_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = out / "state" / "step_000" / "step.json"
    deadline = time.time() + 180
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert marker.exists(), "the run never reached its first checkpoint"
    assert not (out / "report.json").exists(), "killed too late: the run had already finished"
    assert not (out / "model").exists()
    done = subprocess.run(cmd, env=_cli_env(cache_dir), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming after step" in (out / "run.log").read_text()
    reused = re.search(r"teacher targets: \d+ of 240 training examples \(reused", (out / "run.log").read_text())
    assert bool(reused) == bool(distill)
    resumed = json.loads((out / "report.json").read_text())
    assert resumed["pruned"]["plan"] == reference["pruned"]["plan"]
    for a, b in zip(resumed["steps"], reference["steps"], strict=True):
        assert a["removed"] == b["removed"]
        assert a["val_after_finetune"] == pytest.approx(b["val_after_finetune"], abs=1e-6)
    assert resumed["pruned"]["test"] == pytest.approx(reference["pruned"]["test"], abs=1e-6)


@pytest.mark.e2e
@pytest.mark.parametrize("distill", [None, {"alpha": 0.7, "hidden_weight": 0.5}], ids=["plain", "distill"])
def test_accelerate_launch_two_processes(tmp_path, tiny_model_dir, tiny_csv, cache_dir, distill) -> None:
    """Two processes train, score and evaluate together (with distillation: both see the same teacher logits)."""
    out = tmp_path / "ddp"
    recipe_path = tmp_path / "ddp.yaml"
    finetune = {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 96, "distill": distill}
    recipe_path.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, out, **{"prune.finetune": finetune})))
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--cpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "compressor",
        "run",
        str(recipe_path),
    ]
    done = subprocess.run(cmd, env=_cli_env(cache_dir), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "complete"
    assert report["pruned"]["heads_left"] == 6
    assert report["original"]["test"]["n"] == 30  # gathered over both processes without duplicates
    assert done.stdout.count("report:") == 1  # only the main process reports
    assert [bool(s["finetune"].get("distill")) for s in report["steps"]] == [bool(distill)] * 2
    computed = re.search(
        r"teacher targets: \d+ of 240 training examples \(computed once", (out / "run.log").read_text()
    )
    assert bool(computed) == bool(distill)


def test_run_all_stages(tmp_path, tiny_model_dir, tiny_csv, cache_dir) -> None:
    """Export, benchmark and analysis run as part of `run` and land in the report."""
    report = _run(
        tmp_path,
        tiny_model_dir,
        tiny_csv,
        export={"variants": ["fp32", "int8"]},
        bench={"batch_sizes": [1, 4], "seq_len": 16, "rounds": 2, "warmup": 1, "min_time_s": 0.01},
        analysis={"examples": 12},
    )
    out = tmp_path / "out"
    assert set(report["export"]) == {"fp32", "int8"}
    assert report["export"]["fp32"]["max_abs_diff"] <= 1e-4
    summary = report["bench"]["summary"]
    assert {"pytorch-original", "pytorch-pruned", "onnx-fp32", "onnx-int8"} <= set(summary)
    assert summary["onnx-fp32"]["agreement"] == 1.0
    # The original quantized (bench.quantize_only's default: ORT int8, OpenVINO int8 where installed and where its
    # int8 can pay, i.e. the CPU has VNNI or AMX; else left out in one line) beside them.
    unpaid = cannot_pay("openvino-int8")
    openvino = openvino_missing() is None and unpaid is None
    quantized = {"onnx-int8-original", *(["openvino-int8-original"] if openvino else [])}
    assert quantized <= set(summary) and "onnx-fp32-original" not in summary
    assert report["bench"]["skipped"] == ([unpaid] if unpaid else [])
    assert not any(name.endswith("openvino-int8") for name in summary) or openvino
    if unpaid:
        assert f"Left out: {unpaid}." in (out / "bench" / "report.md").read_text()
    originals = {r["runtime"]: r for r in report["frontier"] if r["role"] == "original"}
    assert set(originals) == {"pytorch", *(n.removesuffix("-original") for n in quantized)}
    assert originals["onnx-int8"]["cpu_int8_features"] == int8_features()
    assert "onnx-int8-original" in (out / "report.md").read_text()
    # The bench scored validation too; the recommendation is the pick on it (the call `compressor pick` makes).
    assert all(r["val_accuracy"] is not None and r["accuracy"] is not None for r in report["frontier"])
    chosen = pick(report["frontier"], 100 * report["bench"]["max_drop"])
    assert report["recommendation"]["variant"] == (chosen["name"] if chosen else None)
    assert report["recommendation"].get("chosen_on", "validation") == "validation"
    assert [s["step"] for s in report["analysis"]["pruning_steps"]] == [1, 2]
    assert report["analysis"]["pruning_steps"][-1]["heads_removed"] == 6
    md = (out / "report.md").read_text()
    for section in ("## ONNX export", "## Benchmark", "## Head roles of kept vs removed heads"):
        assert section in md
    for path in ("onnx/fp32/model.onnx", "bench/report.md", "analysis/analysis.json", "model/README.md"):
        assert (out / path).exists(), path


def test_criteria_get_special_ids_and_their_diagnostics_reach_the_step_log(
    tmp_path, tiny_model_dir, tiny_csv, cache_dir, monkeypatch
) -> None:
    """The tokenizer's special ids reach every criterion (confidence needs them); l0's sparsity report is kept."""
    from compressor.pruning import criteria

    seen: list[dict] = []
    real = criteria.score_units

    def spy(name, ctx, params=None):
        seen.append(dict(ctx.extras))
        return real(name, ctx, params)

    monkeypatch.setattr(criteria, "score_units", spy)
    prune = {"criterion": {"name": "l0", "params": {"steps": 30}}, "target": 0.5, "steps": 2, "finetune": None}
    report = _run(tmp_path, tiny_model_dir, tiny_csv, prune=prune)
    special = sorted(AutoTokenizer.from_pretrained(tiny_model_dir).all_special_ids)
    assert len(seen) == 2 and all(extras["special_token_ids"] == special for extras in seen)
    before = [12] + [step["heads_left"] for step in report["steps"][:-1]]
    for step, alive in zip(report["steps"], before, strict=True):
        l0 = step["criterion_diagnostics"]["l0"]
        assert l0["alive"] == alive and l0["target_open"] == step["heads_left"]


def test_step_checkpoints_round_trip_and_rebuild_records_from_an_older_log(tmp_path) -> None:
    from compressor.recovery.checkpoints import RECORDS_FILE, StepCheckpoints
    from compressor.recovery.loop import Masks, PruneState, StepRecord
    from compressor.testing import tiny_model

    model = tiny_model("bert", layers=2, heads=4)
    full = Masks.full(model)
    scores = torch.tensor([[0.1234567, 2.0, -1.0, 0.5], [3.0, 0.25, 1.5, -0.75]])
    after = Masks(heads=full.heads.clone())
    after.heads[0, 2] = after.heads[1, 3] = False
    entry = {"step": 1, "removed": {"0": [2], "1": [3]}, "heads_left": 6, "scores": scores.tolist()}
    entry["scores"] = [[round(s, 6) for s in row] for row in entry["scores"]]
    state = PruneState(after, [StepRecord(entry, scores, after)])
    hook = StepCheckpoints(tmp_path / "state", main=True)
    hook.after_step(model, state)

    fresh_model = tiny_model("bert", layers=2, heads=4, seed=1)
    resumed = hook.resume(fresh_model, PruneState(Masks.full(fresh_model)))
    assert torch.equal(resumed.masks.heads, after.heads) and resumed.log == [entry]
    assert torch.equal(resumed.steps[0].scores, scores) and torch.equal(resumed.steps[0].masks.heads, after.heads)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in fresh_model.state_dict().items())

    (tmp_path / "state" / "step_000" / RECORDS_FILE).unlink()  # a checkpoint from before the records file
    older = hook.resume(fresh_model, PruneState(Masks.full(fresh_model)))
    assert torch.equal(older.steps[0].masks.heads, after.heads)
    assert torch.allclose(older.steps[0].scores, scores, atol=1e-6)  # from the log's 6-digit rounding
