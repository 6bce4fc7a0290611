"""The original's exports, cached across runs (`compressor.deploy.cache`): keyed by what they read, copied into the
run on a hit with the manifest's paths pointing there, built and stored on a miss."""

from __future__ import annotations

import json

import torch

from compressor.deploy import cache
from compressor.deploy.cache import MANIFEST, cached_export, export_key
from compressor.testing import tiny_batch, tiny_model


def test_the_key_changes_with_every_input_it_reads(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    model, batches, settings = tiny_model("bert"), [tiny_batch(seed=1)], {"variants": ["int8"]}
    key = export_key(model, batches, settings)
    assert key == export_key(tiny_model("bert"), [tiny_batch(seed=1)], {"variants": ["int8"]}), "stable"
    with torch.no_grad():
        changed = tiny_model("bert")
        changed.classifier.bias.add_(1e-3)
    assert export_key(changed, batches, settings) != key
    assert export_key(model, [tiny_batch(seed=2)], settings) != key
    assert export_key(model, batches, {"variants": ["int8", "fp32"]}) != key
    monkeypatch.setattr(cache, "GRAPHS", cache.GRAPHS + 1)  # a compressor that writes its graphs otherwise
    assert export_key(model, batches, settings) != key
    monkeypatch.undo()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert export_key(model, batches, settings) == key
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")  # another CPU as far as int8 is concerned
    assert export_key(model, batches, settings) != key


def test_a_hit_is_copied_into_the_run_without_building(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESSOR_CACHE", str(tmp_path / "cache"))
    builds = []

    def build(out_dir):
        builds.append(out_dir)
        (out_dir / "int8").mkdir(parents=True)
        (out_dir / "int8" / "model.onnx").write_bytes(b"graph")
        result = {"int8": {"dir": str(out_dir / "int8"), "file": str(out_dir / "int8" / "model.onnx"), "n": 3}}
        (out_dir / MANIFEST).write_text(json.dumps(result))
        return result

    first = cached_export("k", tmp_path / "run1" / "onnx-original", build)
    second = cached_export("k", tmp_path / "run2" / "onnx-original", build)
    assert builds == [tmp_path / "run1" / "onnx-original"], "the second run reads the cache"
    assert second["int8"] == {**first["int8"], "dir": str(tmp_path / "run2/onnx-original/int8"),
                              "file": str(tmp_path / "run2/onnx-original/int8/model.onnx")}  # fmt: skip
    assert (tmp_path / "run2/onnx-original/int8/model.onnx").read_bytes() == b"graph"
    assert json.loads((tmp_path / "run2/onnx-original" / MANIFEST).read_text()) == second
    stored = json.loads((tmp_path / "cache/exports/k" / MANIFEST).read_text())
    assert stored["int8"]["file"] == "int8/model.onnx", "the cache names no path of the run that made it"
    cached_export("other", tmp_path / "run3" / "onnx-original", build)
    assert len(builds) == 2
