"""int8 weight range: VNNI detection from /proc/cpuinfo, the recipe's `reduce_range` and what it does to a graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compressor.core.errors import UserError
from compressor.core.machine import cpu_has_vnni
from compressor.deploy.quantize import REDUCE_RANGE_ENV, quantize_graph, resolve_reduce_range
from compressor.recipe import RecipeError, parse_recipe

X86_FLAGS = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2"


def cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


@pytest.mark.usefixtures("uncapped")
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"processor\t: 0\nflags\t\t: {X86_FLAGS}\n\nprocessor\t: 1\nflags\t\t: {X86_FLAGS}\n", False),
        (f"flags\t\t: {X86_FLAGS} avx512f avx512_vnni\n", True),
        (f"flags\t\t: {X86_FLAGS} avx_vnni\n", True),
        (f"flags\t\t: {X86_FLAGS} amx_tile amx_int8\n", True),
        ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp\nCPU implementer\t: 0x41\n", None),  # ARM
        ("", None),
    ],
)
def test_cpu_has_vnni_reads_x86_flags(tmp_path, text, expected):
    assert cpu_has_vnni(cpuinfo(tmp_path, text)) is expected


def test_cpu_has_vnni_without_cpuinfo_is_unknown(tmp_path):
    assert cpu_has_vnni(tmp_path / "absent") is None


@pytest.mark.usefixtures("uncapped")
def test_reduce_range_auto_follows_vnni_and_explicit_settings_win(tmp_path, monkeypatch):
    monkeypatch.delenv(REDUCE_RANGE_ENV, raising=False)  # the suite may run with the weight range forced
    avx2 = cpuinfo(tmp_path, f"flags\t: {X86_FLAGS}\n")
    reduce, why = resolve_reduce_range("auto", avx2)
    assert reduce is True and "without VNNI" in why
    vnni = tmp_path / "vnni"
    vnni.write_text(f"flags\t: {X86_FLAGS} avx512_vnni\n")
    reduce, why = resolve_reduce_range("auto", vnni)
    assert reduce is False and "has VNNI" in why
    reduce, why = resolve_reduce_range("auto", tmp_path / "absent")
    assert reduce is False and "unknown" in why
    assert resolve_reduce_range(False, avx2) == (False, "set explicitly")
    assert resolve_reduce_range(True, vnni) == (True, "set explicitly")


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("true", True), ("False", False)])
def test_reduce_range_env_forces_auto_but_not_an_explicit_setting(tmp_path, monkeypatch, value, expected):
    vnni = cpuinfo(tmp_path, f"flags\t: {X86_FLAGS} avx512_vnni\n")
    monkeypatch.setenv(REDUCE_RANGE_ENV, value)
    reduce, why = resolve_reduce_range("auto", vnni)
    assert reduce is expected and REDUCE_RANGE_ENV in why
    assert resolve_reduce_range(not expected, vnni) == (not expected, "set explicitly")


def test_reduce_range_env_with_another_value_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv(REDUCE_RANGE_ENV, "maybe")
    with pytest.raises(UserError, match=f"{REDUCE_RANGE_ENV}: expected 1 .* got 'maybe'"):
        resolve_reduce_range("auto", cpuinfo(tmp_path, f"flags\t: {X86_FLAGS}\n"))
    monkeypatch.setenv(REDUCE_RANGE_ENV, "")  # empty is unset
    assert resolve_reduce_range("auto", cpuinfo(tmp_path, f"flags\t: {X86_FLAGS}\n"))[0] is True


def matmul_graph(file: Path) -> None:
    """A one-MatMul graph with a weight large enough for the dynamic quantiser to quantise."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
        [numpy_helper.from_array(weight, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(file))


def int8_weight_span(file: Path) -> int:
    """Largest |value| among the graph's int8 initializers (the quantised weights)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    weights = [i for i in onnx.load(str(file)).graph.initializer if i.data_type == TensorProto.INT8 and i.dims]
    assert weights, "no int8 weight in the quantised graph"
    return max(int(np.abs(numpy_helper.to_array(w).astype(np.int32)).max()) for w in weights)


def test_reduce_range_quantises_weights_to_7_bits(tmp_path):
    """7-bit weights stay within ±64 (so u8×s8 pair sums fit 16 bits); full range uses ±127."""
    matmul_graph(tmp_path / "fp32.onnx")
    quantize_graph(tmp_path / "fp32.onnx", tmp_path / "full.onnx", reduce_range=False)
    quantize_graph(tmp_path / "fp32.onnx", tmp_path / "reduced.onnx", reduce_range=True)
    assert int8_weight_span(tmp_path / "full.onnx") == 127
    assert int8_weight_span(tmp_path / "reduced.onnx") <= 64


@pytest.mark.parametrize(("value", "ok"), [("auto", True), (True, True), (False, True), ("maybe", False)])
def test_recipe_reduce_range_field(value, ok):
    data = {"export": {"int8": {"reduce_range": value}}}
    if ok:
        assert parse_recipe(data).export.int8.reduce_range == value
        return
    with pytest.raises(RecipeError, match=r"export\.int8\.reduce_range") as err:
        parse_recipe(data)
    assert "\n" not in str(err.value)


@pytest.mark.usefixtures("uncapped")
def test_cpu_summary_names_vendor_and_the_flags_that_matter(tmp_path):
    from compressor.core.machine import cpu_summary

    info = cpuinfo(
        tmp_path,
        f"vendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
        f"flags\t: {X86_FLAGS} avx512f avx512_vnni\n",
    )
    summary = cpu_summary(info)
    assert summary["vendor"] == "AuthenticAMD" and summary["vnni"] is True
    assert summary["generation"] == "family 26 model 2"  # "model" alone is not mistaken for "model name"
    assert summary["flags"] == ["avx2", "avx512f", "avx512_vnni"] and summary["cores"] >= 1
    assert cpu_summary(tmp_path / "absent")["flags"] is None and cpu_summary(tmp_path / "absent")["generation"] is None


@pytest.mark.usefixtures("uncapped")
def test_cpu_identity_tells_apart_cpus_that_share_a_model_name(tmp_path):
    from compressor.core.machine import cpu_identity

    avx2 = cpu_identity(cpuinfo(tmp_path, f"flags\t: {X86_FLAGS}\n"))
    vnni = tmp_path / "vnni"
    vnni.write_text(f"flags\t: {X86_FLAGS} avx512f avx512_vnni\n")
    assert avx2.endswith("[avx2]") and cpu_identity(vnni).endswith("[avx2 avx512f avx512_vnni]")
    assert avx2 != cpu_identity(vnni) and cpu_identity(tmp_path / "absent").endswith("[flags unknown]")
