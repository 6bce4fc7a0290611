"""`attribution`: Hao et al. 2021's self-attention attribution (AttAttr), head score = E_x max_ij Attr_h(A)_ij.

For layer l with attention probabilities A, `Attr_h(A) = A_h ⊙ ∫_0^1 ∂F(X)/∂X_h |_{X = αA} dα`, approximated by the
right Riemann sum over α = k/m, k = 1..m (Hao's released code), F the probability of the predicted (or gold) class.
Only layer l is scaled; every other layer runs unchanged.

Cost: m backward passes per layer per example. Two things keep it affordable: the m steps of one example run as
one batch (the example repeated m times, each copy with its own α), and the layers below l, which no α touches,
run once per example instead of m times (their output is cached and fed straight into layer l).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import nn

from compressor.pruning.criteria.confidence import model_inputs
from compressor.pruning.criteria.registry import ScoreContext, mean_over_processes, register
from compressor.pruning.masking import AttentionRecorder, gated
from compressor.surgery.arch import arch_spec, hidden_kwarg, layers, present_heads, set_path


def _replace_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor | None) -> tuple[torch.Tensor, tuple, dict]:
    """(the layer's input hidden states, args, kwargs) with that input swapped for `hidden` when given."""
    if args:
        return args[0], ((hidden, *args[1:]) if hidden is not None else args), kwargs
    key = hidden_kwarg(kwargs)
    current = kwargs[key]
    if hidden is not None:
        kwargs = {**kwargs, key: hidden}
    return current, args, kwargs


@contextmanager
def layer_inputs(model: nn.Module) -> Iterator[dict[int, torch.Tensor]]:
    """Record each layer's input hidden states during the forward passes inside the block."""
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for index, module in enumerate(layers(model)):

        def hook(_m: nn.Module, args: tuple, kwargs: dict, index: int = index) -> None:
            seen[index] = _replace_hidden(args, kwargs, None)[0].detach()

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def start_at(model: nn.Module, layer: int, hidden: torch.Tensor) -> Iterator[None]:
    """Run the encoder from `layer` on, with `hidden` as that layer's input: lower layers are skipped.

    Temporarily swaps the encoder's layer list for its tail (hooks already on those modules keep firing) and
    replaces the tail's first input; embeddings still run (cheap) so the model's own forward, masks and
    classification head are used unchanged. Not where the encoder runs a module after the list's first layer
    (`ArchSpec.starts_anywhere`): it would follow the wrong layer, so every layer runs instead.
    """
    spec, stack = arch_spec(model), layers(model)
    if not spec.starts_anywhere(model):
        yield
        return

    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        _, args, kwargs = _replace_hidden(args, kwargs, hidden)
        return args, kwargs

    handle = stack[layer].register_forward_pre_hook(hook, with_kwargs=True)
    set_path(model.base_model, spec.layers, nn.ModuleList(list(stack)[layer:]))
    try:
        yield
    finally:
        set_path(model.base_model, spec.layers, stack)
        handle.remove()


def _examples(ctx: ScoreContext, limit: int, chunk: int) -> Iterator[dict[str, torch.Tensor]]:
    """Up to `limit` examples from the scoring batches, re-cut into chunks of `chunk` with padding trimmed."""
    seen = 0
    for batch in ctx.batches:
        for start in range(0, batch["input_ids"].shape[0], chunk):
            if seen >= limit:
                return
            stop = start + min(chunk, limit - seen)
            part = {k: v[start:stop] for k, v in batch.items()}
            length = int(part["attention_mask"].sum(1).max())
            if not part["attention_mask"][:, length:].any():  # right padding: drop all-pad columns
                part = {k: (v[:, :length] if v.dim() == 2 else v) for k, v in part.items()}
            seen += part["input_ids"].shape[0]
            yield part


def layer_attribution(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    layer: int,
    hidden: torch.Tensor,
    target: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """Attr(A) for one layer: [B, present heads, T, T], with `steps` α's batched (runs inside the caller's gates)."""
    batch = target.shape[0]
    alphas = torch.arange(1, steps + 1, device=hidden.device, dtype=hidden.dtype) / steps
    scale = alphas.repeat(batch)[:, None, None, None]  # copy j of example i sits at row i * steps + j
    repeated = {k: v.repeat_interleave(steps, 0) for k, v in inputs.items()}
    recorder = AttentionRecorder(scale={layer: scale}, retain_grad=True)
    with recorder.attach(model), start_at(model, layer, hidden.repeat_interleave(steps, 0)):
        probs = model(**repeated).logits.float().softmax(-1)
        chosen = probs.gather(1, target.repeat_interleave(steps)[:, None]).sum()
        attention = recorder.probs[layer]
        (grad,) = torch.autograd.grad(chosen, attention)
    # d/dA of F(αA) is α·∂F/∂X at X = αA: divide α back out to integrate ∂F/∂X as Hao et al. do.
    grad = (grad / scale).reshape(batch, steps, *grad.shape[1:]).sum(1)
    first = attention.detach().reshape(batch, steps, *attention.shape[1:])[:, 0]
    return first * grad / steps


@register("attribution")
def attribution(
    ctx: ScoreContext,
    *,
    steps: Annotated[int, Field(ge=1)] = 20,
    examples: Annotated[int, Field(ge=1)] = 200,
    target: Literal["predicted", "gold"] = "predicted",
    batch_size: Annotated[int, Field(ge=1)] = 4,
) -> torch.Tensor:
    """[layers, heads]: mean over examples of max over (query, key) of the head's attention attribution.

    `steps` is m of the Riemann sum (Hao: 20), `examples` caps the scoring examples (Hao: 200 held-out ones),
    `target` picks F's class (the model's prediction, or the gold label), `batch_size` examples run together
    (so batch_size × steps sequences per pass). The max runs over real (query, key) pairs only, padding excluded.
    """
    model = ctx.model
    model.eval()
    heads = present_heads(model)
    scored = [layer for layer, hs in enumerate(heads) if hs and bool(ctx.alive[layer, hs].any())]
    total = torch.zeros(ctx.alive.shape, dtype=torch.float64, device=ctx.device)
    count = 0
    with gated(model, ctx.gates()):
        for part in _examples(ctx, examples, batch_size):
            inputs = model_inputs(part, ctx.device)
            with torch.no_grad(), layer_inputs(model) as hidden:
                logits = model(**inputs).logits
            if target == "gold":
                if "labels" not in part:
                    raise ValueError("prune.criterion.params.target: 'gold' needs labelled scoring batches")
                chosen = part["labels"].to(ctx.device)
            else:
                chosen = logits.argmax(-1)
            valid = inputs["attention_mask"].bool()
            pairs = valid[:, None, :, None] & valid[:, None, None, :]
            for layer in scored:
                attr = layer_attribution(model, inputs, layer, hidden[layer], chosen, steps)
                peak = attr.masked_fill(~pairs, float("-inf")).amax((-2, -1))  # [B, present heads]
                total[layer, heads[layer]] += peak.sum(0).double()
            count += chosen.shape[0]
    return mean_over_processes(total, count, ctx.accelerator).float().cpu()
