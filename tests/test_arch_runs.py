"""`compressor run` end to end on a tiny model directory of each newer architecture, made here: base fine-tune,
iterative pruning of heads and FFN neurons under a FLOP budget with recovery, surgery, save, ONNX export with its parity
gate, bench and report. The saved model must load through both routes with the report's masked == pruned equivalence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_tokenizer_dir, tiny_recipe
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from compressor.pipeline.runner import run_recipe
from compressor.recipe import parse_recipe
from compressor.surgery.checkpoint import load_pruned
from compressor.testing import ARCHS, tiny_model

NEWER = [arch for arch in ("deberta-v2", "modernbert", "mpnet") if arch in ARCHS]


def _model_dir(root: Path, arch: str) -> Path:
    """A tiny `arch` classifier with transformers' own init and the fixture tokenizer, as a user's local directory."""
    path = make_tokenizer_dir(root / arch)
    tiny_model(arch, layers=3, heads=4, head_size=8, randomized=False).save_pretrained(path)
    return path


@pytest.mark.e2e
@pytest.mark.parametrize("arch", NEWER)
def test_run_end_to_end_on_a_newer_architecture(tmp_path, tiny_csv, cache_dir, arch) -> None:
    overrides = {
        "prune.units": ["heads", "neurons"],
        "prune.budget": {"kind": "flops", "value": 0.5, "seq_len": 16},
        "prune.target": None,
        "export": {"variants": ["fp32", "int8"], "atol": 1e-4, "int8": {"smooth_alpha": 0.8, "smooth_scope": "all"}},
        "bench": {
            "batch_sizes": [1, 4],
            "seq_len": 16,
            "rounds": 2,
            "min_time_s": 0.01,
            "quantize_only": ["onnx-int8"],
        },
    }
    recipe = tiny_recipe(_model_dir(tmp_path, arch), tiny_csv, tmp_path / "out", **overrides)
    recipe["prune"].pop("target")
    report = run_recipe(parse_recipe(recipe))
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["status"] == "complete"
    assert report["original"]["test"]["accuracy"] >= 0.8, "the base fine-tune learned the task"
    assert report["pruned"]["flop_ratio"] >= 1.8 and report["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-5
    assert report["export"]["fp32"]["max_abs_diff"] <= 1e-4
    smoothing = report["export"]["int8"]["smoothing"]  # SmoothQuant finds this architecture's MatMuls in its graph
    assert smoothing["matmuls"] >= 3 * 4 and smoothing["scope"] == "all", smoothing
    model_dir = Path(report["pruned"]["model_dir"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = dict(tok(["the film was great fun", "a dull and boring plot"], padding=True, return_tensors="pt"))
    batch.pop("token_type_ids", None)
    remote = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True).eval()
    with torch.inference_mode():
        assert torch.allclose(remote(**batch).logits, load_pruned(model_dir).eval()(**batch).logits, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_declared_sdpa_matches_transformers(arch) -> None:
    """`ArchSpec.sdpa` (what loads fall back on) says what transformers itself supports for the architecture."""
    from compressor.surgery.arch import arch_spec
    from compressor.testing import has_sdpa

    assert arch_spec(arch).sdpa is has_sdpa(arch)
