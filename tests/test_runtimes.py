"""Runtime declarations (`compressor.core.runtimes`) and candidate names (`compressor.core.candidates`): every
declared runtime is built by export, benchmarked and chosen by `compressor pick`; every name parses back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import family_report
from test_export import CHECK, int8_tol, saved_model
from typer.testing import CliRunner

from compressor import bench
from compressor.bench.frontier import Point, frontier, slower_than_source
from compressor.cli import app
from compressor.core import runtimes
from compressor.core.candidates import KINDS, ORIGINAL_NAME, SINGLE, CandidateName, name_of
from compressor.core.errors import UserError
from compressor.deploy.export import VARIANTS, export_onnx
from compressor.deploy.quantize import INT8_VARIANTS, Int8Options
from compressor.pruning.latency import BUDGET_RUNTIMES, Dims
from compressor.pruning.latency.probe import runner
from compressor.pruning.latency.table import cache_key
from compressor.recipe import RecipeError, parse_recipe
from compressor.surgery.checkpoint import load_pruned
from compressor.testing import int8_tolerance


def _every_name() -> list[CandidateName]:
    out = [CandidateName.original(r) for r in runtimes.NAMES]
    for runtime in runtimes.NAMES:
        for model in ("2x", "50pct", SINGLE):
            out += [CandidateName(model, "member", runtime), CandidateName(model, "baseline", runtime)]
        out.append(CandidateName("distilbert", "reference", runtime))
    return out


def test_every_candidate_name_parses_back_and_is_unique():
    names = _every_name()
    assert {c.kind for c in names} == set(KINDS)
    assert all(CandidateName.parse(c.name) == c for c in names)
    assert len({c.name for c in names}) == len(names)


def test_one_target_and_family_spellings_are_kept():
    """report.json's candidate names as users' scripts read them."""
    assert ORIGINAL_NAME == "pytorch-original" and CandidateName.original("onnx-int8").name == "onnx-int8-original"
    assert name_of(SINGLE, "member") == "pytorch-pruned" and name_of(SINGLE, "member", "onnx-int8") == "onnx-int8"
    assert name_of(SINGLE, "baseline") == "pytorch-layer-drop"
    assert name_of("2x", "member") == "2x/pytorch" and name_of("2x", "member", "onnx-fp32") == "2x/onnx-fp32"
    assert name_of("2x", "baseline") == "2x/layer-drop"
    assert name_of("bert", "reference", "onnx-int8") == "reference/bert/onnx-int8"
    for foreign in ("pytorch-reference", "onnx-tflite", "2x/tflite", "a/b/c", "/pytorch", "pytorch"):
        assert CandidateName.parse(foreign) is None


def test_undeclared_runtime_is_refused():
    with pytest.raises(UserError, match="candidate runtime: expected one of pytorch, onnx-fp32"):
        CandidateName("2x", "member", "tensorrt")
    with pytest.raises(RecipeError, match="runtime"):
        parse_recipe({"prune": {"budget": {"kind": "speedup", "value": 2.0, "runtime": "tensorrt"}}})


def test_readers_take_their_values_from_the_declarations():
    """What each reader offers, spelled out: a declaration lost or a reader with its own list fails here."""
    assert set(VARIANTS) == {
        "fp32",
        "optimized",
        "int8",
        "int8_static",
        "openvino-fp32",
        "openvino-int8",
        "pytorch-int8",
    }
    assert INT8_VARIANTS == ("int8", "int8_static") and runtimes.engine_variants("openvino", gated=True) == (
        "openvino-int8",
    )
    assert set(runtimes.GATED_VARIANTS) == {"int8", "int8_static", "openvino-int8", "pytorch-int8"}
    assert set(runtimes.CALIBRATED_VARIANTS) == {"int8_static", "openvino-int8"}
    assert {(r.name, r.optimizes) for r in runtimes.RUNTIMES if r.optimizes} == {("onnx-optimized", "onnx-fp32")}
    timed = {"pytorch", "onnx-fp32", "onnx-int8", "openvino-fp32", "openvino-int8", "pytorch-int8"}
    assert set(BUDGET_RUNTIMES) == timed
    assert [e.name for e in runtimes.engines()] == ["pytorch", "onnx", "openvino", "pytorch"]  # in `order`
    for name in runtimes.BUDGET_NAMES:  # a speed-up budget on each is a valid recipe
        budget = {"kind": "speedup", "value": 2.0, "runtime": name}
        variant = runtimes.runtime(name).variant
        export = {"variants": ["fp32", variant] if variant else ["fp32"]}  # measured on the run's own export
        parse_recipe({"prune": {"units": ["heads"], "budget": budget}, "export": export})
    for name in set(runtimes.NAMES) - set(runtimes.BUDGET_NAMES):  # one the latency table cannot time is refused
        budget = {"kind": "speedup", "value": 2.0, "runtime": name}
        with pytest.raises(RecipeError, match="budget.runtime"):
            parse_recipe({"prune": {"units": ["heads"], "budget": budget}})
    with pytest.raises(RecipeError, match="export.variants") as err:
        parse_recipe({"export": {"variants": ["fp32", "tflite"]}})
    assert "\n" not in str(err.value).strip()


def test_a_runtime_registered_twice_is_refused_and_the_registry_is_unchanged():
    before = runtimes.NAMES
    engine = runtimes.engine_of("pytorch")
    for clash in (runtimes.Runtime("pytorch", "pytorch"), runtimes.Runtime("onnx-x", "onnx", "int8")):
        with pytest.raises(ValueError, match="already registered"):
            runtimes.register(engine, clash)
    assert runtimes.NAMES == before


@pytest.mark.parametrize("name", runtimes.BUDGET_NAMES)
def test_a_latency_table_is_keyed_on_its_engines_versions(name, monkeypatch):
    """A table is rebuilt when what runs its runtime is upgraded: its engine's versions are in the cache key."""
    engine = runtimes.engine_of(name)
    if engine.missing() is not None:
        pytest.skip(engine.missing())
    versions = engine.versions()
    assert versions and all(isinstance(v, str) and v for v in versions.values())
    dims = Dims(hidden=8, heads=2, head_size=4, intermediate=16, layers=1, vocab=10, positions=16, num_labels=2)
    key = cache_key(dims, name, 1, 8, 1, [0, 2], [0, 16])
    assert versions.items() <= key.items()
    monkeypatch.setattr(type(engine), "versions", lambda self: {k: v + "+upgraded" for k, v in versions.items()})
    assert cache_key(dims, name, 1, 8, 1, [0, 2], [0, 16]) != key


@pytest.mark.parametrize("name", runtimes.BUDGET_NAMES)
def test_every_budget_runtime_times_a_module(name, tmp_path):
    """The latency table and the in-run check can run a module on each runtime a budget may name."""
    torch.manual_seed(0)
    module, example = torch.nn.Linear(16, 4).eval(), torch.randn(3, 16)
    out = runner(module, example, name, 1, tmp_path)()
    out = out[0] if isinstance(out, list) else out
    with torch.inference_mode():
        expected = module(example).numpy()
    tol = 1e-5
    if runtimes.runtime(name).gated:  # OpenVINO's int8 is calibrated on the example itself
        calibrate = (lambda: module(example)) if runtimes.runtime(name).engine == "openvino" else None
        tol = int8_tolerance(module, lambda: module(example), calibrate)
    assert np.asarray(out).shape == expected.shape
    assert np.abs(np.asarray(out) - expected).max() <= tol


def test_every_runtime_is_exported_benched_and_picked(tmp_path):
    """Each registered runtime: its variant built by its engine, loaded with logits close to PyTorch's (int8 ones
    within `int8_tolerance`), benchmarked against the original, and `compressor pick --runtime` choosing it from the
    frontier."""
    model_dir = saved_model(tmp_path, "bert", {0: [1], 2: [0, 3]})
    variants = [r.variant for r in runtimes.RUNTIMES if r.variant is not None]
    exported = export_onnx(model_dir, tmp_path / "onnx", variants, CHECK, int8=Int8Options(calibration=CHECK))
    assert sorted(exported) == sorted(variants)
    seq = [11]
    original = bench.runtime_candidate(ORIGINAL_NAME, "pytorch", load_pruned(model_dir), seq)
    candidates, points = [original], [Point.of(CandidateName.original(), None)]
    for rt in runtimes.RUNTIMES:
        cid = CandidateName("m", "member", rt.name)
        source = model_dir if rt.variant is None else exported[rt.variant]["dir"]
        candidates.append(bench.runtime_candidate(cid.name, rt.name, source, seq, 1, original))
        points.append(Point.of(cid, str(source)))
    expected = candidates[0].predict(CHECK[0])
    for candidate in candidates[1:]:  # each engine's classifier reproduces PyTorch (int8: within the simulated int8)
        rt = runtimes.runtime(CandidateName.parse(candidate.name).runtime)
        tol = int8_tol(model_dir, [CHECK[0]], CHECK if rt.calibrated else None) if rt.gated else 1e-4
        assert np.abs(candidate.predict(CHECK[0]) - expected).max() <= tol, candidate.name
    spec = parse_recipe({"bench": {"batch_sizes": [2], "seq_len": 11, "rounds": 1, "warmup": 0}}).bench
    result = bench.bench(candidates, CHECK, spec.model_copy(update={"min_time_s": 0.001}), None)
    rows = frontier(result["summary"], points)
    assert {r["runtime"] for r in rows if r["role"] == "member"} == set(runtimes.NAMES)
    (tmp_path / "report.json").write_text(json.dumps(family_report(rows)))
    slower = slower_than_source(rows)  # an optimised graph timed slower than its source is never picked
    for name in runtimes.NAMES:
        cli = CliRunner().invoke(app, ["pick", str(tmp_path), "--max-drop", "none", "--runtime", name, "--json"])
        if name_of("m", "member", name) in slower:
            assert cli.exit_code == 1 and "it was built from: never picked" in cli.output, cli.output
            continue
        assert cli.exit_code == 0, cli.output
        assert json.loads(cli.output)["name"] == name_of("m", "member", name)
