"""Exports of an unpruned original, cached across runs: built once per model, data, settings, CPU and stack.

Every run exports its original to the bench's quantize-only runtimes (ONNX Runtime int8, OpenVINO int8: what a user
gets by quantizing instead of pruning), and that export (parity checks, SmoothQuant, calibration, the int8 gate) is
the same whenever its inputs are. The key is a hash of the inputs themselves, not of their names: the original's
weights, every batch the export reads (parity checks, calibration, the gate's validation), the variants and export
settings, the CPU as far as int8 is concerned (`core.machine.cpu_identity`: the weight range follows VNNI) and the
versions of the libraries that build and check the graphs. A hit is copied into the run, so `compressor pick` finds
the variant in the run directory as it would a fresh export. Only the export is cached: the bench still times the
original's variants in its own interleaved rounds beside the members, since a speed-up is a paired ratio.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from compressor.core import atomic
from compressor.core.machine import cache_root, cpu_identity

log = logging.getLogger("compressor")

STACK = ("compressor", "torch", "transformers", "onnx", "onnxscript", "onnxruntime", "openvino", "nncf")
# What an export writes beyond the libraries' versions; bumped when a graph edit changes it (2: SkipLayerNormalization
# unfused, `deploy.graph.unfuse_skip_norms`), so an upgrade never copies a graph an older compressor wrote.
GRAPHS = 2
MANIFEST = "export.json"


def _versions() -> dict[str, str | None]:
    """The installed version of each library in `STACK` (None where absent)."""
    out: dict[str, str | None] = {}
    for name in STACK:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _hash_tensors(digest, items: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Feed each (name, tensor) to `digest`: name, dtype, shape and bytes."""
    for name, tensor in items:
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def export_key(model: nn.Module, batches: Iterable[Mapping], settings: Mapping) -> str:
    """The cache key of exporting `model` with the batches it reads and `settings` (JSON-able: variants, export
    options), on this CPU and stack."""
    digest = hashlib.sha256()
    _hash_tensors(digest, model.state_dict().items())
    for i, batch in enumerate(batches):
        _hash_tensors(digest, ((f"{i}.{k}", v) for k, v in sorted(batch.items()) if isinstance(v, torch.Tensor)))
    context = {"settings": settings, "cpu": cpu_identity(), "stack": _versions(), "graphs": GRAPHS}
    digest.update(json.dumps(context, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:24]


def _rebased(manifest: dict, rebase: Callable[[Path], Path]) -> dict:
    """`manifest` (an export's result) with the `dir` and `file` of every variant passed through `rebase`."""
    out = {}
    for variant, entry in manifest.items():
        entry = dict(entry)
        for field in ("dir", "file"):
            if isinstance(entry.get(field), str):
                entry[field] = str(rebase(Path(entry[field])))
        out[variant] = entry
    return out


def cached_export(key: str, out_dir: Path, build: Callable[[Path], dict]) -> dict:
    """The export result for `key` in `out_dir`: copied from the cache when it holds the key, else `build(out_dir)`
    and then stored there, its manifest's paths relative to the cached tree."""
    cached = cache_root() / "exports" / key
    if (cached / MANIFEST).is_file():
        log.info("export of the original: cached at %s", cached)
        result = _rebased(json.loads((cached / MANIFEST).read_text()), lambda path: out_dir / path)
        atomic.check_replaceable(out_dir, [p.name for p in cached.iterdir()], "export output")
        with atomic.directory(out_dir) as tmp:
            shutil.copytree(cached, tmp, dirs_exist_ok=True)
            (tmp / MANIFEST).write_text(json.dumps(result, indent=2))
        return result
    result = build(out_dir)
    with atomic.directory(cached) as tmp:
        shutil.copytree(out_dir, tmp, dirs_exist_ok=True)
        relative = _rebased(result, lambda path: path.relative_to(out_dir))
        (tmp / MANIFEST).write_text(json.dumps(relative, indent=2))
    return result
