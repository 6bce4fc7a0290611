"""`l0`: Voita et al. 2019's stochastic head gates with the hard-concrete L0 relaxation (Louizos et al. 2018).

Each alive head gets a learnable log α. Training samples `u ~ U(0,1); s = σ((log u − log(1−u) + log α)/β);
g = clamp(s(ζ−γ)+γ, 0, 1)` (one gate sample per head per batch), with β = 2/3, γ = −0.1, ζ = 1.1, and minimises
cross-entropy plus a penalty on the expected number of open gates `Σ_h σ(log α_h − β log(−γ/ζ))`.

Choices (see heads.md):
- Only the gates train; the model is frozen (and kept in eval mode). Voita trains jointly from a converged model,
  but a criterion must not change the weights it scores: the pruning loop's own fine-tuning adapts the weights.
- `mode='fixed'`: Voita's objective, `xent + lam · E[L0]`; how many heads close depends on `lam`.
- `mode='target'`: aims at exactly the heads the caller will keep (alive − `ctx.target_remove`) with a Lagrangian
  controller on the expected L0 (CoFiPruning): `xent + λ1·v + λ2·v²`, v = (E[L0] − keep)/alive, the λ's trained
  by gradient *ascent*; the target is ramped linearly from "all open" over the first half of training.
The score is log α (dead heads −inf), and a head is pruned by ranking: Voita's deterministic gate
`clamp(σ(log α)(ζ−γ)+γ, 0, 1)` is monotone in log α, so its zeros are the lowest log α's. How many to prune: in
fixed mode the heads whose deterministic gate is 0 (`extras['l0']['open']` counts the rest); in target mode, as
CoFiPruning's `deterministic_z`, round(E[L0]) heads stay open (`open_by_rank`): the controller drives E[L0] to the
target, while the gates themselves need not all saturate (a budget met by twelve half-open gates is still a
budget met). With the defaults (300 steps, lr 0.3) the deterministic gates themselves close on the target
(tests: within one head; lr 0.1 leaves the budget spread over half-open gates). Either way the caller removes
its `target_remove` lowest scores. Diagnostics: `ctx.extras['l0']` (`'l0_neurons'` when scoring FFN neurons, where
`target_remove` counts neurons), saved in the run's step log.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from compressor.pruning.criteria.confidence import model_inputs
from compressor.pruning.criteria.registry import ScoreContext, register

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1


def sample_gates(log_alpha: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One hard-concrete sample per entry of `log_alpha` (differentiable in log α)."""
    u = torch.rand(log_alpha.shape, generator=generator).to(log_alpha.device).clamp(1e-6, 1 - 1e-6)
    s = torch.sigmoid((u.log() - (1 - u).log() + log_alpha) / BETA)
    return (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def deterministic_gates(log_alpha: torch.Tensor) -> torch.Tensor:
    """The test-time gate: 0 means the head is pruned."""
    return (torch.sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def open_probability(log_alpha: torch.Tensor) -> torch.Tensor:
    """P(gate ≠ 0) = σ(log α − β log(−γ/ζ)); its sum over heads is the expected L0."""
    return torch.sigmoid(log_alpha - BETA * math.log(-GAMMA / ZETA))


@contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """Parameters stop requiring grad inside the block (so backward touches only the gates), then restored."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _cycle(batches: Sequence[dict], steps: int) -> Iterator[dict]:
    for step in range(steps):
        yield batches[step % len(batches)]


def _ascend(loss: torch.Tensor, log_alpha: nn.Parameter, optimizer, ascent, acc) -> None:
    """One step: descend on log α (gradients averaged over processes) and, in target mode, ascend on the
    Lagrange multipliers (`ascent`; None in fixed mode)."""
    optimizer.zero_grad()
    if ascent is not None:
        ascent.zero_grad()
    if acc is not None:
        acc.backward(loss)
    else:
        loss.backward()
    if acc is not None and acc.num_processes > 1:
        log_alpha.grad = acc.reduce(log_alpha.grad, reduction="mean")
    optimizer.step()
    if ascent is not None:
        ascent.step()


@register("l0", units=("heads", "neurons"))
def l0(
    ctx: ScoreContext,
    *,
    mode: Literal["target", "fixed"] = "target",
    lam: Annotated[float, Field(ge=0)] = 0.01,
    steps: Annotated[int, Field(ge=1)] = 300,
    lr: Annotated[float, Field(gt=0)] = 0.3,
    lagrangian_lr: Annotated[float, Field(gt=0)] = 0.1,
    init: float = 3.0,
) -> torch.Tensor:
    """[layers, heads] log α after training the gates on `ctx.train_batches()` (else the scoring batches).

    `steps` optimiser steps (one batch each, cycling), Adam with `lr` on log α (initialised to `init`: all gates
    open). `lam` is the fixed penalty of `mode='fixed'`; `lagrangian_lr` the ascent rate of the target mode's
    multipliers. Uses `ctx.accelerator.backward` when given and averages gate gradients over processes.
    """
    model, acc, device = ctx.model, ctx.accelerator, ctx.device
    model.eval()
    batches = list(ctx.train_batches()) if ctx.train_batches is not None else list(ctx.batches)
    if not batches:
        raise ValueError("l0: no training batches to learn gates from")
    alive = ctx.alive.to(device)
    n_alive = int(alive.sum())
    keep = n_alive - int(ctx.target_remove)
    log_alpha = nn.Parameter(torch.full(alive.shape, float(init), device=device))
    optimizer = torch.optim.Adam([log_alpha], lr=lr)
    multipliers = nn.Parameter(torch.zeros(2, device=device))
    ascent = torch.optim.Adam([multipliers], lr=lagrangian_lr, maximize=True)
    generator = torch.Generator().manual_seed(int(ctx.seed))
    warmup = max(1, steps // 2)
    with frozen(model):
        for step, batch in enumerate(_cycle(batches, steps)):
            gates = sample_gates(log_alpha, generator) * alive
            with ctx.gated(gates):
                logits = model(**model_inputs(batch, device)).logits.float()
            loss = F.cross_entropy(logits, batch["labels"].to(device))
            expected = (open_probability(log_alpha) * alive).sum()
            if mode == "fixed":
                loss = loss + lam * expected
            else:
                goal = n_alive - (n_alive - keep) * min(1.0, (step + 1) / warmup)
                gap = (expected - goal) / max(n_alive, 1)
                loss = loss + multipliers[0] * gap + multipliers[1] * gap.pow(2)
            _ascend(loss, log_alpha, optimizer, ascent if mode == "target" else None, acc)
    final = log_alpha.detach()
    expected = float((open_probability(final) * alive).sum())
    ctx.extras["l0" if ctx.unit == "heads" else f"l0_{ctx.unit}"] = {  # one entry per scored kind
        "open": int(((deterministic_gates(final) > 0) & alive).sum()),
        "expected_open": expected,
        "open_by_rank": round(expected),
        "target_open": keep if mode == "target" else None,
        "alive": n_alive,
    }
    return final.masked_fill(~alive, float("-inf")).cpu()
