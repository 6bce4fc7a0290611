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


@pytest.mark.parametrize("native", [True, False])
def test_auto_takes_bf16_only_where_the_cpu_multiplies_it_natively(native, monkeypatch):
    """`mixed_precision: auto` on a CPU: bf16 with AMX-BF16 / AVX512-BF16 flags, fp32 without (emulated bf16 is slower
    than fp32); the run's log line says which and why."""
    from compressor.pipeline import runner

    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runner, "cpu_has_bf16", lambda: native)
    assert runner.native_precision()[0] == ("bf16" if native else "no")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # the precision is one per process: set it anew here
    try:
        running = runner.make_accelerator("auto").mixed_precision
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)  # and leave the next test a fresh one
    assert running == ("bf16" if native else "no")
    words = runner.precision_words("auto", running)
    assert words.startswith("bf16 autocast (mixed_precision auto: " if native else "fp32 (mixed_precision auto: ")
    assert ("natively" in words) is native
    assert runner.precision_words("no", "no") == "fp32"


@pytest.mark.usefixtures("uncapped")
def test_cpu_bf16_flags_are_read_from_cpuinfo(tmp_path):
    from compressor.core.machine import cpu_has_bf16

    for flags, expected in (("sse2 avx2 avx512f amx_bf16", True), ("sse2 avx2 avx512_bf16", True),
                            ("sse2 avx2 avx512f avx512_vnni", False)):  # fmt: skip
        info = tmp_path / "cpuinfo"
        info.write_text(f"model name\t: Some CPU\nflags\t\t: {flags}\n")
        assert cpu_has_bf16(info) is expected
    (tmp_path / "arm").write_text("Features\t: fp asimd\n")
    assert cpu_has_bf16(tmp_path / "arm") is None


def test_a_bf16_fine_tune_is_cached_apart_from_the_fp32_one():
    """The fine-tune cache keys the precision it was trained at (a bf16 model is another model); fp32 keys are the
    ones made before precisions were keyed."""
    from compressor.pipeline.finetune import finetune_key
    from compressor.recipe import parse_recipe

    recipe = parse_recipe({"model": {"source": "builtin:minilm-l6"}, "data": {"source": "builtin:rotten_tomatoes"}})
    fp32 = finetune_key(recipe, recipe.model, ["neg", "pos"])
    assert finetune_key(recipe, recipe.model, ["neg", "pos"], precision="no") == fp32
    assert finetune_key(recipe, recipe.model, ["neg", "pos"], precision="bf16") != fp32
    auto = parse_recipe({"model": {"source": "builtin:minilm-l6"}, "data": {"source": "builtin:rotten_tomatoes"},
                         "accelerate": {"mixed_precision": "auto"}})  # fmt: skip
    assert auto.accelerate.mixed_precision == "auto"
