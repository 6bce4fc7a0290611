"""Run an encoder's layers one at a time, each called as the model's own forward calls it: what the rescale needs.

`record` takes, per batch, the hidden states entering layer 0 and every layer's other call arguments (attention
mask, position bias, rotary tables: whatever the encoder passes). Recording needs the encoder's loop, not the layers'
work, so the layers are stubbed out while it runs (each hands its input on; the last ends the pass): once the first
batch has shown that a stubbed pass gives the same arguments as a real one. An encoder that derived its layers'
arguments from the hidden states would not, and then every batch is recorded with a real forward. `run_layer` calls
one layer as the encoder did; `check_chain` makes sure replaying the layers reproduces the model's own forward.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from compressor.core.errors import UserError
from compressor.recovery.train import model_inputs
from compressor.surgery.arch import hidden_kwarg, layers

log = logging.getLogger("compressor")
CHAIN_ATOL = 1e-3  # replaying the layers one by one must reproduce the model's own forward to this


class Stop(Exception):
    """Raised by a hook to end a forward pass early."""


@dataclass
class LayerCalls:
    """What a model's layers were called with on one batch: the hidden states entering layer 0, and per layer the
    other positional and keyword arguments (the same tensor objects the encoder passed: no copies)."""

    hidden: torch.Tensor
    args: list[tuple]
    kwargs: list[dict]
    rows: torch.Tensor  # [batch, seq] bool: real tokens
    check: list[torch.Tensor] | None = None  # the hidden states entering every layer (a real pass only)


def _hidden_of(args: tuple, kwargs: dict) -> tuple[torch.Tensor, tuple, dict]:
    """Split a layer call into its hidden states and the rest."""
    if args:
        return args[0], args[1:], kwargs
    name = hidden_kwarg(kwargs)
    return kwargs[name], (), {k: v for k, v in kwargs.items() if k != name}


@contextmanager
def _stubbed(model: nn.Module, like: object) -> Iterator[None]:
    """Every layer of `model` returns its input hidden states, in the structure of `like` (a real layer's output:
    a tensor, or a tuple whose other entries are passed on as they are), without computing anything; each layer's
    own forward is back afterwards."""

    def passthrough(*args, **kwargs):
        hidden = _hidden_of(args, kwargs)[0]
        return (hidden, *like[1:]) if isinstance(like, tuple) else hidden

    saved = [layer.__dict__.get("forward") for layer in layers(model)]  # an instance forward (a wrapper) is kept
    for layer in layers(model):
        layer.forward = passthrough
    try:
        yield
    finally:
        for layer, own in zip(layers(model), saved, strict=True):
            if own is None:
                del layer.forward
            else:
                layer.forward = own


def _record(model: nn.Module, batch: dict, like: object = None) -> tuple[LayerCalls, object]:
    """Run `model` on `batch` up to its last layer's call, recording each layer's call arguments: with the layers
    stubbed out (`_stubbed`) when `like` is given, else a real pass that also keeps the hidden states entering each
    layer. Returns the calls and, from a real pass, layer 0's output (None when that layer is the last)."""
    seen: list[tuple[torch.Tensor, tuple, dict]] = []
    first: list[object] = []
    stack = layers(model)

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append(_hidden_of(args, kwargs))
        if module is stack[-1]:
            raise Stop

    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in stack]
    handles.append(stack[0].register_forward_hook(lambda _m, _args, out: first.append(out)))
    try:
        with _stubbed(model, like) if like is not None else nullcontext():
            model(**model_inputs(batch))
    except Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    rows = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(batch["input_ids"]).bool()
    check = None if like is not None else [h for h, _, _ in seen]
    calls = LayerCalls(seen[0][0], [a for _, a, _ in seen], [k for _, _, k in seen], rows, check)
    return calls, first[0] if first else None


def _equal(x: object, y: object) -> bool:
    """Whether two recorded call arguments are the same (tensors: same shape and values; containers: elementwise)."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, (tuple, list)):
        return type(x) is type(y) and len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y, strict=True))
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    try:
        return x is y or bool(x == y)
    except Exception:  # an object without a usable equality: not provably the same
        return False


def record(model: nn.Module, batches: Sequence[dict]) -> list[LayerCalls]:
    """Each batch's layer calls (`LayerCalls`); the first from a real pass (with the inputs `check_chain` reads)."""
    if not batches:
        return []
    first, like = _record(model, batches[0])
    stub = like is not None and _equal(_args_of(first), _args_of(_record(model, batches[0], like)[0]))
    if like is not None and not stub:
        log.info("rescale: %s's layers are called with arguments that depend on the hidden states; recording every "
                 "batch with a full forward", model.config.model_type)  # fmt: skip
    rest = [_record(model, batch, like if stub else None)[0] for batch in batches[1:]]
    for calls in rest:
        calls.check = None  # only the first batch's layer inputs are checked: the others' need not be kept
    return [first, *rest]


def _args_of(calls: LayerCalls) -> tuple:
    return calls.hidden, calls.args, calls.kwargs


def run_layer(model: nn.Module, index: int, hidden: torch.Tensor, calls: LayerCalls) -> torch.Tensor:
    """Layer `index` of `model` on `hidden`, called as the encoder called it; its hidden-state output."""
    out = layers(model)[index](hidden, *calls.args[index], **calls.kwargs[index])
    return out[0] if isinstance(out, tuple) else out


def _stop(*_args) -> None:
    raise Stop


@contextmanager
def capture(modules: dict[str, nn.Module], stop: str | None = None) -> Iterator[dict[str, tuple]]:
    """Record (input, output) of each named module's next call (hooks run after any gating pre-hook); with `stop`,
    end the pass (`Stop`) once that module has run."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = [
        module.register_forward_hook(lambda _m, args, out, name=name: seen.__setitem__(name, (args[0], out)))
        for name, module in modules.items()
    ]
    if stop is not None:
        handles.append(modules[stop].register_forward_hook(_stop))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def check_chain(model: nn.Module, calls: LayerCalls) -> None:
    """Replaying the layers one by one must reproduce the inputs the model's own forward gave each layer (an
    architecture whose encoder does more between layers, e.g. DeBERTa's optional convolution, is refused in one
    line)."""
    hidden = calls.hidden
    for index in range(len(calls.args) - 1):
        hidden = run_layer(model, index, hidden, calls)
        if not torch.allclose(hidden, calls.check[index + 1], atol=CHAIN_ATOL, rtol=CHAIN_ATOL):
            raise UserError(
                f"prune.recovery: rescale replays layers one by one, but '{model.config.model_type}' layer "
                f"{index + 1}'s input is not layer {index}'s output; expected a plain stack of layers (use finetune)"
            )
