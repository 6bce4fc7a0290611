"""int8 variants of an exported graph, and the accuracy gate each must pass before it can be recommended.

Two kinds, both with int8 weights (per output channel by default) and optional nodes kept in fp32:

* `int8` — dynamic quantisation: activations are quantised per batch at run time (no calibration data);
* `int8_static` — static QDQ quantisation: activation ranges are calibrated once, on training examples, and stored
  in the graph as QuantizeLinear/DequantizeLinear pairs around each quantised MatMul.

int8 trades accuracy for speed, so neither is accepted on faith: `gate` compares a variant's validation accuracy
(and, when asked, its prediction agreement) with its fp32 graph's, and a variant that drops more than `max_drop` is
marked rejected (it stays on disk, so the user can still inspect or benchmark it, but the report never recommends
it). With `fallback_nodes`, a variant that fails is first given a second chance by `fp32_fallback`: every node it
quantises is scanned for how much of the error it causes, and the fewest most error-prone nodes are kept in fp32
until the gate passes (mixed precision, chosen on the validation split).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from compressor.core.errors import UserError
from compressor.core.machine import CPUINFO, cpu_has_vnni
from compressor.core.runtimes import CALIBRATED_VARIANTS as CALIBRATED
from compressor.core.runtimes import engine_variants

INT8_VARIANTS = engine_variants("onnx", gated=True)  # ONNX Runtime's int8 variants (OpenVINO's: deploy.openvino)
# The ops each kind turns into int8 (ORT's dynamic IntegerOps registry; static QDQ is limited to MatMuls here).
QUANTIZED_OPS = {
    "int8": ("MatMul", "Attention", "Gather", "EmbedLayerNormalization"),
    "int8_static": ("MatMul",),
}
CALIBRATED_VARIANTS = CALIBRATED  # the variants calibrated on training examples (declared `calibrated`)

ReduceRange = bool | Literal["auto"]
REDUCE_RANGE_ENV = "COMPRESSOR_INT8_REDUCE_RANGE"  # "1"/"0" forces `auto` to 7-bit/8-bit weights on any CPU


@dataclass(frozen=True)
class Int8Options:
    """How int8 variants are built and gated (the recipe's `export.int8`, plus the batches it needs)."""

    per_channel: bool = True
    reduce_range: ReduceRange = "auto"  # 7-bit weights; "auto": on where the CPU lacks VNNI (`resolve_reduce_range`)
    exclude_nodes: tuple[str, ...] = ()
    max_drop: float | None = None  # allowed accuracy drop vs fp32 (fraction); None: measured but never rejected
    min_agreement: float | None = None  # required prediction agreement with fp32 (fraction); None: not gated
    fallback_nodes: int = 0  # a variant failing its gate may keep up to this many nodes in fp32 (`fp32_fallback`)
    smooth_alpha: float | None = None  # SmoothQuant migration strength before quantising (`deploy.smoothing`)
    smooth_scope: str = "all"  # which MatMuls smoothing rescales: "all", "cheap", "free" (`deploy.smoothing`)
    smooth_outlier_ratio: float | None = None  # cheap/free scope: still smooth a skipped input with an outlier this big
    calibration: Sequence[Mapping] = field(default=(), repr=False)  # training batches (int8_static)
    validation: Sequence[Mapping] = field(default=(), repr=False)  # labelled batches for the gate


def resolve_reduce_range(setting: ReduceRange = "auto", cpuinfo: Path = CPUINFO) -> tuple[bool, str]:
    """(reduce_range to quantise with, why) for the recipe's `export.int8.reduce_range`.

    On x86 without VNNI, ONNX Runtime's u8 x s8 int8 GEMM sums pairs of products in 16 bits (`vpmaddubsw`), which
    saturates with full-range 8-bit weights and shifts logits visibly (max |Δlogit| 0.36 vs 0.06 on the tiny test
    models); 7-bit weights (`reduce_range`) cannot saturate there, at a small cost in weight resolution. With VNNI
    (or when the CPU cannot be identified) full range is kept. An explicit bool is used as given. `auto` can be
    forced either way with `COMPRESSOR_INT8_REDUCE_RANGE=1|0`: how the test suite is run with another CPU's
    weight range, and how a user reproduces a number taken on another machine.
    """
    if setting is True or setting is False:
        return setting, "set explicitly"
    forced = os.environ.get(REDUCE_RANGE_ENV, "").strip().lower()
    if forced:
        if forced not in ("0", "1", "false", "true"):
            raise UserError(f"{REDUCE_RANGE_ENV}: expected 1 (7-bit weights) or 0 (8-bit), got {forced[:20]!r}")
        return forced in ("1", "true"), f"auto, forced by {REDUCE_RANGE_ENV}={forced}"
    vnni = cpu_has_vnni(cpuinfo)
    if vnni is False:
        return True, "auto: x86 CPU without VNNI (the u8s8 int8 GEMM can saturate with 8-bit weights)"
    if vnni:
        return False, "auto: CPU has VNNI (full-range 8-bit weights do not saturate)"
    return False, "auto: CPU flags unknown, full-range 8-bit weights"


def quantize_graph(
    src: Path,
    dest: Path,
    per_channel: bool = True,
    reduce_range: ReduceRange = "auto",
    nodes_to_exclude: Sequence[str] = (),
) -> None:
    """Dynamic int8 quantisation (int8 weights, activations quantised per batch at run time) of `src`.

    Weights are quantised per output channel by default: on the pruned MiniLM that raised prediction agreement
    with fp32 (test split; docs/lab/README.md) at the same speed and a slightly larger file. The other options
    are ORT's, exposed so that each one's cost and gain can be measured (docs/lab/README.md); `reduce_range`
    "auto" follows `resolve_reduce_range` (7-bit weights on CPUs without VNNI).

    `DefaultTensorType` lets the quantiser handle outputs of contrib ops (fused Attention, SkipLayerNorm) whose
    types ONNX shape inference cannot infer.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from compressor.deploy.inference import quiet_ort

    dest.parent.mkdir(parents=True, exist_ok=True)
    with quiet_ort():
        quantize_dynamic(
            str(src),
            str(dest),
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            reduce_range=resolve_reduce_range(reduce_range)[0],
            nodes_to_exclude=_excluded(src, nodes_to_exclude),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


def empty_weight_nodes(file: Path) -> list[str]:
    """Nodes with a zero-size weight: ORT's per-channel quantiser fails on them, so both int8 kinds leave them in
    fp32. Our export leaves none (`surgery.slicing.padded_empty_ffns`); this guards graphs traced otherwise."""
    import onnx

    graph = onnx.load(str(file), load_external_data=False).graph
    empty = {t.name for t in graph.initializer if any(d == 0 for d in t.dims)}
    return [node.name for node in graph.node if empty.intersection(node.input)]


def _excluded(src: Path, nodes_to_exclude: Sequence[str]) -> list[str]:
    """The recipe's excluded nodes plus those with an empty weight."""
    return list(dict.fromkeys([*nodes_to_exclude, *empty_weight_nodes(src)]))


def _has_contrib_ops(file: Path) -> bool:
    """Whether a graph uses ONNX Runtime's contrib ops (the optimiser's fused Attention, SkipLayerNorm, ...)."""
    import onnx

    graph = onnx.load(str(file), load_external_data=False).graph
    return any(node.domain == "com.microsoft" for node in graph.node)


class _BatchReader:
    """ORT's `CalibrationDataReader` protocol over our batches: one feed dict per call, None when exhausted."""

    def __init__(self, feeds: Iterator[dict[str, np.ndarray]]):
        self._feeds = feeds

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)

    def rewind(self) -> None:  # ORT calls it on some paths; a single calibration pass needs no second read
        pass


def quantize_static_graph(
    src: Path,
    dest: Path,
    calibration: Sequence[Mapping],
    feed: Callable[[Mapping], dict[str, np.ndarray]],
    per_channel: bool = True,
    nodes_to_exclude: Sequence[str] = (),
    reduce_range: ReduceRange = "auto",
) -> None:
    """Static QDQ int8 quantisation of `src`'s MatMuls, activation ranges calibrated (min/max) on `calibration`.

    Activations are uint8 and weights int8 (the U8S8 pairing ONNX Runtime's x86 kernels are fastest with); only
    MatMuls are quantised, which is where a transformer's time goes, leaving LayerNorm/softmax/GELU in fp32.
    `feed` turns a batch into the graph's inputs (`OnnxClassifier.feed`); `reduce_range` as in `quantize_graph`.
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from compressor.deploy.inference import quiet_ort

    src, dest = Path(src).resolve(), Path(dest).resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with quiet_ort(), tempfile.TemporaryDirectory(dir=dest.parent) as tmp, contextlib.chdir(tmp):
        # In the scratch directory: when symbolic shape inference is incomplete, ONNX Runtime dumps its partial
        # graph and external-data files into the working directory (once seen in this repository's root).
        typed = Path(tmp) / "typed.onnx"
        if _has_contrib_ops(src):
            # Symbolic shape inference types the outputs of fused contrib ops; without it the quantiser cannot place
            # activation QDQ pairs after them and silently falls back to weight-only int8 (no faster than fp32).
            quant_pre_process(str(src), str(typed), skip_optimization=True)
        else:  # plain ONNX ops: ONNX's own shape inference (inside the quantiser) suffices
            typed = src
        quantize_static(
            str(typed),
            str(dest),
            _BatchReader(feed(b) for b in calibration),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul"],
            per_channel=per_channel,
            reduce_range=resolve_reduce_range(reduce_range)[0],
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=_excluded(typed, nodes_to_exclude),
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


def build_int8(
    name: str, source: Path, dest: Path, options: Int8Options, feed: Callable[[Mapping], dict[str, np.ndarray]]
) -> str:
    """Build int8 variant `name` of `source` at `dest`; returns a short description of what was quantised how."""
    scheme = "per channel" if options.per_channel else "per tensor"
    reduce, _ = resolve_reduce_range(options.reduce_range)
    if reduce:
        scheme += ", 7-bit range"
    if name == "int8":
        quantize_graph(source, dest, options.per_channel, reduce, options.exclude_nodes)
        return f"int8 {scheme}, activations dynamic"
    quantize_static_graph(source, dest, options.calibration, feed, options.per_channel, options.exclude_nodes, reduce)
    examples = sum(len(b["input_ids"]) for b in options.calibration)
    return f"int8 {scheme}, activations uint8 static (QDQ, calibrated on {examples} training examples)"


def quantized_nodes(file: Path, name: str = "int8") -> list[str]:
    """Names of the nodes int8 variant `name` quantises in graph `file`: ops of its kind (`QUANTIZED_OPS`) with a
    non-empty weight of two or more dimensions among their initializers (so a Gather of token ids is not counted).
    These are the nodes a fallback can keep in fp32."""
    import onnx

    graph = onnx.load(str(file), load_external_data=False).graph
    weights = {t.name for t in graph.initializer if len(t.dims) >= 2 and all(d > 0 for d in t.dims)}
    return [n.name for n in graph.node if n.op_type in QUANTIZED_OPS[name] and weights.intersection(n.input)]


SCAN_EXAMPLES = 256  # validation examples the fallback's per-node scan measures (a ranking, not the gate)


@dataclass(frozen=True)
class Fallback:
    """How one runtime's int8 variant keeps nodes in fp32, for `search_fallback` (ONNX Runtime's and OpenVINO's
    int8 share the search and the gate; only building differs).

    candidates: the nodes the variant quantises (what may be kept in fp32).
    scan: `evaluate_variant` result on the given batches of the variant with that one node kept in fp32.
    build: the variant with these nodes kept in fp32, written in a scratch place; returns its path.
    evaluate: `evaluate_variant` result of a built variant on the given batches.
    install: moves a built variant that passed its gate into place (over the failing one).
    """

    candidates: Sequence[str]
    scan: Callable[[str, Sequence[Mapping]], dict]
    build: Callable[[Sequence[str]], Path]
    evaluate: Callable[[Path, Sequence[Mapping]], dict]
    install: Callable[[Path], None]


def search_fallback(how: Fallback, options: Int8Options, fp32: dict) -> dict:
    """Rescue an int8 variant failing its gate by keeping its most error-prone nodes in fp32.

    Why: int8's error is not spread evenly. One MatMul whose input has outlier activations (BERT's feed-forward
    outputs are the known case: dynamic quantisation uses one scale per batch matrix, so one large channel crushes
    the rest) can cause much of the error; keeping that node in fp32 costs a few percent of the speed, not all of it.

    What: every candidate node is kept in fp32 alone, and the mean |Δlogit| against fp32 on the first
    `SCAN_EXAMPLES` validation examples is measured (a continuous error: prediction agreement on a few hundred
    examples moves by single flips and ranks nodes by chance). Then the 1, 2, ... `options.fallback_nodes` nodes
    whose fp32 copy lowered the error most are kept in fp32 together and gated (`gate`) on the whole validation
    split, until one passes; it is installed. `fp32` is the fp32 graph's `evaluate_variant` result on
    `options.validation`. The choice and the gate use the same validation split, so the gate is optimistic by the
    choice: measure the shipped variant on the test split (the bench stage does).

    Returns the record for the report: "scan" (per node, lowest error first), "tries" (nodes kept and gate of
    each), "kept_fp32" (the passing try's nodes, else []) and "passed".
    """
    candidates = [n for n in how.candidates if n not in options.exclude_nodes]
    scan_batches = _first_examples(options.validation, SCAN_EXAMPLES)
    scan_fp32 = _head(fp32, sum(len(b["input_ids"]) for b in scan_batches))
    scan = [{"node": node, **_closeness(how.scan(node, scan_batches), scan_fp32)} for node in candidates]
    scan.sort(key=lambda r: (r["mean_abs_logit_diff"], -r["agreement"]))
    tries = []
    for k in range(1, min(options.fallback_nodes, len(scan)) + 1):
        nodes = [r["node"] for r in scan[:k]]
        built = how.build(nodes)
        verdict = gate(how.evaluate(built, options.validation), fp32, options.max_drop, options.min_agreement)
        tries.append({"kept_fp32": nodes, "gate": verdict})
        if verdict["passed"]:
            how.install(built)
            return {"scan": scan, "tries": tries, "kept_fp32": nodes, "passed": True}
    return {"scan": scan, "tries": tries, "kept_fp32": [], "passed": False}


def fp32_fallback(
    name: str,
    source: Path,
    dest: Path,
    options: Int8Options,
    feed: Callable[[Mapping], dict[str, np.ndarray]],
    evaluate: Callable[[Path, Sequence[Mapping]], dict],
    fp32: dict,
) -> dict:
    """`search_fallback` for ONNX Runtime int8 variant `name` of graph `source`, failing its gate at `dest`: its
    candidates are `quantized_nodes`, each build a re-quantisation with those nodes excluded. `evaluate(graph,
    batches)` is an `evaluate_variant` result. The first passing graph replaces `dest`; if none passes, `dest` is
    left as it was."""
    with tempfile.TemporaryDirectory(dir=dest.parent.parent) as tmp:
        labels = itertools.count()

        def build(nodes: Sequence[str]) -> Path:
            file = Path(tmp) / f"b{next(labels)}" / dest.name
            build_int8(name, source, file, replace(options, exclude_nodes=(*options.exclude_nodes, *nodes)), feed)
            return file

        def scan(node: str, batches: Sequence[Mapping]) -> dict:
            file = build([node])
            try:
                return evaluate(file, batches)
            finally:
                shutil.rmtree(file.parent)

        how = Fallback(quantized_nodes(source, name), scan, build, evaluate, lambda file: os.replace(file, dest))
        return search_fallback(how, options, fp32)


def _first_examples(batches: Sequence[Mapping], n: int) -> list[Mapping]:
    """The leading batches of `batches` holding at least `n` examples (all of them if there are fewer)."""
    out, seen = [], 0
    for batch in batches:
        if seen >= n:
            break
        out.append(batch)
        seen += len(batch["input_ids"])
    return out


def _head(result: dict, n: int) -> dict:
    """An `evaluate_variant` result cut to its first `n` examples."""
    return {**result, "logits": result["logits"][:n], "predictions": result["predictions"][:n], "examples": n}


def _closeness(result: dict, fp32: dict) -> dict:
    """Prediction agreement and mean |Δlogit| of an `evaluate_variant` result against the fp32 graph's."""
    if not fp32["examples"]:
        return {"agreement": 1.0, "mean_abs_logit_diff": 0.0}
    return {
        "agreement": float((result["predictions"] == fp32["predictions"]).mean()),
        "mean_abs_logit_diff": float(np.abs(result["logits"] - fp32["logits"]).mean()),
    }


def gate(variant: dict, fp32: dict, max_drop: float | None, min_agreement: float | None = None) -> dict:
    """The accuracy gate of one int8 variant: `evaluate_variant` results of it and of its fp32 graph on the same
    labelled validation batches. `passed` is False when accuracy drops by more than `max_drop`, or when the share
    of predictions that agree with fp32 is below `min_agreement` (either check is off when None)."""
    drop = fp32["accuracy"] - variant["accuracy"]
    agreement = float((variant["predictions"] == fp32["predictions"]).mean()) if fp32["examples"] else 1.0
    return {
        "split": "validation",
        "examples": fp32["examples"],
        "fp32_accuracy": fp32["accuracy"],
        "accuracy": variant["accuracy"],
        "drop": drop,
        "agreement_with_fp32": agreement,
        "max_drop": max_drop,
        "min_agreement": min_agreement,
        "passed": (max_drop is None or drop <= max_drop + 1e-12)
        and (min_agreement is None or agreement >= min_agreement - 1e-12),
    }


def smoothing_note(smoothing: dict | None) -> str:
    """' (inputs smoothed, α A[, S of N MatMuls])' for an int8 variant whose export record has `smoothing`, else ''
    (the report's and the model card's label for it)."""
    if not smoothing:
        return ""
    total = smoothing["matmuls"] + smoothing.get("skipped", 0)
    part = f", {smoothing['matmuls']} of {total} MatMuls" if smoothing.get("skipped") else ""
    return f" (inputs smoothed, α {smoothing['alpha']:g}{part})"


def status(entry: dict) -> str:
    """'rejected' when a variant failed its gate, 'accepted' when it passed one, else 'ungated'."""
    result = entry.get("gate")
    if result is None or (result.get("max_drop") is None and result.get("min_agreement") is None):
        return "ungated"
    return "accepted" if result["passed"] else "rejected"


def int8_options(spec, variants: Sequence[str], train_ds, validation_ds, tokenizer, seed: int = 0) -> Int8Options:
    """`Int8Options` for a run: the recipe's `export.int8` (`spec`), calibration batches drawn from the training
    split (only when a calibrated variant, `CALIBRATED_VARIANTS`, or smoothing is requested) and the validation
    split (or `spec.eval_examples` of it), in batches of `spec.eval_batch_size`, for the gate."""
    from compressor.sources.batches import sample_batches

    calibration = ()
    smoothed = spec.smooth_alpha is not None and any(v in INT8_VARIANTS for v in variants)
    if any(v in CALIBRATED_VARIANTS for v in variants) or smoothed:
        calibration = sample_batches(train_ds, tokenizer, spec.calibration_examples, 32, seed=seed + 2)
    n = spec.eval_examples or len(validation_ds)
    return Int8Options(
        per_channel=spec.per_channel,
        reduce_range=spec.reduce_range,
        exclude_nodes=tuple(spec.exclude_nodes),
        max_drop=spec.max_drop,
        min_agreement=spec.min_agreement,
        fallback_nodes=spec.fallback_nodes,
        smooth_alpha=spec.smooth_alpha,
        smooth_scope=spec.smooth_scope,
        smooth_outlier_ratio=spec.smooth_outlier_ratio,
        calibration=calibration,
        validation=sample_batches(validation_ds, tokenizer, n, spec.eval_batch_size, seed=seed),
    )
