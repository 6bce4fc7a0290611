"""Edits and optimisation of an exported graph: per-layer head counts pinned into the attention reshapes, ORT's
transformer optimizer, a count of the attention nodes it fused, and the one fusion undone for CPUs
(`unfuse_skip_norms`).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from compressor.deploy.inference import quiet_ort
from compressor.surgery.arch import arch_spec, present_heads

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "QAttention")


def attention_scopes(model: nn.Module) -> dict[str, int]:
    """`{node-name prefix of a layer's attention module: its head count}` for the layers that keep heads.

    The TorchScript exporter names nodes after module paths (`/bert/encoder/layer.0/attention/self/...`)."""
    spec = arch_spec(model)
    *parents, stack = spec.layers.split(".")
    scopes = {}
    for index, heads in enumerate(present_heads(model)):
        if heads:
            parts = [model.base_model_prefix, *parents, f"{stack}.{index}", *spec.self_attn.split(".")]
            scopes["/" + "/".join(parts) + "/"] = len(heads)
    return scopes


def pin_head_counts(file: Path, scopes: dict[str, int], head_size: int) -> int:
    """Write each layer's head count into its attention reshapes in place; returns how many shapes were pinned.

    transformers 5 reshapes Q/K/V with `view(batch, seq, -1, head_size)` and merges heads back with
    `(batch, seq, -1)`; ORT's optimizer reads a layer's head count off those constants, so with -1 it fuses nothing.
    The -1 becomes the layer's heads (or heads × head_size): the same values at every batch and sequence size.
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(file))
    made_by = {out: node for node in graph.graph.node for out in node.output}
    pinned = 0
    for node in graph.graph.node:
        scope = next((p for p in scopes if node.name.startswith(p)), None)
        shape = made_by.get(node.input[1]) if node.op_type == "Reshape" and scope else None
        if shape is None or shape.op_type != "Concat":
            continue
        parts = [made_by.get(name) for name in shape.input]
        values = [numpy_helper.to_array(p.attribute[0].t).tolist() if p is not None and p.op_type == "Constant"
                  else None for p in parts]  # fmt: skip
        if values[-2:] == [[-1], [head_size]] and len(values) == 4:
            target, fill = parts[-2], scopes[scope]
        elif values[-1:] == [[-1]] and len(values) == 3:
            target, fill = parts[-1], scopes[scope] * head_size
        else:
            continue
        target.attribute[0].t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(target.attribute[0].t) * 0 + fill))
        pinned += 1
    onnx.save(graph, str(file))
    return pinned


def optimize_graph(src: Path, dest: Path, fuse_attention: bool = True, model_type: str = "bert") -> dict:
    """ORT transformer optimizer on `src` (`model_type`: ONNX Runtime's optimizer model type, the architecture's
    `ArchSpec.ort_model_type`), written to `dest`; returns `{"fused_ops": {op_type: count}}`: how many of each fused
    op it made (Attention, SkipLayerNormalization, EmbedLayerNormalization, BiasGelu, ...; zero counts left out).

    num_heads=0 / hidden_size=0 make the attention fusion read each layer's head count and width from its own Q
    reshape (pinned by `export_fp32`) instead of one value for the whole model, which is what a pruned model with
    uneven heads needs; a layer left with no heads has no attention subgraph, so there is nothing to fuse there and
    its LayerNorms still fuse. `fuse_attention=False` keeps every other fusion.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions(model_type)
    options.enable_attention = fuse_attention
    with quiet_ort():
        optimized = optimize_model(
            str(src), model_type=model_type, num_heads=0, hidden_size=0, optimization_options=options, use_gpu=False
        )
        dest.parent.mkdir(parents=True, exist_ok=True)
        optimized.save_model_to_file(str(dest))
        fused = optimized.get_fused_operator_statistics()
    return {"fused_ops": {k: int(v) for k, v in fused.items() if v}}


def unfuse_skip_norms(file: Path) -> int:
    """Replace each `SkipLayerNormalization` in a graph by the `Add`s and `LayerNormalization` it fused, in place;
    returns how many it replaced.

    Both optimizers (ONNX Runtime's and onnxscript's) make this fusion, but ONNX Runtime's CPU kernel for it is a
    scalar loop, slower than the vectorised `Add` and `LayerNormalization` kernels it replaces on any x86 CPU: left
    in, it makes the optimized and int8 graphs slower than they need to be. Sessions we create keep ONNX Runtime
    from fusing them again (`inference.SLOW_CPU_FUSIONS`). A node whose mean or inverse-std output is read, or a
    graph below opset 17 (no `LayerNormalization`), is left as it is.
    """
    import onnx
    from onnx import helper

    model = onnx.load(str(file), load_external_data=False)  # initializers untouched: external data stays valid
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    read = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    nodes, replaced = [], 0
    for node in model.graph.node:
        outputs = list(node.output) + [""] * (4 - len(node.output))
        if node.op_type != "SkipLayerNormalization" or opset < 17 or read & set(outputs[1:3]) - {""}:
            nodes.append(node)
            continue
        data, skip, gamma, *rest = list(node.input) + [""] * (5 - len(node.input))
        beta, bias = rest[0], rest[1]
        name = f"unfused_skip_norm_{replaced}"  # unique whatever the node was called (names may be empty)
        total = outputs[3] or f"{name}_sum"
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)  # the op's default
        summed = f"{name}_input_skip" if bias else total
        nodes.append(helper.make_node("Add", [data, skip], [summed], name=f"{name}_add"))
        if bias:
            nodes.append(helper.make_node("Add", [summed, bias], [total], name=f"{name}_bias"))
        norm_inputs = [total, gamma, *([beta] if beta else [])]
        nodes.append(helper.make_node("LayerNormalization", norm_inputs, [outputs[0]], name=f"{name}_norm",
                                      axis=-1, epsilon=epsilon))  # fmt: skip
        replaced += 1
    if replaced:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        onnx.save(model, str(file))
    return replaced


def node_count(file: Path) -> int:
    """Number of nodes in a graph: what the optimizer's fusions shrink (a tiny pruned BERT: 255 fp32, 29 fused)."""
    import onnx

    return len(onnx.load(str(file), load_external_data=False).graph.node)


def attention_nodes(file: Path) -> dict[str, list[int]]:
    """`{op_type: [num_heads of each node]}` of the fused attention nodes in a graph (empty when none fused)."""
    import onnx

    graph = onnx.load(str(file), load_external_data=False).graph
    found: dict[str, list[int]] = {}
    for node in graph.node:
        if node.op_type in ATTENTION_OPS:
            heads = next((a.i for a in node.attribute if a.name == "num_heads"), 0)
            found.setdefault(node.op_type, []).append(int(heads))
    return found


def fusion_label(attention_layers: int, fused: int, fuses: bool) -> str:
    """How the optimised graph's attention fused: "full" (one node per layer with heads), "partial", "none", or
    "n/a (why)" where there is nothing ORT could fuse."""
    if attention_layers == 0:
        return "n/a (no layer has heads left)"
    if not fuses:
        return "n/a (ONNX Runtime has no fusion for this architecture's attention)"
    return "full" if fused == attention_layers else ("partial" if fused else "none")
