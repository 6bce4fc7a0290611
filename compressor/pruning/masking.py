"""Head gates ξ and attention-probability hooks.

`MHA(x) = Concat_h(ξ_h · head_h(x)) W_O`: a forward pre-hook on each layer's output projection W_O multiplies
each head's slice of W_O's input by its gate. This is exact for every attention implementation (eager, SDPA),
works on physically pruned models (gates are indexed by *original* head ids), and gives gradients w.r.t. ξ for
free when the gate tensor requires grad (Michel's I_h). A gate of 0 is numerically the same as removing the head.

FFN neurons work the same way: `FFN(x) = (ν ⊙ act(x W_1)) W_2`, a pre-hook on W_2 scales each neuron's input
column by its gate ν (indexed by *original* neuron id). A layer whose head gates and neuron gates are all 0 is
skipped (its output is its input), exactly as surgery replaces it by an identity.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import torch
from torch import nn

from compressor.surgery.arch import (
    arch_spec,
    get_path,
    head_size,
    hidden_kwarg,
    layers,
    num_layers,
    original_ffn_size,
    original_hidden,
    original_num_heads,
    present_heads,
    present_hidden,
    present_neurons,
    removed_layers,
)
from compressor.surgery.width import head_writers, stream_norms


def full_gates(model: nn.Module, value: float = 1.0) -> torch.Tensor:
    """A [layers, heads] gate tensor over original head ids, filled with `value`."""
    return torch.full((num_layers(model), original_num_heads(model)), float(value))


def full_neuron_gates(model: nn.Module, value: float = 1.0) -> torch.Tensor:
    """A [layers, FFN neurons] gate tensor over original neuron ids, filled with `value`."""
    return torch.full((num_layers(model), original_ffn_size(model)), float(value))


def _gate_hook(gates: torch.Tensor, layer: int, heads: list[int], size: int):
    """Pre-hook scaling each of `heads` (blocks of `size` input columns; size 1 for neurons) by its gate."""
    index = torch.tensor(heads, dtype=torch.long)

    def hook(_module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        g = gates[layer].index_select(0, index.to(gates.device)).to(device=x.device, dtype=x.dtype)
        shaped = x.reshape(*x.shape[:-1], len(heads), size) * g[:, None]
        return (shaped.reshape(x.shape), *args[1:])

    return hook


def _check_shape(name: str, gates: torch.Tensor, expected: tuple[int, int]) -> None:
    if tuple(gates.shape) != expected:
        raise ValueError(f"{name}: expected shape {expected}, got {tuple(gates.shape)}")


def _live(heads: torch.Tensor, neurons: torch.Tensor, layer: int, h_index: torch.Tensor, n_index: torch.Tensor) -> bool:
    """Whether any of `layer`'s present heads (`h_index`) or neurons (`n_index`) is gated open."""
    if heads[layer].index_select(0, h_index.to(heads.device)).any():
        return True
    return bool(neurons[layer].index_select(0, n_index.to(neurons.device)).any())


def passthrough_layers(model: nn.Module, gates: torch.Tensor | None, neurons: torch.Tensor | None) -> frozenset[int]:
    """The layers of `model` that return their input as `gated(model, gates, neurons)` runs it: removed whole
    (`config.removed_layers`), or, with neuron gates given, with every present head and neuron gated to 0."""
    skip = set(removed_layers(model))
    if neurons is not None:
        heads = gates if gates is not None else full_gates(model).to(neurons.device)
        for layer, ids in enumerate(zip(present_heads(model), present_neurons(model), strict=True)):
            index = [torch.tensor(i, dtype=torch.long) for i in ids]
            if (ids[0] or ids[1]) and not _live(heads, neurons, layer, *index):
                skip.add(layer)
    return frozenset(skip)


def _skip_hook(heads: torch.Tensor, neurons: torch.Tensor, layer: int, ids: tuple[list[int], list[int]]):
    """Forward hook: when every present head and neuron of `layer` is gated to 0, the layer returns its input
    (transformers 5 layers return the hidden states alone; tuple-returning ones keep their tuple). `ids` are the
    present (head, neuron) ids."""
    h_index, n_index = (torch.tensor(i, dtype=torch.long) for i in ids)

    def hook(_module: nn.Module, args: tuple, kwargs: dict, output):
        if _live(heads, neurons, layer, h_index, n_index):
            return output
        hidden = args[0] if args else kwargs[hidden_kwarg(kwargs)]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden  # tuple layers (MPNet): input first

    return hook


@contextmanager
def gated(
    model: nn.Module,
    gates: torch.Tensor | None,
    neurons: torch.Tensor | None = None,
    hidden: torch.Tensor | None = None,
) -> Iterator[torch.Tensor | None]:
    """Apply head `gates` ([layers, original heads]) and FFN `neurons` gates ([layers, original FFN width]) to
    `model` inside the block; `None` leaves that unit kind ungated (both None: a no-op).

    The tensors are read at every forward, so callers may update them in place (or let autograd track them).
    With neuron gates given, a layer whose present heads and neurons are all gated to 0 is skipped (identity).
    `hidden` ([original width] bool) keeps those residual channels: every stream LayerNorm normalises over them
    and outputs 0 elsewhere, and the head's hidden Linear is zeroed elsewhere (`narrowed`), as a width cut computes.
    """
    if gates is None and neurons is None and hidden is None:
        yield None
        return
    if gates is None and neurons is None:
        with narrowed(model, hidden):
            yield None
        return
    if gates is not None:
        _check_shape("gates", gates, (num_layers(model), original_num_heads(model)))
    if neurons is not None:
        _check_shape("neuron gates", neurons, (num_layers(model), original_ffn_size(model)))
    spec, size, handles = arch_spec(model), head_size(model), []
    units = zip(layers(model), present_heads(model), present_neurons(model), strict=True)
    for layer, (module, heads, cells) in enumerate(units):
        if heads and gates is not None:
            proj = get_path(module, spec.out_proj)
            handles.append(proj.register_forward_pre_hook(_gate_hook(gates, layer, heads, size)))
        if cells and neurons is not None:
            proj = get_path(module, spec.ffn_out)
            handles.append(proj.register_forward_pre_hook(_gate_hook(neurons, layer, cells, 1)))
        if neurons is not None and (heads or cells):
            head_gates = gates if gates is not None else full_gates(model).to(neurons.device)
            hook = _skip_hook(head_gates, neurons, layer, (heads, cells))
            handles.append(module.register_forward_hook(hook, with_kwargs=True, prepend=True))  # before output capture
    try:
        with narrowed(model, hidden):
            yield gates if gates is not None else neurons
    finally:
        for handle in handles:
            handle.remove()


def _masked_norm(keep: torch.Tensor):
    """Forward hook: a LayerNorm's output recomputed over the stream positions `keep` only, 0 at the others."""

    def hook(module: nn.LayerNorm, args: tuple, output: torch.Tensor) -> torch.Tensor:
        x, index = args[0], keep.to(args[0].device)
        weight = None if module.weight is None else module.weight.index_select(0, index)
        bias = None if module.bias is None else module.bias.index_select(0, index)
        kept = nn.functional.layer_norm(x.index_select(-1, index), (len(index),), weight, bias, module.eps)
        return torch.zeros_like(output).index_copy(-1, index, kept.to(output.dtype))

    return hook


def _zeroed(keep: torch.Tensor):
    """Forward hook: a Linear's output with every stream position outside `keep` set to 0."""

    def hook(_module: nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(output.shape[-1], dtype=output.dtype, device=output.device)
        return output * mask.index_fill(0, keep.to(output.device), 1)

    return hook


@contextmanager
def narrowed(model: nn.Module, hidden: torch.Tensor | None) -> Iterator[None]:
    """Inside the block, `model` computes as if cut to the residual channels `hidden` keeps ([original width]
    bool; None: unchanged): what `surgery.width.prune_hidden` then makes exact."""
    if hidden is None:
        yield
        return
    _check_shape("hidden", hidden.unsqueeze(0), (1, original_hidden(model)))
    present = present_hidden(model)
    if bool(hidden[present].all()):
        yield
        return
    keep = torch.tensor([pos for pos, channel in enumerate(present) if hidden[channel]], dtype=torch.long)
    handles = [norm.register_forward_hook(_masked_norm(keep)) for norm in stream_norms(model)]
    handles += [linear.register_forward_hook(_zeroed(keep)) for linear in head_writers(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


RECORDED = "compressor_recorded"  # the attention implementation AttentionRecorder switches a model to
_ACTIVE: list[AttentionRecorder] = []  # recorders attached right now, innermost last


def _recorded_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **_kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention (transformers' own arithmetic) that lets the active recorder see and rescale the
    probabilities of the modules it watches."""
    scores = torch.matmul(query, key.transpose(2, 3)) * (query.size(-1) ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = nn.functional.softmax(scores, dim=-1)
    recorder = _ACTIVE[-1] if _ACTIVE else None
    if recorder is not None and id(module) in recorder.watched:
        probs = recorder.observe(recorder.watched[id(module)], probs)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


@cache
def _register_recorded_attention() -> None:
    """Make RECORDED a valid attention implementation (with eager's additive mask) for every transformers model; done
    when a recorder first attaches, not at import: transformers' attention interface pulls in its modeling code,
    which the command line does not need to check a recipe."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(RECORDED, _recorded_attention)
    AttentionMaskInterface.register(RECORDED, eager_mask)


class AttentionRecorder:
    """Captures (and optionally rescales) attention probabilities per layer during a forward pass.

    Architectures whose attention goes through transformers' attention interface (`ArchSpec.probs_dropout` None) are
    switched to an eager implementation of our own while attached, whatever they were loaded with (SDPA included);
    the others are hooked at the dropout module their eager attention applies to the probabilities, which needs the
    model loaded with eager attention (refused in one line otherwise). `scale[layer]` multiplies that layer's
    probabilities (AttAttr's α·A); with `retain_grad=True` the recorded tensors keep their gradients after
    `backward()`. Probabilities are [batch, present heads, query, key]; layers without heads record nothing.
    """

    def __init__(self, scale: dict[int, float | torch.Tensor] | None = None, retain_grad: bool = False):
        self.scale = scale or {}
        self.retain_grad = retain_grad
        self.probs: dict[int, torch.Tensor] = {}
        self.watched: dict[int, int] = {}  # id(attention module) → layer

    def observe(self, layer: int, probs: torch.Tensor) -> torch.Tensor:
        """Record `probs` for `layer` and return what attention goes on with (scaled when asked)."""
        if layer in self.scale:
            # Keep the unscaled A as the leaf the caller differentiates against.
            base = probs.detach().requires_grad_(True) if self.retain_grad else probs
            self.probs[layer] = base
            return base * self.scale[layer]
        if self.retain_grad and probs.requires_grad:
            probs.retain_grad()
        self.probs[layer] = probs
        return probs

    def _hook(self, layer: int):
        return lambda _module, _args, output: self.observe(layer, output)

    @contextmanager
    def attach(self, model: nn.Module) -> Iterator[AttentionRecorder]:
        spec = arch_spec(model)
        modules = [
            (layer, get_path(module, spec.self_attn))
            for layer, (module, heads) in enumerate(zip(layers(model), present_heads(model), strict=True))
            if heads
        ]
        if spec.probs_dropout is None:
            with self._interface(model, modules):
                yield self
            return
        impl = getattr(model.config, "_attn_implementation", "eager")
        if impl != "eager":
            raise RuntimeError(
                f"attention maps of '{model.config.model_type}' need attn_implementation='eager' (model has "
                f"'{impl}'); load it with compressor.sources.load_model(..., attention='eager')"
            )
        handles = [get_path(attn, spec.probs_dropout).register_forward_hook(self._hook(i)) for i, attn in modules]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    @contextmanager
    def _interface(self, model: nn.Module, modules: list[tuple[int, nn.Module]]) -> Iterator[None]:
        """Switch `model` to the recorded attention while inside, restoring its own implementation after."""
        _register_recorded_attention()
        previous = model.config._attn_implementation
        self.watched = {id(attn): layer for layer, attn in modules}
        model.config._attn_implementation = RECORDED
        _ACTIVE.append(self)
        try:
            yield
        finally:
            _ACTIVE.remove(self)
            model.config._attn_implementation = previous
