"""Reading a model's shape through its architecture's declaration: layers, heads and FFN neurons present, original
sizes, and what was pruned. Every stage goes through these instead of hard-coding attribute names.
"""

from __future__ import annotations

import torch
from torch import nn

from compressor.surgery.arch.spec import arch_spec
from compressor.surgery.portable import get_path, set_path  # noqa: F401  (one implementation, shipped with models)


def layers(model: nn.Module) -> nn.ModuleList:
    """The encoder's list of transformer layers."""
    return get_path(model.base_model, arch_spec(model).layers)


HIDDEN_KWARGS = ("hidden_states", "hidden_state", "x")  # what each architecture's layer names its input, when by name


def hidden_kwarg(kwargs: dict) -> str:
    """The keyword by which a layer call passes its input hidden states (a call that passes them by name)."""
    return next(k for k in HIDDEN_KWARGS if k in kwargs)


def num_layers(model: nn.Module) -> int:
    return len(layers(model))


def original_num_heads(model: nn.Module) -> int:
    """Heads per layer before any pruning (from the config, which surgery never changes)."""
    cfg = model.config
    return int(getattr(cfg, "num_attention_heads", None) or cfg.n_heads)


def head_size(model: nn.Module) -> int:
    return original_hidden(model) // original_num_heads(model)


def pruned_heads(model: nn.Module) -> dict[int, list[int]]:
    """Physically removed heads per layer, as original indices (`config.pruned_heads`, our bookkeeping)."""
    return _int_keyed(getattr(model.config, "pruned_heads", None))


def present_heads(model: nn.Module) -> list[list[int]]:
    """For each layer, the original indices of heads whose weights are still in the model, in weight order."""
    removed, gone, n = pruned_heads(model), set(removed_layers(model)), original_num_heads(model)
    return [
        [] if layer in gone else [h for h in range(n) if h not in set(removed.get(layer, []))]
        for layer in range(num_layers(model))
    ]


def presence_mask(model: nn.Module) -> torch.Tensor:
    """[layers, heads] bool tensor, True where the head still has weights."""
    mask = torch.zeros(num_layers(model), original_num_heads(model), dtype=torch.bool)
    for layer, heads in enumerate(present_heads(model)):
        mask[layer, heads] = True
    return mask


def config_head_counts(config) -> tuple[int, int]:
    """(layers, heads per layer) from a model config, before any weights load (DistilBERT names them differently)."""
    layers = config.num_hidden_layers if hasattr(config, "num_hidden_layers") else config.n_layers
    return layers, getattr(config, "num_attention_heads", None) or config.n_heads


def _int_keyed(mapping: dict | None) -> dict[int, list[int]]:
    """`{layer: sorted ids}` with int keys (JSON round trips turn them into strings), empty entries dropped."""
    return {int(k): sorted(int(i) for i in v) for k, v in (mapping or {}).items() if v}


def original_ffn_size(model: nn.Module) -> int:
    """FFN neurons per layer before any pruning (`compressor_ffn_size` when a uniform-width save rewrote the
    config's `intermediate_size`, else the config's own width)."""
    cfg = model.config
    saved = getattr(cfg, "compressor_ffn_size", None)
    return int(saved or getattr(cfg, "intermediate_size", None) or cfg.hidden_dim)


def pruned_neurons(model: nn.Module) -> dict[int, list[int]]:
    """Physically removed FFN neurons per layer, as original ids (`config.pruned_neurons`)."""
    return _int_keyed(getattr(model.config, "pruned_neurons", None))


def removed_layers(model: nn.Module) -> list[int]:
    """Layers removed whole (replaced by an identity), as original ids (`config.removed_layers`)."""
    return sorted(int(i) for i in (getattr(model.config, "removed_layers", None) or []))


def present_neurons(model: nn.Module) -> list[list[int]]:
    """For each layer, the original ids of FFN neurons whose weights are still in the model, in weight order."""
    removed, gone, n = pruned_neurons(model), set(removed_layers(model)), original_ffn_size(model)
    out = []
    for layer in range(num_layers(model)):
        dead = set(removed.get(layer, []))
        out.append([] if layer in gone else [i for i in range(n) if i not in dead])
    return out


def neuron_presence_mask(model: nn.Module) -> torch.Tensor:
    """[layers, original FFN width] bool tensor, True where the neuron still has weights."""
    mask = torch.zeros(num_layers(model), original_ffn_size(model), dtype=torch.bool)
    for layer, ids in enumerate(present_neurons(model)):
        mask[layer, ids] = True
    return mask


def original_hidden(model: nn.Module) -> int:
    """The residual stream's width before any pruning (the config's, which surgery never changes)."""
    return config_width(model.config)


def config_width(config) -> int:
    """A config's residual width (DistilBERT names it `dim`)."""
    return int(getattr(config, "hidden_size", None) or config.dim)


def pruned_hidden(model: nn.Module) -> list[int]:
    """Residual channels removed from the whole stream, as original ids (`config.pruned_hidden`)."""
    return sorted(int(i) for i in (getattr(model.config, "pruned_hidden", None) or []))


def present_hidden(model: nn.Module) -> list[int]:
    """The original ids of the residual channels still in the model, in weight order."""
    dead = set(pruned_hidden(model))
    return [i for i in range(original_hidden(model)) if i not in dead]
