"""The OpenVINO engine (optional: `compressor[openvino]`): the IR of the fp32 ONNX graph and NNCF's int8 of it.

Export converts ONNX Runtime's parity-gated fp32 graph (`compressor.deploy.openvino.build_variants`); the bench loads
an IR directory in an `OpenVinoClassifier`; the latency table converts a module's traced graph (NNCF int8 of it,
calibrated on the example, for `openvino-int8`). Without OpenVINO installed its variants are skipped with one line
(`missing`), and a budget on it is a one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from compressor.core.errors import UserError
from compressor.core.runtimes import Engine, Runtime, register


class OpenVinoEngine(Engine):
    """OpenVINO on the CPU, over IRs converted from the exported fp32 graph."""

    name = "openvino"
    order = 2

    def missing(self) -> str | None:
        from compressor.deploy.openvino import missing

        return missing()

    def versions(self) -> dict[str, str]:
        import openvino

        return {"openvino": openvino.__version__}

    def build(self, job, wanted: list[str]) -> dict[str, dict]:
        from compressor.deploy.openvino import build_variants

        check = (job.batches, job.reference, job.atol)
        return build_variants(job.tmp / "fp32", job.tmp, job.out_dir, wanted, check, job.options)

    def load(self, runtime: Runtime, source: Path, threads: int | None = None):
        from compressor.deploy.openvino import OpenVinoClassifier

        return OpenVinoClassifier(source, threads)

    def timer(self, runtime: Runtime, module, example, threads: int | None, workdir: Path) -> Callable[[], object]:
        """`module` on `example` in OpenVINO: its ONNX graph converted, NNCF int8 (calibrated on `example`) for a
        gated runtime. A budget on OpenVINO without it installed is a one-line error."""
        from compressor.deploy import openvino as ovd
        from compressor.deploy.engines.onnx_runtime import onnx_graph

        reason = ovd.missing()
        if reason is not None:
            raise UserError(f"budget.runtime: {runtime.name} needs OpenVINO; {reason}")
        model = ovd.from_onnx(onnx_graph(module, example, workdir))
        feed = {"x": example.numpy()}
        if runtime.gated:
            model = ovd.nncf_int8(model, [feed])
        request = ovd.compile_on_cpu(model, threads).create_infer_request()
        return lambda: request.infer(feed)[0]


OPENVINO = register(
    OpenVinoEngine(),
    Runtime(
        "openvino-fp32",
        "openvino",
        "openvino-fp32",
        budget=True,
        description="OpenVINO, the IR of the fp32 graph (optional: compressor[openvino])",
    ),
    Runtime(
        "openvino-int8",
        "openvino",
        "openvino-int8",
        gated=True,
        budget=True,
        description="OpenVINO, NNCF static int8 calibrated on training examples (optional: compressor[openvino])",
        quantize_only=True,
        needs_vnni=True,
        calibrated=True,
    ),
)
