"""A (pruned) model as it is deployed, for timing: a copy with SDPA attention, where its architecture has it.

Users load a saved model with SDPA attention (`load_pruned`'s default), so the benchmark and the in-run check of a
speed-up budget both time that, not the eager attention pruning trains and masks with. transformers builds the
attention modules of some architectures at construction time, so switching an existing model's implementation is
not enough: the copy is rebuilt from the config (eager where the architecture has no SDPA), pruned the same way and
given the same weights, in memory.
"""

from __future__ import annotations

import copy

from torch import nn

from compressor.pruning.units import apply_unit_plan
from compressor.surgery.arch import (
    original_ffn_size,
    original_num_heads,
    pruned_heads,
    pruned_hidden,
    pruned_neurons,
    removed_layers,
)
from compressor.surgery.width import prune_hidden


def as_deployed(model: nn.Module) -> nn.Module:
    """A copy of an eager-attention model (pruned or not) using SDPA (what users deploy), in eval mode; `model` is
    left as it is."""
    from compressor.surgery.checkpoint import _build as build_classifier  # eager where the architecture has no SDPA
    from compressor.surgery.checkpoint import _original_shape

    config = copy.deepcopy(model.config)
    _original_shape(config, original_ffn_size(model))  # the unpruned shape the plan is replayed on
    fast = build_classifier(config, "sdpa", next(model.parameters()).dtype)
    plan = {"heads": pruned_heads(model), "neurons": pruned_neurons(model)}
    for layer in removed_layers(model):  # removed whole: every head and neuron of the layer
        plan["heads"][layer] = list(range(original_num_heads(model)))
        plan["neurons"][layer] = list(range(original_ffn_size(model)))
    apply_unit_plan(fast, plan)
    if pruned_hidden(model):  # a narrowed residual stream: the same channels cut
        prune_hidden(fast, pruned_hidden(model))
    fast.load_state_dict(model.state_dict())
    return fast.eval()
