"""OpenVINO variants of an exported model: an fp32 IR and NNCF int8, each checked, in the layout optimum-intel reads.

Optional: `pip install 'compressor[openvino]'` (openvino + nncf). Without it, requested OpenVINO variants and
candidates are skipped with one log line (`missing`, `skip`), never an error deep inside a run.

Layout of each variant directory (what `optimum.intel.OVModelForSequenceClassification.from_pretrained` opens;
optimum-intel itself is not needed, nor imported)::

    <variant>/openvino_model.xml, openvino_model.bin   the IR: inputs input_ids, attention_mask [, token_type_ids],
                                                       output logits, dynamic batch and sequence axes
    <variant>/config.json + tokenizer files            copied from the fp32 ONNX variant beside it

* `openvino-fp32` is `openvino.convert_model` of our parity-gated fp32 ONNX graph (so every architecture that exports to
  ONNX converts, ModernBERT included; no second trace of the model). It must reproduce PyTorch's logits within the
  export's `atol`, like the ONNX graphs. It runs with `INFERENCE_PRECISION_HINT f32`: on CPUs with bf16 (AVX512-BF16,
  AMX) OpenVINO would otherwise run an fp32 model in bf16, which is neither fp32 nor gated.
* `openvino-int8` is `nncf.quantize(..., model_type=nncf.ModelType.TRANSFORMER)` of that IR (SmoothQuant on MatMul
  inputs, the mixed preset, static int8 activations), calibrated on the recipe's training examples and gated on
  validation accuracy and agreement against the fp32 IR by the same gate as ONNX Runtime's int8
  (`deploy.quantize.gate`). A variant failing its gate may keep its most error-prone MatMuls in fp32 through NNCF's
  `IgnoredScope`, found by the same search as ONNX Runtime's fallback (`deploy.quantize.search_fallback`); the scan
  ranks each MatMul by the error of its quantised activation (its input FakeQuantize bypassed in the quantised model:
  one compile per node instead of one NNCF run), the tries re-quantise with the nodes ignored.

Whether int8 pays depends on the CPU: OpenVINO's int8 kernels need VNNI or AMX (`core.machine.cpu_summary`); on an
AVX2-only CPU they can run slower than fp32. Measure, never assume.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from compressor.core.errors import UserError
from compressor.core.runtimes import engine_variants
from compressor.deploy.inference import check_parity, compare, evaluate_variant, graph_feed, onnx_file
from compressor.deploy.quantize import (
    Fallback,
    Int8Options,
    ReduceRange,
    gate,
    resolve_reduce_range,
    search_fallback,
    status,
)

log = logging.getLogger(__name__)

OPENVINO_VARIANTS = engine_variants("openvino")  # declared in `compressor.core.runtimes`
IR_FILE = "openvino_model.xml"
INSTALL_HINT = "pip install 'compressor[openvino]'"
# fp32 stays fp32 (no bf16 on bf16-capable CPUs); one stream with every thread, for the latency of a batch.
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}


def missing() -> str | None:
    """Why the OpenVINO variants cannot be built or run here (openvino or nncf not importable), else None."""
    for module in ("openvino", "nncf"):
        try:
            importlib.import_module(module)
        except (ImportError, AttributeError, OSError) as err:  # absent, or a broken install (missing symbols, libs)
            return f"{module} is not installed ({INSTALL_HINT}): {err}"
    return None


def skip(what: str, names: Sequence[str]) -> bool:
    """True (after one warning line naming `what` is skipped and why) when OpenVINO is missing and `names` holds
    an OpenVINO variant; False when there is nothing to skip."""
    wanted = [n for n in names if n in OPENVINO_VARIANTS]
    reason = missing() if wanted else None
    if reason is None:
        return False
    log.warning("%s: %s skipped: %s", what, ", ".join(wanted), reason)
    return True


def ir_file(variant_dir: str | Path) -> Path:
    """The IR of an OpenVINO variant directory (`openvino_model.xml`); a file path is returned as is."""
    path = Path(variant_dir)
    if path.is_file():
        return path
    if not (path / IR_FILE).is_file():
        raise UserError(f"openvino: no {IR_FILE} in '{path}'; expected an OpenVINO variant directory")
    return path / IR_FILE


def ir_size(file: Path) -> int:
    """Bytes of an IR: the .xml and its .bin weights."""
    return sum(p.stat().st_size for p in (file, file.with_suffix(".bin")) if p.is_file())


def compile_on_cpu(model, threads: int | None = None):
    """`model` (an `openvino.Model` or an IR path) compiled for the CPU as every runtime here runs it
    (`COMPILE_CONFIG`), with `threads` inference threads (None: OpenVINO's default)."""
    import openvino as ov

    config = {**COMPILE_CONFIG, **({"INFERENCE_NUM_THREADS": int(threads)} if threads else {})}
    return ov.Core().compile_model(model if not isinstance(model, Path) else str(model), "CPU", config)


class OpenVinoClassifier:
    """A compiled OpenVINO model on the CPU, called like a model: batch → logits (same interface as
    `OnnxClassifier`: `feed`, `input_names`, `path`, `size_bytes`, `threads`).

    `threads` fixes OpenVINO's inference threads (it reads them when compiling); None keeps its default, which is
    recorded. `model` (an in-memory `openvino.Model`) is compiled instead of the file, for scans that never save.
    """

    def __init__(self, variant_dir: str | Path, threads: int | None = None, model=None):
        self.path = ir_file(variant_dir) if model is None else Path(variant_dir)
        self.compiled = compile_on_cpu(model if model is not None else self.path, threads)
        self.request = self.compiled.create_infer_request()
        self.input_names = tuple(i.get_any_name() for i in self.compiled.inputs)
        self.threads = int(self.compiled.get_property("INFERENCE_NUM_THREADS"))
        self.threads_note = None
        self.size_bytes = ir_size(self.path) if model is None else 0

    def feed(self, batch: Mapping) -> dict[str, np.ndarray]:
        """The model's inputs for `batch` (numpy int64), `token_type_ids` zeros when absent."""
        return graph_feed(batch, self.input_names, self.path)

    def __call__(self, batch: Mapping) -> np.ndarray:
        self.request.infer(self.feed(batch))
        return np.array(self.request.get_output_tensor(0).data, copy=True)


# ------------------------------------------------------------------------------------------------------ building


def from_onnx(onnx_graph: Path):
    """`openvino.convert_model` of an ONNX graph: an in-memory `openvino.Model`."""
    import openvino as ov

    return ov.convert_model(str(onnx_graph))


def convert(onnx_graph: Path, dest: Path) -> Path:
    """`from_onnx`, saved with fp32 weights as `dest/openvino_model.xml` (+ .bin)."""
    import openvino as ov

    dest.mkdir(parents=True, exist_ok=True)
    ov.save_model(from_onnx(onnx_graph), str(dest / IR_FILE), compress_to_fp16=False)
    return dest / IR_FILE


def nncf_int8(
    model, feeds: Sequence[Mapping[str, np.ndarray]], keep_fp32: Sequence[str] = (), reduce_range: ReduceRange = "auto"
):
    """NNCF int8 of an in-memory `openvino.Model` (`ModelType.TRANSFORMER`), calibrated on `feeds` (its inputs,
    ready), with the `keep_fp32` nodes in its ignored scope.

    `reduce_range` is ONNX Runtime's int8 setting, resolved the same way (`deploy.quantize.resolve_reduce_range`):
    where it holds (a CPU without VNNI, by default), NNCF's overflow fix gives every layer 7-bit weights, since
    OpenVINO's AVX2 int8 kernels sum u8 x s8 pairs in 16 bits and saturate with full-range weights (NNCF's default
    fixes the first layer only); elsewhere NNCF's default stands."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    nncf_log = logging.getLogger("nncf")
    previous = nncf_log.level
    nncf_log.setLevel(logging.ERROR)  # its INFO lines name every ignored node; the progress bars stay
    try:
        return nncf.quantize(
            model,
            nncf.Dataset(list(feeds)),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=max(1, len(feeds)),
            ignored_scope=nncf.IgnoredScope(names=list(keep_fp32)) if keep_fp32 else None,
            advanced_parameters=AdvancedQuantizationParameters(overflow_fix=overflow_fix(reduce_range)),
        )
    finally:
        nncf_log.setLevel(previous)


def overflow_fix(reduce_range: ReduceRange):
    """NNCF's `OverflowFix` for the int8 setting `reduce_range`: ENABLE (7-bit weights in every layer) where it
    resolves on, FIRST_LAYER (NNCF's default) where it resolves off."""
    from nncf.quantization.advanced_parameters import OverflowFix

    return OverflowFix.ENABLE if resolve_reduce_range(reduce_range)[0] else OverflowFix.FIRST_LAYER


def _quantized_model(fp32: Path, options: Int8Options, ignored: Sequence[str] = ()):
    """NNCF int8 of the IR `fp32` in memory, calibrated on `options.calibration`, with `ignored` nodes (and those of
    `options.exclude_nodes` the IR has) kept in fp32."""
    import openvino as ov

    model = ov.Core().read_model(str(fp32))
    names = [i.get_any_name() for i in model.inputs]
    present = {op.get_friendly_name() for op in model.get_ops()}
    keep = [n for n in dict.fromkeys([*options.exclude_nodes, *ignored]) if n in present]
    feeds = [graph_feed(batch, names, fp32) for batch in options.calibration]
    return nncf_int8(model, feeds, keep, options.reduce_range)


def quantize(fp32: Path, dest: Path, options: Int8Options, ignored: Sequence[str] = ()) -> str:
    """Write NNCF int8 of the IR `fp32` as `dest/openvino_model.xml`; returns a short description of how."""
    import openvino as ov

    if not options.calibration:
        raise UserError("export.int8: openvino-int8 needs calibration batches; expected training examples")
    dest.mkdir(parents=True, exist_ok=True)
    ov.save_model(_quantized_model(fp32, options, ignored), str(dest / IR_FILE), compress_to_fp16=False)
    examples = sum(len(b["input_ids"]) for b in options.calibration)
    reduced, why = resolve_reduce_range(options.reduce_range)
    weights = f"7-bit range in every layer ({why})" if reduced else "8-bit range (7-bit in the first layer)"
    return (
        f"int8 NNCF (ModelType.TRANSFORMER: SmoothQuant, mixed preset), weights per channel, {weights}, "
        f"activations static, calibrated on {examples} training examples"
    )


def quantized_matmuls(model) -> list[str]:
    """Friendly names of the MatMuls whose input NNCF quantised (a FakeQuantize feeds them): what may be kept in
    fp32 through its `IgnoredScope`."""
    return [
        op.get_friendly_name()
        for op in model.get_ops()
        if op.get_type_name() == "MatMul" and any(_fake_quantize(port) for port in op.inputs())
    ]


def _fake_quantize(port):
    """The FakeQuantize feeding input `port`, else None."""
    node = port.get_source_output().get_node()
    return node if node.get_type_name() == "FakeQuantize" else None


def activation_fp32(model, node: str):
    """A copy of quantised `model` in which MatMul `node` reads its input unquantised (its FakeQuantize bypassed):
    the scan's cheap stand-in for re-quantising with the node ignored."""
    clone = model.clone()
    op = next(o for o in clone.get_ops() if o.get_friendly_name() == node)
    for port in op.inputs():
        fq = _fake_quantize(port)
        if fq is not None:
            port.replace_source_output(fq.input_value(0))
    return clone


# ------------------------------------------------------------------------------------------------------ export


def build_variants(
    fp32_onnx_dir: Path,
    tmp: Path,
    out_dir: Path,
    names: Sequence[str],
    check: tuple[Sequence[Mapping], dict, float],
    options: Int8Options,
) -> dict[str, dict]:
    """The requested OpenVINO variants (`names`), built under `tmp` from the fp32 ONNX variant directory, with
    entries naming their final place under `out_dir`. `check` is (parity batches, PyTorch's `evaluate_variant`
    result on them, atol): the fp32 IR must match within atol (`ExportParityError` otherwise), int8 reports its
    max |Δlogit| and, with `options.validation`, its gate against the fp32 IR. The caller has checked that
    OpenVINO is installed (`skip`)."""
    wanted = [n for n in OPENVINO_VARIANTS if n in names]
    if not wanted:
        return {}
    batches, reference, atol = check
    fp32_dir = tmp / "openvino-fp32"
    fp32 = convert(onnx_file(fp32_onnx_dir), fp32_dir)
    _copy_side_files(fp32_onnx_dir, fp32_dir)
    stats = compare(evaluate_variant(OpenVinoClassifier(fp32), batches), reference)
    check_parity("openvino-fp32", stats, atol, "OpenVINO")
    results = {}
    if "openvino-fp32" in wanted:
        results["openvino-fp32"] = _entry("openvino-fp32", fp32, stats, out_dir)
    if "openvino-int8" in wanted:
        results["openvino-int8"] = _build_int8(fp32, tmp, out_dir, batches, reference, options)
    if "openvino-fp32" not in wanted:
        shutil.rmtree(fp32_dir)
    return results


def _copy_side_files(source_dir: Path, dest: Path) -> None:
    """config.json and tokenizer files of a variant directory (not its graph or IR), beside an IR."""
    for path in source_dir.iterdir():
        graph = path.suffix == ".onnx" or path.name.endswith("_data") or path.stem == Path(IR_FILE).stem
        if path.is_file() and not graph:
            shutil.copy2(path, dest / path.name)


def _entry(name: str, file: Path, stats: dict, out_dir: Path) -> dict:
    """One export result row, paths as they will be once the temp directory is `out_dir`."""
    return {
        "dir": str(out_dir / name),
        "file": str(out_dir / name / file.name),
        "size_bytes": ir_size(file),
        **stats,
    }


def _build_int8(fp32: Path, tmp: Path, out_dir: Path, batches, reference: dict, options: Int8Options) -> dict:
    """openvino-int8 from the fp32 IR: quantised, checked against PyTorch, gated against the fp32 IR on
    validation, and given `options.fallback_nodes` tries at keeping error-prone MatMuls in fp32 if it fails."""
    dest = tmp / "openvino-int8"
    how = quantize(fp32, dest, options)
    _copy_side_files(fp32.parent, dest)
    file = dest / IR_FILE
    verdict = fallback = None
    if options.validation:
        fp32_val = evaluate_variant(OpenVinoClassifier(fp32), options.validation)
        int8_val = evaluate_variant(OpenVinoClassifier(file), options.validation)
        verdict = gate(int8_val, fp32_val, options.max_drop, options.min_agreement)
        if not verdict["passed"] and options.fallback_nodes:
            verdict, fallback = _rescue(fp32, file, options, verdict, fp32_val)
    stats = compare(evaluate_variant(OpenVinoClassifier(file), batches), reference)
    entry = _entry("openvino-int8", file, stats, out_dir)
    kept = fallback["kept_fp32"] if fallback else []
    entry.update(quantized_from="openvino-fp32", weights=how, excluded_nodes=[*options.exclude_nodes, *kept])
    if verdict is not None:
        entry["gate"] = verdict
    if fallback is not None:
        entry["fp32_fallback"] = fallback
    entry["status"] = status(entry)
    return entry


def _rescue(fp32: Path, file: Path, options: Int8Options, verdict: dict, fp32_val: dict) -> tuple[dict, dict]:
    """(gate, fallback record) after `search_fallback` tried to make the failing int8 IR at `file` pass: the
    candidates are the MatMuls NNCF quantised, the scan bypasses one's input FakeQuantize in memory, and each try
    re-quantises the fp32 IR with its nodes in NNCF's ignored scope; a passing try replaces `file`."""
    import openvino as ov

    log.info("export: openvino-int8 failed its gate; scanning its MatMuls for an fp32 fallback")
    quantized = ov.Core().read_model(str(file))
    with tempfile.TemporaryDirectory(dir=file.parent.parent) as tmp:
        labels = itertools.count()

        def scan(node: str, batches: Sequence[Mapping]) -> dict:
            return evaluate_variant(OpenVinoClassifier(file, model=activation_fp32(quantized, node)), batches)

        def build(nodes: Sequence[str]) -> Path:
            dest = Path(tmp) / f"try{next(labels)}"
            quantize(fp32, dest, options, nodes)
            return dest / IR_FILE

        def install(built: Path) -> None:
            for suffix in (".xml", ".bin"):
                built.with_suffix(suffix).replace(file.with_suffix(suffix))

        def evaluate(built: Path, batches: Sequence[Mapping]) -> dict:
            return evaluate_variant(OpenVinoClassifier(built), batches)

        fallback = search_fallback(
            Fallback(quantized_matmuls(quantized), scan, build, evaluate, install), options, fp32_val
        )
    fallback["first_gate"] = verdict
    return (fallback["tries"][-1]["gate"] if fallback["passed"] else verdict), fallback
