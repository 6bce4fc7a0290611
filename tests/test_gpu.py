"""On a CUDA GPU (`make test-gpu`; skipped without one): the tiny end-to-end recipe in fp32, bf16 and fp16, a tiny
speed-up family with a reference, and the demo recipe, each run by the CLI in its own process (Accelerate's state is
one per process). The fine-tunes run on the GPU; the timing (latency table, each step's calibration, the bench) and
the exports stay on the CPU, as the runtimes are CPU runtimes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_recipe

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]


def _run(recipe: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMPRESSOR_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "compressor", "run", str(recipe), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_tiny_recipe_on_cuda(tmp_path, tiny_model_dir, tiny_csv, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    out = tmp_path / "out"
    recipe = tiny_recipe(
        tiny_model_dir,
        tiny_csv,
        out,
        accelerate={"mixed_precision": precision},
        export={"variants": ["fp32", "int8"]},
        bench={"batch_sizes": [8], "rounds": 2, "min_time_s": 0.05},
    )
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    done = _run(path, tmp_path / "cache")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "complete"
    assert report["original"]["test"]["accuracy"] >= 0.9  # the base fine-tune learned the task on the GPU
    assert report["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4


def test_speedup_family_with_a_reference_on_cuda(tmp_path, tiny_model_dir, tiny_csv, mpnet_reference):
    """Two speed-up members over a latency table timed on the CPU, each step's calibration timing CPU copies of the
    GPU-trained model, a reference of another tokenizer fine-tuned on the GPU too; the report names the GPU, and
    `compressor pick` chooses from the frontier."""
    out = tmp_path / "fam"
    finetune = {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 96}
    recipe = tiny_recipe(
        tiny_model_dir,
        tiny_csv,
        out,
        prune={"units": ["heads", "neurons"], "criterion": {"name": "taylor"}, "steps": 4, "score_examples": 64,
               "budget": {"kind": "speedup", "values": [1.3, 1.6], "batch_size": 4, "seq_len": 16},
               "finetune": finetune},  # fmt: skip
        export={"variants": ["fp32", "int8"], "int8": {"max_drop": None, "min_agreement": None}},
        bench={"batch_sizes": [4], "seq_len": 16, "rounds": 2, "min_time_s": 0.05, "max_drop": None,
               "references": [str(mpnet_reference)], "reference_finetune": {"epochs": 8, "lr": 3e-3, "batch_size": 16}},
        accelerate={"mixed_precision": "auto"},
    )  # fmt: skip
    path = tmp_path / "fam.yaml"
    path.write_text(yaml.safe_dump(recipe))
    done = _run(path, tmp_path / "cache")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "complete" and report["device"].startswith("cuda")
    family = report["family"]
    assert [m["label"] for m in family["members"]] == ["1.3x", "1.6x"]
    calibrated = [step["measured_speedup"] for step in report["steps"] if "measured_speedup" in step]
    assert calibrated and all(value > 0 for value in calibrated)  # each step timed CPU copies of the CUDA model
    assert all(m["budget"]["measured_speedup"] > 1.0 for m in family["members"])
    (ref,) = report["references"]
    assert ref["label"] == mpnet_reference.name and ref["test"]["accuracy"] >= 0.9  # learned the task on the GPU
    assert f"reference/{mpnet_reference.name}/pytorch" in {r["name"] for r in family["frontier"]}
    assert "Fine-tunes ran on cuda" in (out / "report.md").read_text()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    picked = subprocess.run([sys.executable, "-m", "compressor", "pick", str(out)], env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert picked.returncode == 0, picked.stderr[-2000:]


def test_demo_recipe_on_cuda(tmp_path):
    """`make demo`'s recipe (MiniLM-L6 on Rotten Tomatoes, offline built-ins) end to end on the GPU."""
    done = _run(ROOT / "recipes" / "minilm_rt_50pct.yaml", tmp_path / "cache", "--output-dir", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "demo" / "report.json").read_text())
    assert report["status"] == "complete"
    assert report["original"]["test"]["accuracy"] - report["pruned"]["test"]["accuracy"] <= 0.03
