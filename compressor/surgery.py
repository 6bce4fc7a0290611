"""Physical head removal: pure weight slicing from a plan, no training or data imports.

A *plan* is `{layer: [original head ids to remove]}`. Pruning is cumulative and always refers to original ids,
as transformers' `config.pruned_heads` does, so a model pruned in several rounds equals one pruned once with the
union, and `from_pretrained` in plain transformers rebuilds the same shapes from the saved config.
A layer that loses every head gets an `EmptyAttention` block: its attention output is just W_O's bias
(then dropout, residual and LayerNorm as usual); nothing else is computed.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from compressor.errors import UserError
from compressor.layout import (
    arch_spec,
    get_path,
    head_size,
    layers,
    original_num_heads,
    present_heads,
    set_path,
)

Plan = dict[int, list[int]]


class PlanError(UserError, ValueError):
    """A prune plan names a layer or head that does not exist (raised before the model is touched)."""


def _no_input_linear(bias: nn.Parameter) -> nn.Linear:
    """A Linear with zero inputs whose output is its bias (the W_O of a layer without heads)."""
    with warnings.catch_warnings():  # kaiming init warns on a zero-element weight
        warnings.simplefilter("ignore")
        linear = nn.Linear(0, bias.shape[0], device=bias.device, dtype=bias.dtype)
    linear.bias = bias
    return linear


class EmptyAttention(nn.Module):
    """Attention block of a layer with no heads left: returns the output bias (plus residual/LayerNorm).

    Keeps the original sub-module names (`output.dense`, `output.LayerNorm` for BERT-like; `out_lin` for
    DistilBERT) so state-dict keys stay those of the original architecture.
    """

    def __init__(self, block: nn.Module, returns_normed: bool):
        super().__init__()
        self.returns_normed = returns_normed
        if returns_normed:  # BERT-like: block = BertAttention(self, output=SelfOutput(dense, dropout, LayerNorm))
            self.output = block.output
            self.output.dense = _no_input_linear(block.output.dense.bias)
        else:  # DistilBERT: block = MultiHeadSelfAttention; the layer applies residual and LayerNorm itself
            self.out_lin = _no_input_linear(block.out_lin.bias)

    def forward(self, hidden_states: torch.Tensor | None = None, *args, output_attentions: bool = False, **kwargs):
        """Same call signature and return tuple as the replaced block (BERT: hidden_states; DistilBERT: query=).

        Only shape-based tensor ops, no data-dependent Python branches, so tracing / ONNX export sees a constant
        graph: BERT-like `LayerNorm(dropout(b_O) + x)`, DistilBERT `b_O` broadcast to x (the layer adds x and
        normalises). With `output_attentions` the attention map has zero heads: [batch, 0, T, T].
        """
        x = hidden_states if hidden_states is not None else kwargs["query"]
        if self.returns_normed:
            out = self.output.LayerNorm(self.output.dropout(self.output.dense.bias.expand_as(x)) + x)
        else:
            out = self.out_lin.bias.expand_as(x)
        if output_attentions:
            b, t = x.shape[:2]
            return out, x.new_zeros(b, 0, t, t)
        return (out,)


def _index(heads: list[int], size: int) -> torch.Tensor:
    return torch.cat([torch.arange(h * size, (h + 1) * size) for h in heads]).long()


def _slice_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping `index` along output rows (dim=0) or input columns (dim=1)."""
    weight = linear.weight.index_select(dim, index.to(linear.weight.device)).detach().clone()
    bias = linear.bias
    if dim == 0 and bias is not None:
        bias = bias.index_select(0, index.to(bias.device))
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    new = new.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if bias is not None:
            new.bias.copy_(bias.detach())
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


def validate_plan(model: nn.Module, plan: Mapping[int | str, Iterable[int]]) -> Plan:
    """Normalise a plan to `{int layer: sorted unique int heads}` and check every index against the *original*
    architecture (config), so a plan that is valid for the unpruned model stays valid after any pruning round.

    Raises `PlanError` (a ValueError) naming the offending layer/head and the expected range; nothing is modified.
    """
    if not isinstance(plan, Mapping):
        raise PlanError(f"plan: expected a mapping {{layer: [head ids]}}, got {type(plan).__name__}")
    n_layers, n_heads = len(layers(model)), original_num_heads(model)
    out: Plan = {}
    for key, heads in plan.items():
        layer = _as_int(key, "layer")
        if not 0 <= layer < n_layers:
            raise PlanError(f"plan: layer {layer} out of range; expected 0..{n_layers - 1}")
        if layer in out:
            raise PlanError(f"plan: layer {layer} appears twice (as {key!r})")
        if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
            raise PlanError(f"plan: layer {layer} expected a list of head ids, got {heads!r}")
        ids = [_as_int(h, f"layer {layer} head") for h in heads]
        bad = [h for h in ids if not 0 <= h < n_heads]
        if bad:
            raise PlanError(f"plan: layer {layer} heads {bad} out of range; expected 0..{n_heads - 1}")
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
    recorded = {int(k): set(v) for k, v in (model.config.pruned_heads or {}).items()}
    for layer, remove in plan.items():
        module = layers(model)[layer]
        current = present[layer]
        keep_pos = [i for i, h in enumerate(current) if h not in remove]
        if len(keep_pos) == len(current):
            continue
        recorded[layer] = recorded.get(layer, set()) | set(remove)
        if not keep_pos:
            block = get_path(module, spec.attention)
            empty = EmptyAttention(block, returns_normed=hasattr(block, "output"))
            set_path(module, spec.attention, empty)
            continue
        index = _index(keep_pos, size)
        attn = get_path(module, spec.self_attn)
        for name in (spec.query, spec.key, spec.value):
            setattr(attn, name, _slice_linear(getattr(attn, name), index, dim=0))
        set_path(module, spec.out_proj, _slice_linear(get_path(module, spec.out_proj), index, dim=1))
        setattr(attn, spec.heads_attr, len(keep_pos))
        setattr(attn, spec.width_attr, len(keep_pos) * size)
        if hasattr(attn, "pruned_heads"):
            attn.pruned_heads = set(recorded[layer])
        if hasattr(get_path(module, spec.attention), "pruned_heads"):
            get_path(module, spec.attention).pruned_heads = set(recorded[layer])
    model.config.pruned_heads = {k: sorted(v) for k, v in sorted(recorded.items()) if v}
    return model


def pruned_copy(model: nn.Module, plan: Plan) -> nn.Module:
    """`prune_heads` on a deep copy, leaving `model` untouched."""
    return prune_heads(copy.deepcopy(model), plan)


def empty_layers(model: nn.Module) -> list[int]:
    """Layers whose attention block has no heads left."""
    return [i for i, heads in enumerate(present_heads(model)) if not heads]
