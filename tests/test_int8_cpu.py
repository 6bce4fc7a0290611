"""Every int8 figure names the CPU's int8 features: the bench result and its report.md, the frontier rows and table,
the run report's bench table and `compressor pick`'s output."""

from __future__ import annotations

import json

import pytest
from conftest import family_report
from test_export import CHECK, saved_model
from typer.testing import CliRunner

import compressor.bench as bench
from compressor.bench.frontier import Point, frontier
from compressor.bench.render import render_bench_md
from compressor.cli import app
from compressor.core.candidates import ORIGINAL_NAME, CandidateName
from compressor.core.machine import cpu_summary, int8_features
from compressor.deploy.export import export_onnx
from compressor.recipe import parse_recipe
from compressor.report.family import _frontier_table
from compressor.report.summary import _bench_table
from compressor.surgery.checkpoint import load_pruned

SAPPHIRE = {"model": "Xeon (test)", "vendor": "GenuineIntel", "cores": 2, "vnni": True,
            "flags": ["avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"]}  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["avx2"], "AVX2"),
        (["avx2", "avx512f"], "AVX2, AVX-512"),
        (SAPPHIRE["flags"], "AVX2, AVX-512, VNNI, AVX-VNNI, AMX"),
        ([], "no AVX2"),
        (None, "flags unknown"),
    ],
)
def test_int8_features_in_words(flags, expected):
    assert int8_features({**SAPPHIRE, "flags": flags}) == expected


@pytest.mark.parametrize(
    ("cap", "vnni", "expected"),
    [
        ("", True, ["avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"]),
        ("avx2", False, ["avx2"]),
        ("AVX2_VNNI", True, ["avx2", "avx_vnni"]),
        ("AVX512_CORE", False, ["avx2", "avx512f"]),
        ("AVX512_CORE_VNNI", True, ["avx2", "avx512f", "avx512_vnni"]),
    ],
)
def test_under_an_isa_cap_compressor_sees_the_cpu_it_caps_to(tmp_path, monkeypatch, cap, vnni, expected):
    """A Sapphire Rapids flags line read under `ONEDNN_MAX_CPU_ISA`: the flags, VNNI and the int8 weight range are
    those of the CPU it caps to, and the identity that keys latency tables names the cap."""
    from compressor.core.machine import cpu_has_vnni, cpu_identity, cpu_summary
    from compressor.deploy.quantize import REDUCE_RANGE_ENV, resolve_reduce_range

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Xeon (test)\nflags\t\t: sse2 avx avx2 fma " + " ".join(SAPPHIRE["flags"]) + "\n")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    monkeypatch.delenv(REDUCE_RANGE_ENV, raising=False)
    assert cpu_summary(cpuinfo)["flags"] == expected and cpu_has_vnni(cpuinfo) is vnni
    assert resolve_reduce_range("auto", cpuinfo)[0] is not vnni
    assert cpu_identity(cpuinfo).endswith(f"capped at {cap.upper()}" if cap else "]")


@pytest.mark.parametrize(
    ("flags", "cap", "expected"),
    [
        ("sse2 avx avx2 fma", "", False),  # an AVX2-only CPU: a cap at AVX2 changes nothing
        ("sse2 avx avx2 fma avx_vnni", "", True),
        ("sse2 avx avx2 fma " + " ".join(SAPPHIRE["flags"]), "", True),
        ("sse2 avx avx2 fma " + " ".join(SAPPHIRE["flags"]), "avx2", False),  # already run as an AVX2 CPU
        ("neon asimd", "", None),
    ],
)
def test_above_avx2_says_whether_an_avx2_cap_changes_the_run(tmp_path, monkeypatch, flags, cap, expected):
    from compressor.core.machine import above_avx2

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"model name\t: test\nflags\t\t: {flags}\n")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert above_avx2(cpuinfo) is expected


def test_int8_features_default_to_this_machine():
    assert int8_features() == int8_features(cpu_summary())


def test_every_int8_figure_names_the_cpus_int8_features(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "cpu_summary", lambda: dict(SAPPHIRE))
    features = "AVX2, AVX-512, VNNI, AVX-VNNI, AMX"
    model_dir = saved_model(tmp_path, "bert", {0: [1]})
    exported = export_onnx(model_dir, tmp_path / "onnx", ["fp32", "int8"], CHECK)
    original = bench.runtime_candidate(ORIGINAL_NAME, "pytorch", load_pruned(model_dir), [11])
    candidates, points = [original], [Point.of(CandidateName.original(), None)]
    for runtime in ("onnx-fp32", "onnx-int8"):
        cid = CandidateName("m", "member", runtime)
        variant = exported[runtime.removeprefix("onnx-")]["dir"]
        candidates.append(bench.runtime_candidate(cid.name, runtime, variant, [11], 1, original))
        points.append(Point.of(cid, variant))
    spec = parse_recipe({"bench": {"batch_sizes": [2], "seq_len": 11, "rounds": 1, "warmup": 0}}).bench
    result = bench.bench(candidates, CHECK, spec.model_copy(update={"min_time_s": 0.001}), None)

    assert result["cpu"]["int8_features"] == features and result["cpu"]["model"] == "Xeon (test)"
    assert result["summary"]["m/onnx-int8"]["cpu_int8_features"] == features
    assert "cpu_int8_features" not in result["summary"]["m/onnx-fp32"], "fp32 figures carry no int8 note"
    md = render_bench_md(result)
    assert f"CPU: Xeon (test), 2 cores; int8 features: {features}" in md
    assert f"| m/onnx-int8 (int8; CPU: {features}) |" in md and "| m/onnx-fp32 |" in md
    table = "\n".join(_bench_table(result))
    assert f"int8 features: {features}" in table and f"m/onnx-int8 (int8; CPU: {features})" in table
    result["cpu"]["generation"] = "family 6 model 143"  # a result from a CPU whose cpuinfo gives its generation
    assert f"CPU: Xeon (test) (family 6 model 143), 2 cores; int8 features: {features}" in render_bench_md(result)

    rows = frontier(result["summary"], points)
    by_name = {r["name"]: r for r in rows}
    assert by_name["m/onnx-int8"]["cpu_int8_features"] == features
    assert by_name["m/onnx-fp32"]["cpu_int8_features"] is None
    assert f"onnx-int8 (int8; CPU: {features})" in "\n".join(_frontier_table(rows))

    (tmp_path / "report.json").write_text(json.dumps(family_report(rows)))
    for runtime, noted in (("onnx-int8", True), ("onnx-fp32", False)):
        cli = CliRunner().invoke(app, ["pick", str(tmp_path), "--max-drop", "none", "--runtime", runtime])
        assert cli.exit_code == 0, cli.output
        assert (f"int8 measured on a CPU with {features}" in cli.output) is noted


def test_the_original_quantized_is_on_every_frontier_by_default():
    """`bench.quantize_only` (declared: ORT int8 and OpenVINO int8) adds the original's int8 exports to what a run
    benchmarks beside its members, one-target or family; [] or export disabled adds none."""
    from compressor.core.runtimes import QUANTIZE_ONLY
    from compressor.pipeline.stages import with_quantize_only
    from compressor.recipe import RecipeError

    recipe = parse_recipe({})
    assert recipe.bench.quantize_only == list(QUANTIZE_ONLY) == ["onnx-int8", "openvino-int8"]
    assert with_quantize_only(recipe, ["fp32", "int8"]) == ["fp32", "int8", "openvino-int8"]
    assert with_quantize_only(parse_recipe({"bench": {"quantize_only": []}}), ["int8"]) == ["int8"]
    assert with_quantize_only(parse_recipe({"export": {"enabled": False}}), []) == []
    with pytest.raises(RecipeError, match=r"bench\.quantize_only: .*'pytorch' runs no export"):
        parse_recipe({"bench": {"quantize_only": ["pytorch"]}})


@pytest.mark.parametrize(("vnni", "unpaid"), [(False, {"openvino-int8"}), (True, set()), (None, set())])
def test_a_runtime_whose_int8_cannot_pay_here_is_left_out_of_the_bench_in_one_line(monkeypatch, vnni, unpaid):
    """OpenVINO's int8 needs VNNI or AMX: on a CPU known to lack them its candidates leave the bench (one line, naming
    the CPU's features); a speed-up budget measured on it keeps it (the user asked); unknown flags keep it."""
    from types import SimpleNamespace

    from compressor.core import machine
    from compressor.core.runtimes import NAMES, cannot_pay
    from compressor.pipeline.measure import unpaid_runtimes

    monkeypatch.setattr(machine, "cpu_has_vnni", lambda: vnni)
    assert {name for name in NAMES if cannot_pay(name)} == unpaid
    for name in unpaid:
        assert "need VNNI or AMX" in cannot_pay(name) and "\n" not in cannot_pay(name)
        assert f"({machine.int8_features()})" in cannot_pay(name)
    run = SimpleNamespace(recipe=parse_recipe({"prune": {"budget": {"kind": "heads", "value": 0.5}}}))
    assert set(unpaid_runtimes(run)) == unpaid
    budget = {"kind": "speedup", "value": 2.0, "runtime": "openvino-int8"}
    asked = parse_recipe({"prune": {"units": ["heads"], "budget": budget}, "export": {"variants": ["openvino-int8"]}})
    assert unpaid_runtimes(SimpleNamespace(recipe=asked)) == {}
