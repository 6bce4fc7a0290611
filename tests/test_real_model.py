"""The real MiniLM-L6 on a small slice of Rotten Tomatoes, every stage on (slow: `make test-slow`)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from compressor.pipeline.runner import run_recipe
from compressor.recipe import parse_recipe


@pytest.mark.slow
def test_minilm_small_slice_all_stages(tmp_path, cache_dir) -> None:
    torch.set_num_threads(2)
    recipe = parse_recipe(
        {
            "name": "minilm_slice",
            "output_dir": str(tmp_path / "out"),
            "data": {"max_length": 48, "max_train_examples": 400, "max_eval_examples": 128},
            "base_finetune": {"epochs": 1, "lr": 1e-4, "batch_size": 32},
            "prune": {
                "criterion": {"name": "taylor"},
                "target": 0.5,
                "steps": 2,
                "score_examples": 64,
                "finetune": {"epochs": 1, "lr": 5e-5, "max_examples": 128},
            },
            "export": {"int8": {"smooth_alpha": 0.8, "calibration_examples": 64}},
            "bench": {"batch_sizes": [1, 32], "seq_len": 32, "rounds": 2, "warmup": 1, "min_time_s": 0.1},
            "analysis": {"examples": 24},
        }
    )
    report = run_recipe(recipe)
    assert report["pruned"]["heads_left"] == 36
    assert report["original"]["test"]["n"] == 128
    assert report["pruned"]["masked_vs_pruned_max_abs_diff"] <= 1e-4
    for variant in ("fp32", "optimized", "int8"):
        assert variant in report["export"]
    assert report["export"]["fp32"]["max_abs_diff"] <= 1e-4
    smoothing = report["export"]["int8"]["smoothing"]  # the rescaled fp32 graph is the same function
    fused = report["export"]["optimized"]["fused_attention_nodes"]  # one per layer that kept heads
    assert smoothing["folded_into_attention"] == fused and smoothing["matmuls"] == 12 + fused  # + 2 FFN per layer
    assert smoothing["max_abs_diff"] <= 1e-4
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["status"] == "complete"
    model_dir = tmp_path / "out" / "model"
    from compressor.surgery.checkpoint import load_pruned

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = tok(["a gorgeous, witty film", "tedious and overlong"], padding=True, return_tensors="pt")
    with torch.inference_mode():  # plain transformers, through the shipped code, and compressor's loader agree
        assert torch.allclose(model(**batch).logits, load_pruned(model_dir)(**batch).logits, atol=1e-6)
    _real_clients_open_the_outputs(tmp_path / "out", model)
    assert (tmp_path / "out" / "analysis").is_dir()
    assert (tmp_path / "out" / "bench").is_dir()


def _real_clients_open_the_outputs(out, model) -> None:
    """What users serve with, on this run's outputs: transformers' pipeline (the shipped modeling code, the dataset's
    label names) gives the model's own prediction, and a bare onnxruntime session opens every exported variant by its
    file alone and agrees with the PyTorch model's predictions."""
    import numpy as np
    import onnxruntime as ort
    from transformers import pipeline

    texts = ["a gorgeous, witty film", "tedious and overlong", "the plot is thin but the acting is superb"]
    classify = pipeline("text-classification", model=str(out / "model"), trust_remote_code=True, device="cpu")
    tok = AutoTokenizer.from_pretrained(out / "model")
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        predicted = model(**batch).logits.argmax(-1).tolist()
    assert [r["label"] for r in classify(texts)] == [["rotten", "fresh"][i] for i in predicted]
    report = json.loads((out / "report.json").read_text())
    feed_all = {k: v.numpy() for k, v in batch.items()}
    variants = [v for v in ("fp32", "optimized", "int8", "int8_static") if v in report["export"]]
    for variant in variants:
        session = ort.InferenceSession(str(out / "onnx" / variant / "model.onnx"), providers=["CPUExecutionProvider"])
        feed = {i.name: feed_all[i.name].astype(np.int64) for i in session.get_inputs()}
        logits = session.run(["logits"], feed)[0]
        assert logits.shape == (len(texts), 2), variant
        if not variant.startswith("int8"):  # int8 may flip a close call; its gate is checked in the report
            assert logits.argmax(-1).tolist() == predicted, variant


@pytest.mark.slow
def test_mpnet_base_narrows_its_residual_stream_end_to_end(tmp_path, cache_dir) -> None:
    """all-mpnet-base-v2 (`make setup-base`) on a slice of Rotten Tomatoes, its 768 channels cut to 512 in one
    step with a quarter of its heads: masked == pruned == ONNX fp32, ONNX int8 gated, the saved model reloads in
    plain transformers through the shipped code and in compressor, 512 wide (`test_width.check_narrowed_slice`)."""
    from test_width import check_narrowed_slice, narrowed_slice

    torch.set_num_threads(2)
    report = narrowed_slice(tmp_path / "out", "builtin:mpnet-base", 512, 3e-5)
    check_narrowed_slice(report, tmp_path / "out" / "model", (768, 512))
