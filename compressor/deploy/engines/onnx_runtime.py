"""The ONNX Runtime engine: the traced fp32 graph, ORT's fused graph and two int8 graphs, on CPU sessions.

Export builds them (`compressor.deploy.export.build_onnx`: fp32 always, as it is the parity gate and the source of
every other variant; int8 gated by `compressor.deploy.quantize`); the bench loads a variant directory in an
`OnnxClassifier`; the latency table times a module traced to a graph (dynamic int8 of it for `onnx-int8`).
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from compressor.core.runtimes import Engine, Runtime, register


def onnx_graph(module, example, workdir: Path) -> Path:
    """`module` traced on `example` to an ONNX graph under `workdir` (input "x", output "y")."""
    import torch

    from compressor.core import compat

    fp32 = Path(tempfile.mkdtemp(dir=workdir)) / "model.onnx"
    with warnings.catch_warnings(), compat.traceable(module):  # the tracer's deprecation notes; a static graph
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(fp32), input_names=["x"], output_names=["y"], dynamo=False)
    return fp32


class OnnxRuntimeEngine(Engine):
    """ONNX Runtime's CPU execution provider over the exported graphs."""

    name = "onnx"
    order = 1

    def versions(self) -> dict[str, str]:
        """ONNX Runtime's version, the session fusions our sessions leave off and the spinning setting of the tables'
        sessions (`timer`): a table timed otherwise is redone."""
        import onnxruntime

        from compressor.deploy.inference import SLOW_CPU_FUSIONS

        return {"onnxruntime": onnxruntime.__version__, "fusions_off": ",".join(SLOW_CPU_FUSIONS), "spinning": "off"}

    def build(self, job, wanted: list[str]) -> dict[str, dict]:
        from compressor.deploy.export import build_onnx

        return build_onnx(job)

    def load(self, runtime: Runtime, source: Path, threads: int | None = None):
        from compressor.deploy.inference import OnnxClassifier

        return OnnxClassifier(source, threads)

    def timer(self, runtime: Runtime, module, example, threads: int | None, workdir: Path) -> Callable[[], object]:
        """`module` on `example` in an ONNX Runtime session over its traced graph (dynamic-int8 quantised for a
        gated, i.e. int8, runtime), with ONNX Runtime's session-level optimisations only. Its worker threads do not
        spin between runs (`inference.SPINNING`): a latency table times dozens of these sessions in turn, and threads
        left spinning by one would take the cores from the next."""
        from compressor.deploy.inference import OnnxClassifier
        from compressor.deploy.quantize import quantize_graph

        graph = onnx_graph(module, example, workdir)
        if runtime.gated:
            quantize_graph(graph, graph.with_name("int8.onnx"))
            graph = graph.with_name("int8.onnx")
        session = OnnxClassifier(graph, threads, spinning=False).session  # a table keeps dozens alive, timed in turn
        feed = {session.get_inputs()[0].name: example.numpy()}
        return lambda: session.run(None, feed)


ONNX_RUNTIME = register(
    OnnxRuntimeEngine(),
    Runtime("onnx-fp32", "onnx", "fp32", budget=True, description="ONNX Runtime, the exported fp32 graph"),
    Runtime(
        "onnx-optimized",
        "onnx",
        "optimized",
        description="ONNX Runtime, the transformer-fused fp32 graph",
        optimizes="onnx-fp32",
    ),
    Runtime(
        "onnx-int8",
        "onnx",
        "int8",
        gated=True,
        budget=True,
        description="ONNX Runtime, dynamic int8",
        quantize_only=True,
    ),
    Runtime(
        "onnx-int8_static",
        "onnx",
        "int8_static",
        gated=True,
        description="ONNX Runtime, static QDQ int8",
        calibrated=True,
    ),
)
