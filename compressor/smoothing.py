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

Pure graph rewriting: no training imports, no knowledge of the model's architecture beyond "a MatMul with a constant
two-dimensional weight".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

SCALE_RANGE = (1e-4, 1e4)  # clip on s: a zero weight row or a dead channel must not give inf or 0


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
    src: Path, dest: Path, batches: Sequence[Mapping], feed: Callable[[Mapping], dict], alpha: float
) -> dict:
    """Write `src` with every smoothable MatMul rescaled (see the module docstring) to `dest`, its activation
    maxima measured on `batches` (fed through `feed`). Returns {"alpha", "matmuls", "examples"}."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    nodes = smoothable_matmuls(graph)
    maxima = activation_maxima(model, list(dict.fromkeys(n.input[0] for n in nodes)), batches, feed)
    weights = {t.name: t for t in graph.initializer}
    producers = {out: n for n in graph.node for out in n.output}
    uses = Counter(name for n in graph.node for name in n.input)  # the folds below change no tensor's readers
    muls, folded = {}, 0
    for i, node in enumerate(nodes):
        weight = numpy_helper.to_array(weights[node.input[1]])
        scales = smoothing_scales(maxima[node.input[0]], weight, alpha)
        weights[node.input[1]].CopyFrom(numpy_helper.from_array(weight * scales[:, None], node.input[1]))
        if _fold_into_attention(producers.get(node.input[0]), node.input[0], weights, uses, scales):
            folded += 1
            continue
        inverse, smoothed = f"{node.name or i}_smooth_inverse", f"{node.input[0]}_smoothed_{i}"
        graph.initializer.append(numpy_helper.from_array((1.0 / scales).astype(np.float32), inverse))
        muls[node.output[0]] = onnx.helper.make_node("Mul", [node.input[0], inverse], [smoothed], name=f"{inverse}_mul")
        node.input[0] = smoothed
    ordered = []
    for node in graph.node:  # each Mul right before its MatMul keeps the graph topologically sorted
        ordered += [muls[node.output[0]]] if node.output[0] in muls else []
        ordered.append(onnx.NodeProto())
        ordered[-1].CopyFrom(node)
    del graph.node[:]
    graph.node.extend(ordered)
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dest))
    examples = sum(len(b["input_ids"]) for b in batches)
    return {"alpha": alpha, "matmuls": len(nodes), "folded_into_attention": folded, "examples": examples}


def _fold_into_attention(producer, tensor: str, weights: dict, uses: Counter, scales: np.ndarray) -> bool:
    """Divide the value columns of `producer`, the node computing `tensor`, by `scales` (so its output comes out
    already divided), when that is exact: it is a fused `Attention` whose packed QKV weight and bias are
    initializers it alone uses, and `tensor` has no other reader. Returns whether it folded."""
    from onnx import helper, numpy_helper

    if producer is None or producer.op_type != "Attention" or producer.output[0] != tensor or len(producer.input) < 3:
        return False
    weight_name, bias_name = producer.input[1], producer.input[2]
    if uses[tensor] != 1 or weight_name not in weights or bias_name not in weights:
        return False
    if uses[weight_name] != 1 or uses[bias_name] != 1:
        return False
    weight, bias = numpy_helper.to_array(weights[weight_name]), numpy_helper.to_array(weights[bias_name])
    sizes = {a.name: helper.get_attribute_value(a) for a in producer.attribute}.get("qkv_hidden_sizes")
    value = int(sizes[2]) if sizes else weight.shape[1] // 3  # the value projection is the last block of columns
    if value != len(scales):
        return False
    weight, bias = weight.copy(), bias.copy()
    weight[:, -value:] /= scales
    bias[-value:] /= scales
    weights[weight_name].CopyFrom(numpy_helper.from_array(weight, weight_name))
    weights[bias_name].CopyFrom(numpy_helper.from_array(bias, bias_name))
    return True
