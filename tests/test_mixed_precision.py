"""Accelerate's mixed precision (`accelerate: {mixed_precision: bf16}`) on CPU: the run is the fp32 run within bf16's
rounding, and what it saves, exports and reloads is fp32."""

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
ACCURACY_TOLERANCE = 0.05  # test accuracy, bf16 fine-tunes vs fp32 (the tiny test split: 1 example is ~2 points)


def _run(tmp_path: Path, model_dir: Path, data: Path, precision: str) -> dict:
    """The tiny recipe at `precision`, run by the CLI in a fresh process (Accelerate's state is one per process)."""
    out = tmp_path / precision
    recipe = tiny_recipe(model_dir, data, out, accelerate={"mixed_precision": precision}, export={"variants": ["fp32"]})
    path = tmp_path / f"{precision}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "COMPRESSOR_CACHE": str(tmp_path / f"cache-{precision}"), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "compressor", "run", str(path)], env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_bf16_run_matches_fp32(tmp_path, tiny_model_dir, tiny_csv):
    """Same heads removed at every step as fp32 and test accuracy within `ACCURACY_TOLERANCE`; the saved model is
    fp32 and its ONNX export passed the fp32 gate (the autocast wrapper does not leak into surgery or export)."""
    fp32 = _run(tmp_path, tiny_model_dir, tiny_csv, "no")
    bf16 = _run(tmp_path, tiny_model_dir, tiny_csv, "bf16")
    assert [s["removed"] for s in bf16["steps"]] == [s["removed"] for s in fp32["steps"]]
    for split in ("original", "pruned"):
        a, b = fp32[split]["test"]["accuracy"], bf16[split]["test"]["accuracy"]
        assert abs(a - b) <= ACCURACY_TOLERANCE, (split, a, b)
    from safetensors.torch import load_file

    weights = load_file(Path(bf16["pruned"]["model_dir"]) / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}
    assert (tmp_path / "bf16" / "onnx" / "fp32" / "model.onnx").exists()
