"""`pytorch-int8`: the saved model in PyTorch with its `nn.Linear` layers dynamically quantised to int8.

What many users try first: int8 weights (per output channel unless `export.int8.per_channel` is false), activations
quantised per batch at run time, no calibration, no export to another runtime. Built with
`torch.ao.quantization.quantize_dynamic`, the route whose int8 kernels (fbgemm / oneDNN) run eagerly on the CPU.
torch marks that module deprecated in favour of torchao, whose int8 dynamic quantisation (`quantize_` with
`Int8DynamicActivationInt8WeightConfig`) is made for `torch.compile` and runs far slower than fp32 eagerly on a CPU;
the deprecation notes are silenced here, and the move is for when torchao's eager CPU path pays.

The variant directory is a copy of the saved model plus `pytorch_int8.json` (how it is quantised): quantisation
without calibration is deterministic, so loading quantises it again, the same way. Like every int8 variant it is
checked against PyTorch's logits and, with validation batches, gated on accuracy and agreement against the fp32
model (`compressor.deploy.quantize.gate`); a rejected variant stays on disk and is never picked. It has no fp32
fallback search (`export.int8.fallback_nodes` names ONNX nodes). Threads are the process's, set through torch.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from compressor.core.runtimes import Runtime, register
from compressor.deploy.engines.pytorch import PyTorchEngine, TorchClassifier

VARIANT = "pytorch-int8"
SETTINGS = "pytorch_int8.json"


def quantized(model, per_channel: bool = True):
    """A copy of `model` with every `nn.Linear` dynamically quantised to int8 (`model` itself is left as it is)."""
    import torch

    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notes (see the module docstring)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*quantize_per_(tensor|channel).*")
        from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

        qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
        return quantize_dynamic(model, {torch.nn.Linear: qconfig}, dtype=torch.qint8, inplace=False)


def int8_size(model) -> int:
    """Bytes of the quantised model's state dict as `torch.save` writes it (int8 weights, packed)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


class PyTorchInt8Engine(PyTorchEngine):
    """The PyTorch engine's int8 runtime: build = copy and gate, load and time = quantise dynamically."""

    order = 3

    def versions(self) -> dict[str, str]:
        import torch

        return {**super().versions(), "torch_quantized_engine": torch.backends.quantized.engine}

    def build(self, job, wanted: list[str]) -> dict[str, dict]:
        """The variant: the saved model copied with its settings, checked against PyTorch and gated (`job.options`)."""
        import shutil

        from compressor.core.runtimes import engine_of, runtime
        from compressor.deploy.inference import compare, evaluate_variant
        from compressor.deploy.quantize import gate, status

        if VARIANT not in wanted:
            return {}
        dest = job.tmp / VARIANT
        shutil.copytree(job.model_dir, dest)
        (dest / SETTINGS).write_text(json.dumps({"per_channel": job.options.per_channel, "dtype": "qint8"}))
        classifier = self.load(RUNTIME, dest)
        entry = {
            "dir": str(job.out_dir / VARIANT),
            "file": str(job.out_dir / VARIANT / SETTINGS),
            "size_bytes": classifier.size_bytes,
            **compare(evaluate_variant(classifier, job.batches), job.reference),
            "quantized_from": "pytorch",
            "weights": f"int8 {'per channel' if job.options.per_channel else 'per tensor'}, activations dynamic",
            "per_channel": job.options.per_channel,
        }
        if job.options.validation:
            fp32_model = engine_of("pytorch").load(runtime("pytorch"), job.model_dir)
            fp32 = evaluate_variant(fp32_model, job.options.validation)
            int8 = evaluate_variant(classifier, job.options.validation)
            entry["gate"] = gate(int8, fp32, job.options.max_drop, job.options.min_agreement)
        entry["status"] = status(entry)
        return {VARIANT: entry}

    def load(self, runtime: Runtime, source: Path, threads: int | None = None) -> TorchClassifier:
        """The saved model at `source`, quantised as its `pytorch_int8.json` says."""
        settings = json.loads((Path(source) / SETTINGS).read_text()) if (Path(source) / SETTINGS).is_file() else {}
        model = quantized(super().load(runtime, source).model, settings.get("per_channel", True))
        return TorchClassifier(model, int8_size(model))

    def timer(self, runtime: Runtime, module, example, threads: int | None, workdir: Path):
        """`module` quantised (a copy), run on `example` in this process's PyTorch."""
        return super().timer(runtime, quantized(module).eval(), example, threads, workdir)


RUNTIME = Runtime(
    "pytorch-int8",
    "pytorch",
    VARIANT,
    gated=True,
    budget=True,
    description="PyTorch, dynamic int8 of the Linear layers (torch.ao.quantization.quantize_dynamic)",
)
PYTORCH_INT8 = register(PyTorchInt8Engine(), RUNTIME)
