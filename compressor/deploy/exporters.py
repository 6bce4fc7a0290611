"""How a model becomes an ONNX graph, and how that graph is fused for ONNX Runtime: one `Exporter` per exporter.

- `torch.export` (tried first by "auto"): `torch.onnx.export(dynamo=True)`, the exporter torch maintains and its
  default. Its graph is fused by onnxscript's ONNX Runtime fusions (`onnxscript.rewriter.ort_fusions.optimize_for_ort`),
  which read each layer's head count off its own subgraph: uneven heads fuse, ModernBERT's rotary attention too. Its
  fused `Attention` comes with the Q/K/V weight as a `Concat` and the padding mask as an additive `attention_bias`,
  which ONNX Runtime's quantizer cannot make a `QAttention` of; `attention_for_quantizer` folds the weight into one
  initializer and passes the mask as a mask index, so int8 covers the Q/K/V projections. onnxscript has no embedding
  fusion; `embeddings_for_ort` makes the `EmbedLayerNormalization` ONNX Runtime's optimizer makes of TorchScript's
  graph, so int8 reads the embeddings in one `QEmbedLayerNormalization` as it does there.
- `torchscript`: the TorchScript tracer (deprecated in torch), kept as the fallback "auto" takes when torch.export
  raises or its graph fails the parity gate. Its graph has each layer's head count pinned into the attention reshapes
  (`graph.pin_head_counts`) and is fused by ONNX Runtime's transformer optimizer (`graph.optimize_graph`).

`preference` turns the recipe's `export.exporter` ("auto", or one exporter by name) into the exporters to try in
order; `export_graph` tries them and says which one wrote the graph and why an earlier one could not (an error, or a
graph failing the parity gate). `COMPRESSOR_EXPORTER` names the exporter "auto" starts from (the other stays its
fallback).

The latency tables' synthetic blocks (`deploy.engines.onnx_runtime.onnx_graph`) are traced with TorchScript: those
graphs are timed by the budget, never shipped, a table has many of them, and the tracer writes each faster (the
`export_paths` benchmark).
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from compressor.core import compat
from compressor.core.errors import UserError
from compressor.deploy.graph import attention_scopes, optimize_graph, pin_head_counts
from compressor.surgery.arch import head_size

log = logging.getLogger(__name__)

AUTO = "auto"
EXPORTER_ENV = "COMPRESSOR_EXPORTER"  # the exporter "auto" starts from (the other stays its fallback)
CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's own ops: what a fusion leaves in a graph


@dataclass(frozen=True)
class Exported:
    """A written fp32 graph: its file, the exporter that wrote it, and why each exporter tried before it failed."""

    file: Path
    exporter: str
    fell_back: tuple[tuple[str, str], ...] = ()  # (exporter, one-line reason) of each earlier try

    def record(self) -> dict:
        """The manifest's fields: "exporter" and, after a fallback, "exporter_fallback" (`{exporter: reason}`)."""
        return {"exporter": self.exporter, **({"exporter_fallback": dict(self.fell_back)} if self.fell_back else {})}


class Exporter:
    """One way of writing a model's ONNX graph (`write`) and of fusing that graph for ONNX Runtime (`fuse`)."""

    name = ""
    default_opset = 18

    def write(self, model: nn.Module, file: Path, inputs: Mapping[str, torch.Tensor], opset: int | None) -> None:
        """`model` (called with keyword `inputs`) as an ONNX graph at `file`: inputs named as `inputs` with dynamic
        batch and sequence axes, output "logits" with a dynamic batch axis."""
        raise NotImplementedError

    def fuse(self, src: Path, dest: Path, fuse_attention: bool, model_type: str) -> dict:
        """`src`'s graph with ONNX Runtime's fused ops, at `dest`; returns `{"fused_ops": {op_type: count}}`."""
        raise NotImplementedError


def _arguments(inputs: Mapping[str, torch.Tensor], opset: int) -> dict:
    """`torch.onnx.export`'s arguments both exporters share: keyword inputs, names, dynamic batch/sequence axes."""
    names = list(inputs)
    axes = {**{n: {0: "batch_size", 1: "sequence_length"} for n in names}, "logits": {0: "batch_size"}}
    return {"kwargs": dict(inputs), "input_names": names, "output_names": ["logits"], "dynamic_axes": axes,
            "opset_version": opset}  # fmt: skip


def fused_ops(file: Path) -> dict[str, int]:
    """`{op_type: count}` of ONNX Runtime's own (contrib) ops in a graph: the fusions it holds, whoever made them."""
    import onnx

    graph = onnx.load(str(file), load_external_data=False).graph
    return dict(sorted(Counter(n.op_type for n in graph.node if n.domain == CONTRIB_DOMAIN).items()))


class TorchExport(Exporter):
    """`torch.onnx.export(dynamo=True)`, fused by onnxscript's ONNX Runtime fusions."""

    name = "torch.export"
    default_opset = 18

    def write(self, model, file, inputs, opset):
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            shared = _arguments(inputs, opset or self.default_opset)
            program = torch.onnx.export(model, (), **shared, dynamo=True, optimize=True, verbose=False)
        program.save(str(file))

    def fuse(self, src, dest, fuse_attention, model_type):
        """With `fuse_attention`, onnxscript's fusions (attention included); without, ONNX Runtime's optimizer with
        its attention fusion off (and the graph as exported where that optimizer cannot read it)."""
        if not fuse_attention:
            try:
                optimize_graph(src, dest, fuse_attention=False, model_type=model_type)
            except Exception as error:  # noqa: BLE001  ORT's optimizer does not parse every torch.export graph
                log.warning("export: ONNX Runtime's optimizer could not read the graph (%s); kept it unfused", error)
                shutil.copy2(src, dest)
            return {"fused_ops": fused_ops(dest)}
        import onnx
        from onnxscript import ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        model, _ = optimize_for_ort(ir.load(str(src)))
        rotary_positions_per_row(model)
        embeddings_for_ort(model)
        attention_for_quantizer(model)
        dest.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(ir.to_proto(model), str(dest))
        return {"fused_ops": fused_ops(dest)}


def rotary_positions_per_row(model) -> int:
    """Expand the position ids of each fused `RotaryEmbedding` that gets one row for the whole batch to one row per
    sequence; returns how many it expanded.

    transformers builds position ids as a (1, seq) row and broadcasts it; onnxscript's rotary fusion passes that row
    on, but ONNX Runtime's `RotaryEmbedding` wants (batch, seq) (or a scalar offset) and refuses any batch but 1 at run
    time. An `Expand` to (batch of the rotated input, 1) broadcasts it as PyTorch did; a row per sequence, or a
    shape the graph does not state, is left as it is.
    """
    from onnxscript import ir

    rows: dict[int, ir.Value] = {}  # one expansion per position-id value, shared by the layers that read it
    for node in list(model.graph):
        if node.op_type != "RotaryEmbedding" or node.domain != CONTRIB_DOMAIN:
            continue
        positions = node.inputs[1]
        shape = positions.shape
        if shape is None or len(shape) != 2 or shape[0] != 1:
            continue
        if id(positions) not in rows:
            batch = ir.node("Shape", [node.inputs[0]], {"start": 0, "end": 1})
            one = ir.node("Constant", [], {"value": ir.tensor([1], dtype=ir.DataType.INT64)})
            target = ir.node("Concat", [batch.outputs[0], one.outputs[0]], {"axis": 0})
            expand = ir.node("Expand", [positions, target.outputs[0]])
            model.graph.insert_before(node, [batch, one, target, expand])
            rows[id(positions)] = expand.outputs[0]
        node.replace_input_with(1, rows[id(positions)])
    return len(rows)


def embeddings_for_ort(model) -> int:
    """Fuse BERT-style embeddings (word, token-type and position lookups, summed, then a LayerNorm) into ONNX
    Runtime's `EmbedLayerNormalization`; returns how many it fused (0 or 1).

    onnxscript's fusions have no embedding fusion; ONNX Runtime's optimizer makes this one of the TorchScript graph,
    and its quantizer turns the fused op into `QEmbedLayerNormalization` (int8 tables, one kernel), where unfused
    each lookup reads an int8 table and is dequantized, then added and normalised op by op. Only the exact pattern
    is fused (`_embedding_parts`: absolute positions 0, 1, ...; RoBERTa's positions, offset from the padding, stay
    unfused). The op takes int32 ids, so the ids are cast; its mask output is left unused (the attention keeps its
    own mask). The parity gate checks it.
    """
    from onnxscript import ir

    for norm in list(model.graph):
        parts = _embedding_norm(norm)
        if parts is None:
            continue
        (words, positions, segments), gamma, beta, epsilon = parts
        ids = [ir.node("Cast", [v[0]], {"to": ir.DataType.INT32}) for v in (words, segments) if v]
        segment_ids = ids[1].outputs[0] if segments else None
        segment_table = segments[1] if segments else None
        inputs = [ids[0].outputs[0], segment_ids, words[1], positions[1], segment_table, gamma, beta]
        fused = ir.node(
            "EmbedLayerNormalization", inputs, {"epsilon": epsilon}, domain=CONTRIB_DOMAIN,
            num_outputs=2,  # output, mask index: the op's shape inference wants the second slot
        )  # fmt: skip
        model.graph.insert_before(norm, [*ids, fused])
        norm.outputs[0].replace_all_uses_with(fused.outputs[0])
        ir.passes.common.RemoveUnusedNodesPass()(model)  # the LayerNorm, the adds, the lookups, the position slice
        return 1
    return 0


def _embedding_norm(norm):
    """(embedding parts, gamma, beta, epsilon) when `norm` is the LayerNorm over the last axis of summed embedding
    lookups (`_embedding_parts`) with constant gamma and beta, not itself a graph output; else None."""
    if norm.op_type != "LayerNormalization" or norm.domain not in ("", "ai.onnx") or norm.outputs[0].is_graph_output():
        return None
    gamma, beta = (norm.inputs[i] if len(norm.inputs) > i else None for i in (1, 2))
    if gamma is None or beta is None or gamma.const_value is None or beta.const_value is None:
        return None
    axis, epsilon = norm.attributes.get("axis"), norm.attributes.get("epsilon")
    if axis is not None and axis.as_int() != -1:
        return None
    lookups = _summed_lookups(norm.inputs[0])
    parts = _embedding_parts(lookups) if lookups else None
    return None if parts is None else (parts, gamma, beta, epsilon.as_float() if epsilon else 1e-5)


def _summed_lookups(value) -> list | None:
    """The `Gather` nodes whose outputs `value` is the sum of (an `Add` tree of lookups), or None."""
    node = value.producer() if value is not None else None
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Gather":
        return [node]
    if node.op_type != "Add":
        return None
    left, right = _summed_lookups(node.inputs[0]), _summed_lookups(node.inputs[1])
    return left + right if left is not None and right is not None else None


def _embedding_parts(lookups: list):
    """((word ids, word table), (None, position table), (token types, token-type table) or ()) when the two or three
    lookups are BERT's embeddings, else None: every table an initializer of one width, the word ids the graph input
    `input_ids`, the token types `token_type_ids`, the positions absolute (`_absolute_positions`)."""
    if len(lookups) not in (2, 3):
        return None
    found: dict[str, tuple] = {}
    for node in lookups:
        table, ids = node.inputs[0], node.inputs[1]
        axis = node.attributes.get("axis")
        if table.const_value is None or (axis is not None and axis.as_int() != 0):
            return None
        if ids.is_graph_input() and ids.name in ("input_ids", "token_type_ids"):
            found[ids.name] = (ids, table)
        elif _absolute_positions(ids):
            found["positions"] = (None, table)
        else:
            return None
    widths = {part[1].const_value.shape[-1] for part in found.values()}
    if "input_ids" not in found or "positions" not in found or len(found) != len(lookups) or len(widths) != 1:
        return None
    return found["input_ids"], found["positions"], found.get("token_type_ids", ())


def _absolute_positions(value) -> bool:
    """Whether `value` is a `Slice` from 0 of a constant row 0, 1, 2, ... (transformers' `position_ids` buffer cut to
    the sequence): the positions `EmbedLayerNormalization` uses when given none."""
    import numpy as np

    node = value.producer()
    if node is None or node.op_type != "Slice" or len(node.inputs) < 3:
        return False
    data, starts = node.inputs[0].const_value, node.inputs[1].const_value
    if data is None or starts is None or np.any(starts.numpy() != 0):
        return False
    row = data.numpy()
    if row.ndim == 2 and row.shape[0] == 1:
        row = row[0]
    return row.ndim == 1 and np.array_equal(row, np.arange(row.size))


def attention_for_quantizer(model) -> int:
    """Rewrite each fused `Attention` the way ONNX Runtime's quantizer can make a `QAttention` of it; returns how
    many it rewrote.

    onnxscript's fusion leaves the packed Q/K/V weight and bias as a `Concat` of the three projections' initializers
    (too large for its constant folding) and passes the padding mask as an additive `attention_bias`; the quantizer
    wants the weight as one initializer, the mask as `mask_index` and no `qkv_hidden_sizes`, and leaves the node in
    fp32 otherwise. So the `Concat`s of initializers are folded into one initializer each, equal Q/K/V sizes are left
    to the weight's shape (the op's default), and an `attention_bias` computed from the graph's `attention_mask` input
    alone (padding, nothing else) is replaced by that mask as `mask_index` (the raw 0/1 mask, int32), which masks the
    same keys. The parity gate checks the result like any fused graph.
    """
    from onnxscript import ir

    mask = next((v for v in model.graph.inputs if v.name == "attention_mask" and len(v.shape or ()) == 2), None)
    mask_index = None
    rewritten = 0
    for node in list(model.graph):
        if node.op_type != "Attention" or node.domain != CONTRIB_DOMAIN:
            continue
        for i in (1, 2):  # weight, bias
            if len(node.inputs) > i and (folded := _folded_concat(model, node.inputs[i])) is not None:
                node.replace_input_with(i, folded)
        sizes = node.attributes.get("qkv_hidden_sizes")
        if sizes is not None and len(set(sizes.as_ints())) == 1:  # the default; the quantizer skips a node naming it
            del node.attributes["qkv_hidden_sizes"]
        bias = node.inputs[5] if len(node.inputs) > 5 else None
        if mask is None or bias is None or node.inputs[3] is not None or _graph_inputs_of(bias) != {mask.name}:
            continue
        if mask_index is None:
            cast = ir.node("Cast", [mask], {"to": ir.DataType.INT32})
            model.graph.insert_before(node, cast)
            mask_index = cast.outputs[0]
        node.replace_input_with(3, mask_index)
        node.replace_input_with(5, None)
        rewritten += 1
    ir.passes.common.RemoveUnusedNodesPass()(model)  # the folded Concats, the bias's subgraph
    return rewritten


def _folded_concat(model, value):
    """One new initializer holding the `Concat` of initializers that produces `value`, or None when `value` is not
    such a `Concat`."""
    import numpy as np
    from onnxscript import ir

    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
        return None
    parts = [v.const_value for v in node.inputs]
    if any(part is None for part in parts):
        return None
    axis = node.attributes["axis"].as_int()
    tensor = ir.tensor(np.concatenate([part.numpy() for part in parts], axis))
    folded = ir.Value(
        name=f"{value.name}_folded", shape=tensor.shape, type=ir.TensorType(tensor.dtype), const_value=tensor
    )
    model.graph.register_initializer(folded)
    return folded


def _graph_inputs_of(value) -> set[str]:
    """The names of the graph inputs whose values `value` is computed from (constants and initializers aside; an
    input only measured by `Shape` lends its shape, not its values)."""
    seen, stack, inputs = set(), [value], set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        node = current.producer()
        if node is None:
            if current.const_value is None and current.is_graph_input():
                inputs.add(current.name)
            continue
        if node.op_type not in ("Shape", "Size"):
            stack.extend(node.inputs)
    return inputs


class TorchScript(Exporter):
    """The TorchScript tracer (deprecated in torch), fused by ONNX Runtime's transformer optimizer once each layer's
    head count is pinned into its attention reshapes."""

    name = "torchscript"
    default_opset = 17  # LayerNormalization as one op; ORT's optimizer and quantizer handle it

    def write(self, model, file, inputs, opset):
        with warnings.catch_warnings(), torch.no_grad(), compat.traceable(model):  # tracer warnings: parity checks it
            warnings.simplefilter("ignore")  # the model itself (no wrapper), so node names are its module paths
            torch.onnx.export(model, (), str(file), **_arguments(inputs, opset or self.default_opset), dynamo=False)
        pin_head_counts(file, attention_scopes(model), head_size(model))

    def fuse(self, src, dest, fuse_attention, model_type):
        optimize_graph(src, dest, fuse_attention=fuse_attention, model_type=model_type)
        return {"fused_ops": fused_ops(dest)}


EXPORTERS: dict[str, Exporter] = {e.name: e for e in (TorchExport(), TorchScript())}  # "auto" tries them in order


def choices() -> tuple[str, ...]:
    return (AUTO, *EXPORTERS)


def preference(choice: str = AUTO) -> list[str]:
    """The exporters to try, in order, for the recipe's `export.exporter`; "auto" is `COMPRESSOR_EXPORTER` when set."""
    if choice == AUTO:
        choice = os.environ.get(EXPORTER_ENV, "").strip() or AUTO
        field = EXPORTER_ENV
    else:
        field = "export.exporter"
    if choice not in choices():
        raise UserError(f"{field}: unknown exporter {choice!r}; expected one of {', '.join(choices())}")
    if choice == AUTO:
        return list(EXPORTERS)
    return [choice, *([n for n in EXPORTERS if n != choice] if field == EXPORTER_ENV else [])]


def reason(error: BaseException) -> str:
    """The first line of an exporter's error, for one log line and the manifest."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


def export_graph(
    model: nn.Module,
    file: Path,
    inputs: Mapping[str, torch.Tensor],
    choice: str = AUTO,
    opset: int | None = None,
    check: Callable[[Path], None] | None = None,
) -> Exported:
    """`model`'s ONNX graph at `file`, by the first exporter of `preference(choice)` that writes one (and whose graph
    passes `check`, when given). A fallback is one warning naming the exporter that failed and why; when every
    exporter fails, the last error is raised."""
    tried: list[tuple[str, str]] = []
    names = preference(choice)
    for position, name in enumerate(names):
        try:
            EXPORTERS[name].write(model, file, inputs, opset)
            if check is not None:
                check(file)
            return Exported(file, name, tuple(tried))
        except Exception as error:
            if position == len(names) - 1:
                raise
            tried.append((name, reason(error)))
            log.warning("export: %s could not export this model (%s); falling back to %s", name, tried[-1][1],
                        names[position + 1])  # fmt: skip
            file.unlink(missing_ok=True)
    raise AssertionError("unreachable: preference() is never empty")
