"""ONNX export of a saved (pruned) model: fp32, ORT graph-optimised and dynamic-int8 variants, each checked.

`export_onnx` rebuilds the model with `load_pruned` and exports the in-memory model (`deploy.exporters`: torch.export,
the TorchScript tracer as the fallback), so the graph has the actual pruned shapes: uneven head counts per layer and
`EmptyAttention` layers. The fp32 graph must reproduce PyTorch's logits on real batches within `atol` (the parity
gate) before any variant is built; a failure raises `ExportParityError` and writes nothing.

Layout of `out_dir` (each variant directory loads in a bare `onnxruntime.InferenceSession`, inputs `input_ids`,
`attention_mask` and, where the architecture takes them, `token_type_ids`, output `logits`; tokenizer files and
`config.json` sit beside every graph)::

    out_dir/fp32/model.onnx        torch → ONNX, dynamic batch and sequence axes
    out_dir/optimized/model.onnx   ONNX Runtime's fused ops (one fused attention per layer with heads, where it fuses)
    out_dir/int8/model.onnx        dynamic int8 quantisation of the optimised graph (else of fp32)
    out_dir/int8_static/model.onnx static QDQ int8 of the same graph, calibrated on training examples
    out_dir/openvino-fp32/         OpenVINO IR of the fp32 graph (`deploy.openvino`: openvino_model.xml/.bin)
    out_dir/openvino-int8/         NNCF int8 of that IR, calibrated on training examples and gated like ORT's int8
    out_dir/pytorch-int8/          the saved model, quantised on load (`deploy.engines.pytorch_int8`), gated alike
    out_dir/export.json            what `export_onnx` returned

Both int8 variants quantise the same source graph, smoothed first when `Int8Options.smooth_alpha` is set
(`compressor.deploy.smoothing`: activation outliers moved into the weights; the smoothed fp32 graph is not shipped).

Running a graph or the PyTorch model on batches and comparing logits (`OnnxClassifier`, `evaluate_variant`,
`compare`) lives in `deploy.inference`; int8 building, gating and the fp32 fallback in `deploy.quantize`.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from compressor.core import atomic, runtimes
from compressor.core.errors import UserError
from compressor.core.runtimes import VARIANTS as DECLARED_VARIANTS
from compressor.core.runtimes import ExportJob
from compressor.deploy.exporters import EXPORTERS, Exported, export_graph, fused_ops
from compressor.deploy.exporters import reason as error_line
from compressor.deploy.graph import attention_nodes, fusion_label, node_count, unfuse_skip_norms
from compressor.deploy.inference import (
    ONNX_FILE,
    ExportParityError,
    OnnxClassifier,
    check_parity,
    compare,
    evaluate_variant,
    graph_size,
    torch_logits,
)
from compressor.deploy.quantize import (
    CALIBRATED_VARIANTS,
    INT8_VARIANTS,
    Int8Options,
    build_int8,
    fp32_fallback,
    quantize_graph,
    resolve_reduce_range,
)
from compressor.deploy.quantize import gate as int8_gate
from compressor.deploy.quantize import status as int8_status
from compressor.surgery.arch import arch_spec, present_heads
from compressor.surgery.checkpoint import load_pruned
from compressor.surgery.slicing import padded_empty_ffns

# Int8Options, quantize_graph and the inference helpers stay importable from here.
__all__ = [
    "ONNX_FILE",
    "ExportParityError",
    "Int8Options",
    "OnnxClassifier",
    "evaluate_variant",
    "export_onnx",
    "quantize_graph",
    "torch_logits",
]

log = logging.getLogger(__name__)

VARIANTS = DECLARED_VARIANTS  # one per declared runtime that runs an export (`compressor.core.runtimes`)
MANIFEST = "export.json"
# Files of a saved model directory that are not copied next to the graphs (weights, the PyTorch model card).
_NOT_COPIED = ("*.safetensors", "*.bin", "*.safetensors.index.json", "README.md", "config.json", "modeling_*.py")


# ------------------------------------------------------------------------------------------------------ variants


def check_variants(variants: Sequence[str] | str) -> list[str]:
    """Requested variants in canonical order; unknown names (or none) are a one-line error naming the field."""
    names = [variants] if isinstance(variants, str) else list(variants)
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        got = ", ".join(map(repr, unknown)) if unknown else "none"
        raise UserError(f"export.variants: unknown variant {got}; expected some of {', '.join(VARIANTS)}")
    return [v for v in VARIANTS if v in names]


def _copy_side_files(model_dir: Path, dest: Path) -> None:
    """Tokenizer files (and the replayable plan) from the saved model directory, beside the graph."""
    for path in model_dir.iterdir():
        if path.is_file() and not any(path.match(p) for p in _NOT_COPIED):
            shutil.copy2(path, dest / path.name)


def graph_inputs(model: nn.Module) -> list[str]:
    """The graph's input names, in order: token ids, attention mask, and token types where the architecture takes them
    and the model has any (DeBERTa-v3's `type_vocab_size` is 0: its forward ignores them)."""
    types = arch_spec(model).takes_token_types(model.config)
    return ["input_ids", "attention_mask", *(["token_type_ids"] if types else [])]


def _example_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    """Two sequences, one padded, so the traced mask arithmetic is the general one (an all-ones mask may be
    short-cut by transformers and leave padding unhandled in the graph)."""
    vocab = int(getattr(model.config, "vocab_size", 100))
    ids = torch.randint(3, max(vocab, 4), (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return {n: {"input_ids": ids, "attention_mask": mask}.get(n, torch.zeros_like(ids)) for n in graph_inputs(model)}


def export_fp32(
    model: nn.Module, dest: Path, opset: int | None = None, exporter: str = "auto", check: Callable | None = None
) -> Exported:
    """The in-memory model as dest/model.onnx (dynamic batch and sequence axes) and its config.json, written by
    the exporter `exporter` names (`compressor.deploy.exporters`: torch.export first, TorchScript as the fallback).
    `check(file)` raises when a graph is wrong (the parity gate): a wrong graph counts as a failed exporter.

    The model object is exported as built (pruned shapes, `EmptyAttention` layers), never re-loaded from a path. A
    layer left with no FFN neuron is exported with one zero-weight neuron (`padded_empty_ffns`: the same output, no
    zero-sized weight for OpenVINO to refuse).
    """
    dest.mkdir(parents=True, exist_ok=True)
    file = dest / ONNX_FILE
    exported = export_graph(padded_empty_ffns(model).eval(), file, _example_inputs(model), exporter, opset, check)
    if not file.is_file():
        raise RuntimeError(f"export: {exported.exporter} wrote no {ONNX_FILE} in '{dest}'")
    model.config.to_json_file(str(dest / "config.json"))
    return exported


# ------------------------------------------------------------------------------------------------------ export


def _variant_entry(name: str, file: Path, stats: dict, extra: dict, out_dir: Path) -> dict:
    """One result row, with paths as they will be after the temp directory is renamed to `out_dir`."""
    nodes = attention_nodes(file)
    return {
        "dir": str(out_dir / name),
        "file": str(out_dir / name / file.name),
        "size_bytes": graph_size(file),
        "graph_nodes": node_count(file),
        **stats,
        "fused_attention_nodes": sum(len(v) for v in nodes.values()),
        "attention_heads_per_node": [h for v in nodes.values() for h in v],
        **extra,
    }


def _check(file: Path, batches: Sequence[Mapping], reference: dict) -> dict:
    return compare(evaluate_variant(OnnxClassifier(file), batches), reference)


def _fuse(exporter, src: Path, dest: Path, fuse_attention: bool, model_type: str) -> dict:
    """`exporter.fuse` without the fusion ONNX Runtime's CPU kernels run slower than its parts
    (`graph.unfuse_skip_norms`); adds "unfused_ops" (`{op_type: count}`) when it undid one."""
    info = exporter.fuse(src, dest, fuse_attention=fuse_attention, model_type=model_type)
    undone = unfuse_skip_norms(dest)
    return {**info, "fused_ops": fused_ops(dest), "unfused_ops": {"SkipLayerNormalization": undone}} if undone else info


def _build_optimized(fp32: Exported, dest: Path, check: tuple, attention_layers: int, model_type: str, fuses: bool):
    """Optimised graph with fused attention, falling back to the graph without attention fusion when fusion breaks
    parity. `check` is (batches, reference, atol). `fuses` False: ONNX Runtime's optimizer has no fusion for the
    architecture's attention, so a TorchScript graph asks for the other fusions only (onnxscript's fusions, which
    torch.export graphs get, fuse whatever attention they recognise).

    Returns (parity stats, extra result fields); raises `ExportParityError` when even the unfused graph fails.
    """
    (batches, reference, atol), exporter = check, EXPORTERS[fp32.exporter]
    ask = fuses or fp32.exporter != "torchscript"
    info = _fuse(exporter, fp32.file, dest / ONNX_FILE, ask, model_type)
    try:
        stats = _check(dest / ONNX_FILE, batches, reference)
        broken = None if stats["max_abs_diff"] <= atol else f"differed by {stats['max_abs_diff']:.3g}"
    except Exception as error:  # noqa: BLE001  a fused op ONNX Runtime refuses at run time (shapes it cannot take)
        broken = f"failed to run: {error_line(error)}"
    fused = sum(len(v) for v in attention_nodes(dest / ONNX_FILE).values())
    fusion = fusion_label(attention_layers, fused, fuses or fused > 0)
    if fusion in ("partial", "none"):
        log.warning(
            "export: ORT fused attention in %d of the %d layers with heads; the optimised graph may be no faster"
            " than fp32",
            fused,
            attention_layers,
        )
    if broken is not None:
        log.warning("export: fused attention %s; keeping the optimised graph without attention fusion", broken)
        fusion = f"unfused (fused attention {broken})"
        info = _fuse(exporter, fp32.file, dest / ONNX_FILE, False, model_type)
        stats = _check(dest / ONNX_FILE, batches, reference)
        check_parity("optimized", stats, atol)
    return stats, {**info, "attention_fusion": fusion, "attention_layers": attention_layers}


def export_onnx(
    model_dir: str | Path,
    out_dir: str | Path,
    variants: Sequence[str],
    check_batches: Sequence[Mapping[str, torch.Tensor]],
    atol: float = 1e-4,
    opset: int | None = None,
    int8: Int8Options | None = None,
    exporter: str = "auto",
) -> dict[str, dict]:
    """Export a saved (pruned) model to ONNX variants under `out_dir`, each checked against PyTorch.

    fp32 is always exported (it is the parity gate and the source of the others). Its max |Δlogit| against the
    PyTorch model on `check_batches` (dicts with input_ids, attention_mask, maybe token_type_ids and labels) must be
    ≤ `atol`, and so must the optimised graph's; otherwise `ExportParityError` is raised and `out_dir` is left as it
    was. int8 variants (built as `int8` says) report max |Δlogit| and agreement, and with `int8.validation`
    batches also "gate" (validation accuracy vs the fp32 graph, `compressor.deploy.quantize.gate`) and "status":
    accepted, rejected (kept on disk) or ungated. Everything is built in a sibling
    temp directory renamed to `out_dir` when complete (a previous export there is replaced).

    Returns `{variant: {"dir", "file", "size_bytes", "max_abs_diff", "agreement", "check_accuracy",
    "pytorch_check_accuracy", "check_examples", "graph_nodes", "fused_attention_nodes", "attention_heads_per_node",
    ...}}`; "optimized" adds "attention_fusion" ("full", "partial", "none", "n/a (...)" or "unfused (...)"),
    "attention_layers", "fused_ops" (`{op_type: count}` of the optimizer's fusions: Attention,
    EmbedLayerNormalization, BiasGelu, ...) and "unfused_ops" (`{"SkipLayerNormalization": n}`, the fusion undone
    because ONNX Runtime's CPU kernel for it is slower than its parts); the int8 variants add "quantized_from" (the
    graph they quantise: "optimized" when it was built, its fused Attention becoming QAttention, else "fp32").
    Every registered engine builds its requested variants in turn (`compressor.deploy.engines`).
    """

    names = check_variants(variants)
    for wanted, reason in runtimes.unavailable(names):  # an optional package absent: one log line, the rest built
        log.warning("export: %s skipped: %s", ", ".join(wanted), reason)
        names = [n for n in names if n not in wanted]
    options = int8 or Int8Options()
    calibrated = [n for n in CALIBRATED_VARIANTS if n in names]
    if calibrated and not options.calibration:
        raise UserError(f"export.int8: {calibrated[0]} needs calibration batches; expected training examples")
    if not check_batches:
        raise UserError("export: no check batches given; expected real evaluation batches for the parity gate")
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    atomic.check_replaceable(out_dir, (*VARIANTS, MANIFEST), "export output")
    model = load_pruned(model_dir, attn_implementation="eager")  # eager traces to the pattern ORT fuses
    reference = evaluate_variant(lambda b: torch_logits(model, b), check_batches)

    with atomic.directory(out_dir) as tmp:
        how = (atol, opset, options, exporter)
        job = ExportJob(model, model_dir, tmp, out_dir, names, check_batches, reference, *how)
        for engine in runtimes.engines():  # in `order`: ONNX Runtime's fp32 graph before OpenVINO converts it
            wanted = [r.variant for r in runtimes.declared(engine) if r.variant in names]
            for name, entry in engine.build(job, wanted).items():
                if "status" in entry:
                    _log_int8(name, entry)
                job.built[name] = entry
        (tmp / MANIFEST).write_text(json.dumps(job.built, indent=2))
    return job.built


def build_onnx(job: ExportJob) -> dict:
    """ONNX Runtime's variants: fp32 (always: the parity gate and the source of the others), the optimised graph and
    the int8 graphs when requested (`compressor.deploy.engines.onnx_runtime`)."""
    attention_layers = sum(1 for heads in present_heads(job.model) if heads)
    check = (job.batches, job.reference, job.atol)
    dirs = (job.tmp, job.out_dir)
    results = _build_all(job.model, job.model_dir, dirs, job.names, check, job.opset, attention_layers, job.exporter)
    results.update(_build_int8(job.tmp, job.out_dir, job.names, results, job.batches, job.reference, job.options))
    return results


def _build_all(model, model_dir, dirs: tuple, names, check: tuple, opset, attention_layers, exporter: str) -> dict:
    """fp32 (parity-gated), then the optimised variant if requested, each in its own directory under `tmp`.
    `dirs` is (tmp, out_dir): where the variants are built and where they will be; `check` is (batches, the
    PyTorch reference's outputs on them, atol), the parity check every variant passes. A graph failing parity
    counts as a failed exporter: "auto" then tries the next one (`deploy.exporters.export_graph`)."""
    (tmp, out_dir), (batches, reference, atol) = dirs, check
    parity = {}

    def gate(file: Path) -> None:
        parity.update(_check(file, batches, reference))
        check_parity("fp32", parity, atol)

    fp32 = export_fp32(model, tmp / "fp32", opset, exporter, gate)
    _copy_side_files(model_dir, tmp / "fp32")
    results = {"fp32": _variant_entry("fp32", fp32.file, dict(parity), fp32.record(), out_dir)}
    if "optimized" in names:
        dest = _sibling_dir(tmp, "optimized", tmp / "fp32")
        fusion = arch_spec(model).ort_fusion()
        stats, extra = _build_optimized(fp32, dest, check, attention_layers, fusion.model_type, fusion.fuses_attention)
        results["optimized"] = _variant_entry("optimized", dest / ONNX_FILE, stats, extra, out_dir)
    return results


def _build_int8(tmp, out_dir, names, built: dict, batches, reference: dict, options: Int8Options) -> dict:
    """The requested int8 variants of the last float graph built (optimised, else fp32), each checked and gated; a
    variant failing its gate gets `options.fallback_nodes` tries at keeping its most error-prone nodes in fp32."""
    wanted = [n for n in INT8_VARIANTS if n in names]
    if not wanted:
        return {}
    source_name = "optimized" if "optimized" in built else "fp32"
    source = tmp / source_name / ONNX_FILE
    smoothing = None
    if options.smooth_alpha is not None:
        source, smoothing = _smoothed(source, tmp / ".smoothed" / ONNX_FILE, batches, reference, options)
    fp32_val = evaluate_variant(OnnxClassifier(tmp / "fp32"), options.validation) if options.validation else None
    results = {}
    for name in wanted:
        file = _sibling_dir(tmp, name, tmp / "fp32") / ONNX_FILE
        how = build_int8(name, source, file, options, OnnxClassifier(source).feed)
        gate = None if fp32_val is None else _int8_gate(file, fp32_val, options)
        fallback = None
        if gate is not None and not gate["passed"] and options.fallback_nodes:
            gate, fallback = _rescue(name, source, file, options, gate, fp32_val)
        entry = _variant_entry(name, file, _check(file, batches, reference), {}, out_dir)
        entry.update(quantized_from=source_name, weights=how, per_channel=options.per_channel)
        if smoothing is not None:
            entry["smoothing"] = smoothing
        entry["reduce_range"], entry["reduce_range_reason"] = resolve_reduce_range(options.reduce_range)
        entry["excluded_nodes"] = [*options.exclude_nodes, *(fallback["kept_fp32"] if fallback else [])]
        if gate is not None:
            entry["gate"] = gate
        if fallback is not None:
            entry["fp32_fallback"] = fallback
        entry["status"] = int8_status(entry)
        results[name] = entry
    shutil.rmtree(tmp / ".smoothed", ignore_errors=True)
    return results


def _smoothed(source: Path, dest: Path, batches, reference: dict, options: Int8Options) -> tuple[Path, dict]:
    """`source` with activation outliers moved into the weights (`compressor.deploy.smoothing`), calibrated on
    `options.calibration`, and the rescaled fp32 graph's max |Δlogit| against PyTorch (rounding only: ~1e-6)."""
    from compressor.deploy.smoothing import smooth_graph

    if not options.calibration:
        raise UserError("export.int8.smooth_alpha: smoothing needs calibration batches; expected training examples")
    feed = OnnxClassifier(source).feed
    how = (options.smooth_alpha, options.smooth_scope, options.smooth_outlier_ratio)
    info = smooth_graph(source, dest, options.calibration, feed, *how)
    info["max_abs_diff"] = _check(dest, batches, reference)["max_abs_diff"]
    log.info(
        "export: int8 input smoothing (alpha %g, scope %s) on %d MatMuls (%d folded into attention, %d skipped)",
        *(info[k] for k in ("alpha", "scope", "matmuls", "folded_into_attention", "skipped")),
    )
    return dest, info


def _rescue(name: str, source: Path, file: Path, options: Int8Options, gate: dict, fp32_val: dict):
    """(gate, fallback record) after `fp32_fallback` tried to make the failing int8 graph at `file` pass."""
    log.info("export: %s failed its gate; scanning its nodes for an fp32 fallback", name)
    fallback = fp32_fallback(
        name,
        source,
        file,
        options,
        OnnxClassifier(source).feed,
        lambda graph, batches: evaluate_variant(OnnxClassifier(graph), batches),
        fp32_val,
    )
    fallback["first_gate"] = gate
    return (fallback["tries"][-1]["gate"] if fallback["passed"] else gate), fallback


def _int8_gate(file: Path, fp32_val: dict, options: Int8Options) -> dict:
    """The validation gate of the int8 graph at `file` against the fp32 graph's results."""
    variant_val = evaluate_variant(OnnxClassifier(file), options.validation)
    return int8_gate(variant_val, fp32_val, options.max_drop, options.min_agreement)


def _log_int8(name: str, entry: dict) -> None:
    """One log line for an int8 variant rescued by the fp32 fallback or rejected by its gate."""
    fallback, g = entry.get("fp32_fallback"), entry.get("gate")
    if fallback and fallback["passed"]:
        log.info("export: %s passes its gate with %d node(s) kept in fp32", name, len(fallback["kept_fp32"]))
    if entry["status"] == "rejected":
        log.warning(
            "export: %s rejected: validation accuracy %.4f vs fp32 %.4f (drop %.4f, max %s), agreement %.4f (min %s);"
            " kept on disk",
            name,
            g["accuracy"],
            g["fp32_accuracy"],
            g["drop"],
            g["max_drop"],
            g["agreement_with_fp32"],
            g["min_agreement"],
        )


def _sibling_dir(tmp: Path, name: str, fp32_dir: Path) -> Path:
    """A variant directory with the same config and tokenizer files as the fp32 one."""
    dest = tmp / name
    dest.mkdir(parents=True, exist_ok=True)
    for path in fp32_dir.iterdir():
        if path.is_file() and path.suffix != ".onnx" and not path.name.endswith("_data"):
            shutil.copy2(path, dest / path.name)
    return dest
