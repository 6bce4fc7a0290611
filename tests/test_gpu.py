"""On a CUDA GPU (`make test-gpu`; skipped without one): the tiny end-to-end recipe in fp32, bf16 and fp16, and the demo
recipe, each run by the CLI in its own process (Accelerate's state is one per process)."""

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


def test_demo_recipe_on_cuda(tmp_path):
    """`make demo`'s recipe (MiniLM-L6 on Rotten Tomatoes, offline built-ins) end to end on the GPU."""
    done = _run(ROOT / "recipes" / "minilm_rt_50pct.yaml", tmp_path / "cache", "--output-dir", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "demo" / "report.json").read_text())
    assert report["status"] == "complete"
    assert report["original"]["test"]["accuracy"] - report["pruned"]["test"]["accuracy"] <= 0.03
