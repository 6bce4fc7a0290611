"""The PyTorch engine: the saved (pruned) model itself, run in this process's PyTorch with SDPA attention.

Its one runtime, `pytorch`, has no export variant: the saved model directory is what it runs, and every other
runtime's speed-up is measured against the original on it. Its threads are the process's (`torch.set_num_threads`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from compressor.core.runtimes import Engine, Runtime, register


class TorchClassifier:
    """An eval-mode PyTorch sequence classifier called like the exported ones: batch → logits (numpy). It takes the
    inputs its forward declares; `size_bytes` is what `size_bytes_of` says of it."""

    threads: int | None = None  # the process's PyTorch setting
    threads_note: str | None = None

    def __init__(self, model, size_bytes: int):
        import inspect

        from compressor.sources.batches import input_keys

        self.model = model.eval()
        self.input_names = tuple(input_keys(inspect.signature(self.model.forward).parameters))
        self.size_bytes = int(size_bytes)

    def __call__(self, batch: Mapping) -> Any:
        import torch

        with torch.inference_mode():
            return self.model(**{k: batch[k] for k in self.input_names if k in batch}).logits.float().numpy()


class PyTorchEngine(Engine):
    """The saved model in this process's PyTorch (SDPA attention, as users deploy it)."""

    name = "pytorch"
    order = 0

    def versions(self) -> dict[str, str]:
        import torch

        return {"torch": torch.__version__}

    def load(self, runtime: Runtime, source: Path, threads: int | None = None) -> TorchClassifier:
        """The saved model at `source` (its weights' size on disk); `threads` is the process's, set by the caller."""
        from compressor.surgery.checkpoint import load_pruned

        size = sum(f.stat().st_size for f in Path(source).glob("*.safetensors"))
        return TorchClassifier(load_pruned(source, attn_implementation="sdpa"), size)

    def timer(self, runtime: Runtime, module, example, threads: int | None, workdir: Path) -> Callable[[], object]:
        """`module` on `example` in this process's PyTorch (threads are set by the caller, through torch)."""
        import torch

        def call() -> object:
            with torch.inference_mode():
                return module(example)

        return call


PYTORCH = register(
    PyTorchEngine(),
    Runtime("pytorch", "pytorch", None, budget=True, description="the saved model in PyTorch (SDPA attention)"),
)
