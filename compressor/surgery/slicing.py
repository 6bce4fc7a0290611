"""Physical removal of heads, FFN neurons and whole layers: pure weight slicing from a plan, no training or data.

A *plan* is `{layer: [original head ids to remove]}`. Pruning is cumulative and always refers to original ids,
and recorded in `config.pruned_heads` (our own bookkeeping: transformers 5 no longer reads it), so a model pruned in
several rounds equals one pruned once with the union. A layer that loses every head gets an `EmptyAttention` block:
its attention output is just W_O's bias (then dropout, residual and LayerNorm as usual); nothing else is computed.
The replacement modules live in `surgery.portable`, which saved models ship for loading without compressor.

FFN neurons follow the same rules with `{layer: [original neuron ids]}` plans recorded in `config.pruned_neurons`
(W_1 rows and W_2 columns sliced). A layer that has lost every head *and* every neuron is replaced by a
`SkippedLayer` (identity, no parameters) and listed in `config.removed_layers`, so masked == pruned holds.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from compressor.core.errors import UserError
from compressor.surgery.arch import (
    arch_spec,
    get_path,
    head_size,
    layers,
    original_ffn_size,
    original_num_heads,
    present_heads,
    present_neurons,
    pruned_neurons,
    removed_layers,
    set_path,
)
from compressor.surgery.portable import EmptyAttention, SkippedLayer, empty_linear  # noqa: F401  (re-exported)

Plan = dict[int, list[int]]


class PlanError(UserError, ValueError):
    """A prune plan names a layer or head that does not exist (raised before the model is touched)."""


def _index(heads: list[int], size: int) -> torch.Tensor:
    return torch.cat([torch.arange(h * size, (h + 1) * size) for h in heads]).long()


def _slice_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping `index` along output rows (dim=0) or input columns (dim=1)."""
    weight = linear.weight.index_select(dim, index.to(linear.weight.device)).detach()
    new = empty_linear(weight.shape[1], weight.shape[0], linear)
    with torch.no_grad():
        new.weight.copy_(weight)
        if linear.bias is not None:
            new.bias.copy_(linear.bias.index_select(0, index.to(linear.bias.device)) if dim == 0 else linear.bias)
    new.weight.requires_grad_(linear.weight.requires_grad)
    return new


def _as_int(value: object, what: str) -> int:
    """`value` as an int, refusing bools, floats with a fraction and non-numeric strings."""
    if isinstance(value, bool):
        raise PlanError(f"plan: {what} {value!r} is not an integer index")
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise PlanError(f"plan: {what} {value!r} is not an integer index") from None
    if isinstance(value, float) and number != value:
        raise PlanError(f"plan: {what} {value!r} is not an integer index")
    return number


def validate_plan(model: nn.Module, plan: Mapping[int | str, Iterable[int]], unit: str = "head") -> Plan:
    """Normalise a plan to `{int layer: sorted unique int ids}` and check every index against the *original*
    architecture (config), so a plan that is valid for the unpruned model stays valid after any pruning round.
    `unit` is "head" or "neuron" (FFN neurons, ids up to the original FFN width).

    Raises `PlanError` (a ValueError) naming the offending layer/id and the expected range; nothing is modified.
    """
    if not isinstance(plan, Mapping):
        raise PlanError(f"plan: expected a mapping {{layer: [{unit} ids]}}, got {type(plan).__name__}")
    n_layers = len(layers(model))
    n_heads = original_num_heads(model) if unit == "head" else original_ffn_size(model)
    out: Plan = {}
    for key, heads in plan.items():
        layer = _as_int(key, "layer")
        if not 0 <= layer < n_layers:
            raise PlanError(f"plan: layer {layer} out of range; expected 0..{n_layers - 1}")
        if layer in out:
            raise PlanError(f"plan: layer {layer} appears twice (as {key!r})")
        if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
            raise PlanError(f"plan: layer {layer} expected a list of {unit} ids, got {heads!r}")
        ids = [_as_int(h, f"layer {layer} {unit}") for h in heads]
        bad = [h for h in ids if not 0 <= h < n_heads]
        if bad:
            raise PlanError(f"plan: layer {layer} {unit}s {bad} out of range; expected 0..{n_heads - 1}")
        out[layer] = sorted(set(ids))
    return out


def prune_heads(model: nn.Module, plan: Plan) -> nn.Module:
    """Remove the heads in `plan` (original ids) from `model` in place and record them in `config.pruned_heads`.

    Heads already removed are ignored, so replaying a cumulative plan is idempotent. Unsupported architectures
    (`UnsupportedArchitectureError`, naming the model type) and bad plans (`PlanError`) are refused before any
    module is touched.
    """
    spec = arch_spec(model)
    plan = validate_plan(model, plan)
    size = head_size(model)
    present = present_heads(model)
    recorded = {int(k): set(v) for k, v in (getattr(model.config, "pruned_heads", None) or {}).items()}
    for layer, remove in plan.items():
        module = layers(model)[layer]
        current = present[layer]
        keep_pos = [i for i, h in enumerate(current) if h not in remove]
        if len(keep_pos) == len(current):
            continue
        recorded[layer] = recorded.get(layer, set()) | set(remove)
        if not keep_pos:
            set_path(module, spec.attention, spec.empty_attention(get_path(module, spec.attention)))
            continue
        index = _index(keep_pos, size)
        attn = get_path(module, spec.self_attn)
        for name, rows in spec.attn.projection_rows(attn, index, len(current) * size).items():
            setattr(attn, name, _slice_linear(getattr(attn, name), rows, dim=0))
        set_path(module, spec.out_proj, _slice_linear(get_path(module, spec.out_proj), index, dim=1))
        for attr, value in ((spec.heads_attr, len(keep_pos)), (spec.width_attr, len(keep_pos) * size)):
            if attr:
                setattr(attn, attr, value)
        spec.attn.keep_heads(attn, [current[i] for i in keep_pos])
    model.config.pruned_heads = {k: sorted(v) for k, v in sorted(recorded.items()) if v}
    return _drop_dead_layers(model)


def pruned_copy(model: nn.Module, plan: Plan, neurons: Plan | None = None) -> nn.Module:
    """`prune_heads` (then `prune_neurons` with `neurons`) on a deep copy, leaving `model` untouched."""
    out = prune_heads(copy.deepcopy(model), plan)
    return prune_neurons(out, neurons) if neurons else out


def empty_layers(model: nn.Module) -> list[int]:
    """Layers whose attention block has no heads left."""
    return [i for i, heads in enumerate(present_heads(model)) if not heads]


def prune_neurons(model: nn.Module, plan: Plan) -> nn.Module:
    """Remove the FFN neurons in `plan` (original ids) in place: W_1 rows and W_2 columns are sliced, and
    `config.pruned_neurons` records them. Replaying a cumulative plan is idempotent; bad plans are refused first.

    A layer left with no neuron keeps W_2's bias as its FFN output; one with no head and no neuron is removed.
    """
    spec = arch_spec(model)
    plan = validate_plan(model, plan, unit="neuron")
    present = present_neurons(model)
    recorded = {k: set(v) for k, v in pruned_neurons(model).items()}
    for layer, remove in plan.items():
        keep_pos = [i for i, n in enumerate(present[layer]) if n not in remove]
        if len(keep_pos) == len(present[layer]):
            continue
        recorded[layer] = recorded.get(layer, set()) | set(remove)
        module, index = layers(model)[layer], torch.tensor(keep_pos, dtype=torch.long)
        rows = spec.ffn.in_rows(index, len(present[layer]))
        set_path(module, spec.ffn_in, _slice_linear(get_path(module, spec.ffn_in), rows, dim=0))
        set_path(module, spec.ffn_out, _slice_linear(get_path(module, spec.ffn_out), index, dim=1))
    model.config.pruned_neurons = {k: sorted(v) for k, v in sorted(recorded.items()) if v}
    return _drop_dead_layers(model)


def remove_layers(model: nn.Module, remove: Iterable[int]) -> nn.Module:
    """Replace layers `remove` (original ids) by `SkippedLayer` in place, recording all their heads and neurons
    as pruned and the layers in `config.removed_layers`. Out-of-range ids raise `PlanError` before any change."""
    spec, n_layers = arch_spec(model), len(layers(model))
    ids = sorted({_as_int(i, "layer") for i in remove})
    bad = [i for i in ids if not 0 <= i < n_layers]
    if bad:
        raise PlanError(f"plan: layers {bad} out of range; expected 0..{n_layers - 1}")
    heads = {k: set(v) for k, v in (getattr(model.config, "pruned_heads", None) or {}).items()}
    neurons = {k: set(v) for k, v in pruned_neurons(model).items()}
    for layer in ids:
        spec.skip_layer(model, layer)
        heads[layer] = set(range(original_num_heads(model)))
        neurons[layer] = set(range(original_ffn_size(model)))
    model.config.pruned_heads = {int(k): sorted(v) for k, v in sorted(heads.items()) if v}
    model.config.pruned_neurons = {k: sorted(v) for k, v in sorted(neurons.items()) if v}
    model.config.removed_layers = sorted(set(removed_layers(model)) | set(ids))
    return model


def _drop_dead_layers(model: nn.Module) -> nn.Module:
    """Remove (as `remove_layers`) every layer that has neither heads nor FFN neurons left but is still built."""
    gone = set(removed_layers(model))
    units = zip(present_heads(model), present_neurons(model), strict=True)
    dead = [i for i, (h, n) in enumerate(units) if not h and not n and i not in gone]
    return remove_layers(model, dead) if dead else model


def padded_empty_ffns(model: nn.Module) -> nn.Module:
    """`model`, or a copy in which every built layer left with no FFN neuron computes one neuron of zero weights
    instead of none: W_1 gets one zero row per block, W_2 one zero column and its own bias, so the FFN's output is
    still W_2's bias, exactly. For export: a graph holding zero-sized weights runs in ONNX Runtime, but OpenVINO's
    ONNX reader takes a [hidden, 0] MatMul weight for a scalar and refuses the graph. The saved model keeps no
    neuron (its config and FLOPs are unchanged)."""
    spec, gone = arch_spec(model), set(removed_layers(model))
    empty = [i for i, neurons in enumerate(present_neurons(model)) if not neurons and i not in gone]
    if not empty:
        return model
    model = copy.deepcopy(model)
    for i in empty:
        layer = layers(model)[i]
        w_in, w_out = get_path(layer, spec.ffn_in), get_path(layer, spec.ffn_out)
        new_in = empty_linear(w_in.in_features, spec.ffn.neuron_rows(), w_in)
        new_out = empty_linear(1, w_out.out_features, w_out)
        with torch.no_grad():
            for new in (new_in, new_out):
                new.weight.zero_()
            if new_in.bias is not None:
                new_in.bias.zero_()
            if new_out.bias is not None:
                new_out.bias.copy_(w_out.bias)
        set_path(layer, spec.ffn_in, new_in)
        set_path(layer, spec.ffn_out, new_out)
    return model
