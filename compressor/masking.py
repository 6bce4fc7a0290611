"""Head gates ξ and attention-probability hooks.

`MHA(x) = Concat_h(ξ_h · head_h(x)) W_O`: a forward pre-hook on each layer's output projection W_O multiplies
each head's slice of W_O's input by its gate. This is exact for every attention implementation (eager, SDPA),
works on physically pruned models (gates are indexed by *original* head ids), and gives gradients w.r.t. ξ for
free when the gate tensor requires grad (Michel's I_h). A gate of 0 is numerically the same as removing the head.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from compressor.layout import (
    arch_spec,
    get_path,
    head_size,
    layers,
    num_layers,
    original_num_heads,
    present_heads,
)


def full_gates(model: nn.Module, value: float = 1.0) -> torch.Tensor:
    """A [layers, heads] gate tensor over original head ids, filled with `value`."""
    return torch.full((num_layers(model), original_num_heads(model)), float(value))


def _gate_hook(gates: torch.Tensor, layer: int, heads: list[int], size: int):
    index = torch.tensor(heads, dtype=torch.long)

    def hook(_module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        g = gates[layer].index_select(0, index.to(gates.device)).to(x.dtype)
        shaped = x.reshape(*x.shape[:-1], len(heads), size) * g[:, None]
        return (shaped.reshape(x.shape), *args[1:])

    return hook


@contextmanager
def gated(model: nn.Module, gates: torch.Tensor | None) -> Iterator[torch.Tensor | None]:
    """Apply `gates` ([layers, original heads]) to `model` inside the block; `None` is a no-op.

    The tensor is read at every forward, so callers may update it in place (or let autograd track it).
    """
    if gates is None:
        yield None
        return
    expected = (num_layers(model), original_num_heads(model))
    if tuple(gates.shape) != expected:
        raise ValueError(f"gates: expected shape {expected}, got {tuple(gates.shape)}")
    spec, size, handles = arch_spec(model), head_size(model), []
    for layer, (module, heads) in enumerate(zip(layers(model), present_heads(model), strict=True)):
        if heads:
            proj = get_path(module, spec.out_proj)
            handles.append(proj.register_forward_pre_hook(_gate_hook(gates, layer, heads, size)))
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()


class AttentionRecorder:
    """Captures (and optionally rescales) attention probabilities per layer during a forward pass.

    Hooks the dropout applied to attention probabilities, which both eager BERT-family and DistilBERT attention
    call on the softmax output. `scale[layer]` multiplies that layer's probabilities (AttAttr's α·A); with
    `retain_grad=True` the recorded tensors keep their gradients after `backward()`.
    Probabilities are [batch, present heads, query, key]; layers without heads record nothing.
    """

    def __init__(self, scale: dict[int, float | torch.Tensor] | None = None, retain_grad: bool = False):
        self.scale = scale or {}
        self.retain_grad = retain_grad
        self.probs: dict[int, torch.Tensor] = {}

    def _hook(self, layer: int):
        def hook(_module: nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
            if layer in self.scale:
                # Keep the unscaled A as the leaf the caller differentiates against.
                base = output.detach().requires_grad_(True) if self.retain_grad else output
                self.probs[layer] = base
                return base * self.scale[layer]
            if self.retain_grad and output.requires_grad:
                output.retain_grad()
            self.probs[layer] = output
            return output

        return hook

    @contextmanager
    def attach(self, model: nn.Module) -> Iterator[AttentionRecorder]:
        impl = getattr(model.config, "_attn_implementation", "eager")
        if impl != "eager":
            raise RuntimeError(
                f"attention maps need attn_implementation='eager' (model has '{impl}'); "
                "load it with compressor.sources.load_model(..., attention='eager')"
            )
        spec = arch_spec(model)
        handles = []
        for layer, (module, heads) in enumerate(zip(layers(model), present_heads(model), strict=True)):
            if heads:
                drop = get_path(get_path(module, spec.self_attn), spec.probs_dropout)
                handles.append(drop.register_forward_hook(self._hook(layer)))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
