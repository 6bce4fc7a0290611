"""Activation smoothing before int8 (SmoothQuant, Xiao et al. 2023): move activation outliers into the weights.

Dynamic int8 quantises each MatMul's input with one scale for the whole batch matrix, so a few input channels with
large values (BERT's feed-forward activations reach 10-15x their median channel's maximum) leave the other channels
a handful of int8 levels. Weights are quantised per output channel, so they absorb a rescaling much better. For a
MatMul `y = x @ W` and a per-input-channel scale `s`, `y = (x / s) @ (diag(s) W)` exactly; with
`s_j = max|x_j|^alpha / max|W_j,:|^(1 - alpha)` (maxima calibrated on training examples) the activation's channels
become more even, at the price of a less even weight row. The division is a `Mul` node before each MatMul, except
where the input is the output of ONNX Runtime's fused `Attention` (and nothing else reads it): each output channel
of attention is a mix of one value channel, so dividing that value column's weight and bias by `s` is free. The
rescaled graph is an fp32 graph equal to the original up to float rounding, and is then quantised as usual.

A `Mul` is one more pass over its activation. Before a MatMul whose input is wider than its output (a feed-forward
down-projection, fed by the GELU over the widest activation) that pass costs the most relative to the MatMul (what
each scope cost on MiniLM: docs/lab/results-2026-11-25.md). `scope="cheap"` skips exactly those MatMuls (unless
their division folds); `"all"` smooths every one; `"free"` only those whose division folds into attention, so it
adds no node at all. With `outlier_ratio`, the cheap and free scopes still smooth a skipped MatMul whose input has
one channel that stands out that much (`outlier_ratio_of`): the classic BERT failure, a lone huge FFN neuron, costs
one `Mul` to fix.

Pure graph rewriting: no training imports, no knowledge of the model's architecture beyond "a MatMul with a constant
two-dimensional weight".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

SCALE_RANGE = (1e-4, 1e4)  # clip on s: a zero weight row or a dead channel must not give inf or 0
SCOPES = ("all", "cheap", "free")  # which smoothable MatMuls get smoothed (see the module docstring)


def smoothable_matmuls(graph) -> list:
    """MatMul nodes whose second input is a constant 2-D, non-empty weight used by that node alone (rescaling a
    shared weight would change its other users) and whose first input is computed (not a constant)."""
    initializers = {t.name: t for t in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    return [
        node
        for node in graph.node
        if node.op_type == "MatMul"
        and node.input[1] in initializers
        and len(initializers[node.input[1]].dims) == 2
        and all(d > 0 for d in initializers[node.input[1]].dims)
        and uses[node.input[1]] == 1
        and node.input[0] not in initializers
    ]


def activation_maxima(
    model, names: Sequence[str], batches: Sequence[Mapping], feed: Callable[[Mapping], dict]
) -> dict[str, np.ndarray]:
    """Per-channel (last axis) max |value| of the tensors `names` of ONNX `model` over `batches`."""
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for name in names:
        if name not in known:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    maxima: dict[str, np.ndarray] = {}
    for batch in batches:
        for name, value in zip(names, session.run(list(names), feed(batch)), strict=True):
            channel_max = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            maxima[name] = np.maximum(maxima[name], channel_max) if name in maxima else channel_max
    return maxima


def smoothing_scales(act_max: np.ndarray, weight: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|x_j|^alpha / max|W_j,:|^(1 - alpha) per input channel j of a MatMul weight [in, out], clipped to
    `SCALE_RANGE`; channels never active keep s = 1."""
    w_max = np.abs(weight).max(axis=1)
    floor = max(float(w_max.max()), 1e-30) * 1e-8
    scales = np.power(act_max, alpha) / np.power(np.maximum(w_max, floor), 1 - alpha)
    scales = np.where(act_max > 0, scales, 1.0)
    return np.clip(scales, *SCALE_RANGE).astype(np.float32)


def smooth_graph(
    src: Path,
    dest: Path,
    batches: Sequence[Mapping],
    feed: Callable[[Mapping], dict],
    alpha: float,
    scope: str = "all",
    outlier_ratio: float | None = None,
) -> dict:
    """Write `src` with its smoothable MatMuls rescaled to `dest`, activation maxima measured on `batches` (fed
    through `feed`): every one, with `scope="cheap"` those whose division is free or whose input is no wider
    than their output, with `scope="free"` only those whose division folds into attention; plus (when
    `outlier_ratio` is given) the skipped ones whose input has an outlier channel (see `outlier_ratio_of`) at
    least that strong. Returns {"alpha", "scope", "outlier_ratio", "matmuls",
    "folded_into_attention", "skipped", "examples"}."""
    import onnx

    if scope not in SCOPES:
        raise ValueError(f"scope: expected one of {', '.join(SCOPES)}, got {scope!r}")
    model = onnx.load(str(src))
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    producers = {out: n for n in graph.node for out in n.output}
    uses = Counter(name for n in graph.node for name in n.input)  # the folds below change no tensor's readers
    candidates = smoothable_matmuls(graph)
    folds = [_attention_fold(producers.get(n.input[0]), n, weights, uses) for n in candidates]
    kept = {i for i, n in enumerate(candidates) if _in_scope(scope, folds[i] is not None, _projects_down(n, weights))}
    measured = candidates if outlier_ratio is not None else [candidates[i] for i in sorted(kept)]  # skipped: unread
    maxima = activation_maxima(model, list(dict.fromkeys(n.input[0] for n in measured)), batches, feed)
    chosen = [
        i
        for i, n in enumerate(candidates)
        if i in kept or (outlier_ratio is not None and outlier_ratio_of(maxima[n.input[0]]) >= outlier_ratio)
    ]
    nodes = [candidates[i] for i in chosen]
    muls, folded = {}, 0
    for i, node in zip(chosen, nodes, strict=True):
        scales = _scale_weight(node, weights, maxima[node.input[0]], alpha)
        if folds[i] is not None:
            _divide_values(folds[i], weights, scales)
            folded += 1
        else:
            muls[node.output[0]] = _divide_input(graph, node, scales, f"{node.name or i}", i)
    _insert_before(graph, muls)
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dest))
    examples = sum(len(b["input_ids"]) for b in batches)
    return {
        "alpha": alpha,
        "scope": scope,
        "outlier_ratio": outlier_ratio,
        "matmuls": len(nodes),
        "folded_into_attention": folded,
        "skipped": len(candidates) - len(nodes),
        "examples": examples,
    }


def _scale_weight(node, weights: dict, act_max: np.ndarray, alpha: float) -> np.ndarray:
    """Multiply the MatMul's weight rows by its smoothing scales (in place); returns the scales."""
    from onnx import numpy_helper

    weight = numpy_helper.to_array(weights[node.input[1]])
    scales = smoothing_scales(act_max, weight, alpha)
    weights[node.input[1]].CopyFrom(numpy_helper.from_array(weight * scales[:, None], node.input[1]))
    return scales


def _divide_input(graph, node, scales: np.ndarray, name: str, index: int):
    """Divide the MatMul's input by `scales` through a new Mul (its inverse scales as an initializer); rewires
    the MatMul to read the Mul's output and returns the Mul, not yet placed in the graph."""
    import onnx
    from onnx import numpy_helper

    inverse, smoothed = f"{name}_smooth_inverse", f"{node.input[0]}_smoothed_{index}"
    graph.initializer.append(numpy_helper.from_array((1.0 / scales).astype(np.float32), inverse))
    mul = onnx.helper.make_node("Mul", [node.input[0], inverse], [smoothed], name=f"{inverse}_mul")
    node.input[0] = smoothed
    return mul


def _insert_before(graph, muls: dict) -> None:
    """Place each new Mul right before the MatMul it feeds (keyed by the MatMul's output), which keeps the graph
    topologically sorted."""
    import onnx

    ordered = []
    for node in graph.node:
        ordered += [muls[node.output[0]]] if node.output[0] in muls else []
        ordered.append(onnx.NodeProto())
        ordered[-1].CopyFrom(node)
    del graph.node[:]
    graph.node.extend(ordered)


def _in_scope(scope: str, folds: bool, projects_down: bool) -> bool:
    """Whether `scope` smooths a MatMul whose division `folds` into attention and whose weight `projects_down`."""
    return scope == "all" or folds or (scope == "cheap" and not projects_down)


def outlier_ratio_of(act_max: np.ndarray) -> float:
    """How far one input channel stands out: the largest per-channel max |x| over the median channel's (BERT's
    outlier channels reach 10-15x; an input without outliers stays near 2-4x)."""
    median = float(np.median(act_max))
    return float(act_max.max()) / median if median > 0 else float("inf")


def _projects_down(node, weights: dict) -> bool:
    """Whether MatMul `node` narrows its input (its weight [in, out] has in > out: a feed-forward down-projection)."""
    rows, cols = weights[node.input[1]].dims
    return rows > cols


def _attention_fold(producer, matmul, weights: dict, uses: Counter):
    """`producer` (the node computing `matmul`'s input) when dividing that input can be folded into it exactly:
    a fused `Attention` whose packed QKV weight and bias are initializers it alone uses, whose value width is the
    MatMul's input width, and whose output nothing else reads. Else None."""
    from onnx import helper

    tensor = matmul.input[0]
    if producer is None or producer.op_type != "Attention" or producer.output[0] != tensor or len(producer.input) < 3:
        return None
    weight_name, bias_name = producer.input[1], producer.input[2]
    if uses[tensor] != 1 or weight_name not in weights or bias_name not in weights:
        return None
    if uses[weight_name] != 1 or uses[bias_name] != 1:
        return None
    sizes = {a.name: helper.get_attribute_value(a) for a in producer.attribute}.get("qkv_hidden_sizes")
    value = int(sizes[2]) if sizes else weights[weight_name].dims[1] // 3  # V is the last block of columns
    return producer if value == weights[matmul.input[1]].dims[0] else None


def _divide_values(attention, weights: dict, scales: np.ndarray) -> None:
    """Divide the value columns of fused `attention`'s QKV weight and bias by `scales` (each output channel of
    attention is a mix of one value channel, so its output comes out divided)."""
    from onnx import numpy_helper

    weight_name, bias_name = attention.input[1], attention.input[2]
    weight, bias = numpy_helper.to_array(weights[weight_name]), numpy_helper.to_array(weights[bias_name])
    value = len(scales)
    weight, bias = weight.copy(), bias.copy()
    weight[:, -value:] /= scales
    bias[-value:] /= scales
    weights[weight_name].CopyFrom(numpy_helper.from_array(weight, weight_name))
    weights[bias_name].CopyFrom(numpy_helper.from_array(bias, bias_name))
