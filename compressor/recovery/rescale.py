"""Repair a pruned model without training: per-unit scales fitted by least squares, folded into the weights.

Kwon et al. 2022's mask tuning. After a step removes units, each sublayer's output is
`residual + bias + Σ_i m_i c_i`, with `c_i` the contribution of kept unit i (one head's block of W_O's input
columns times those columns, or one FFN neuron's activation times its column of the down-projection) and `m_i = 1`.
Sublayer by sublayer from the first layer, on the pruned model's own inputs to that layer, `m` is fitted by linear
least squares so that this sum matches the unpruned model's same sum (the pre-LayerNorm residual sum of post-norm
architectures, the residual stream itself of pre-norm ones). Rows are every real token, or only the first token from the
last layer that mixes tokens on where the classifier reads the first token (CLS pooling). The normal equations
`G m = c` (k × k, k kept units) are accumulated over batches in float64 on the CPU, solved with `torch.linalg`, and
`m` is folded into W_O's columns per head and the down-projection's columns per neuron: a saved, reloaded or
exported model needs nothing new. A fit whose Gram matrix is ill-conditioned, or that would not lower the residual,
is skipped (scales stay 1); scales outside [0, `max_scale`] are clamped; both are logged.

Layers are run one at a time (`replay`: each layer called as the encoder calls it): per layer, the unpruned layer
once for the targets; the pruned layer up to W_O for the head fit, then whole for the neuron fit, whose pass also
gives the layer's output after the fold (the down-projection and the architecture's output LayerNorm on what that pass
captured, checked against the pass's own output), so the whole fit costs about two and a half forward passes. The
layer attributes come from each architecture's `ArchSpec` (`out_proj`, `ffn_in`, `ffn_out`, its norms' `ffn_residual`
and `after_ffn`, `reads_first_token`).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import datasets
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from compressor.core.errors import UserError
from compressor.pruning.masking import gated
from compressor.pruning.units import Masks
from compressor.recipe import PruneSpec
from compressor.recovery.replay import CHAIN_ATOL, LayerCalls, Stop, capture, check_chain, record, run_layer
from compressor.recovery.train import model_inputs
from compressor.sources.batches import loader, sample_batches, sample_split
from compressor.surgery.arch import arch_spec, get_path, head_size, layers, present_heads, present_neurons

log = logging.getLogger("compressor")
MAX_CONDITION = 1e10  # a Gram matrix this ill-conditioned gives scales that fit noise: the layer is skipped
MAX_SCALE = 10.0  # scales are clamped to [0, MAX_SCALE]


@dataclass
class _Normal:
    """Normal equations of one sublayer's fit, G m = c, built from batches: unit i's contribution is its block of
    input columns z_i (one head's `size` columns of W_O's input, or one neuron's single column of the down-
    projection's) times the same columns W_i of the weight, so G_ij = Σ_rows ⟨z_i W_iᵀ, z_j W_jᵀ⟩ is the block sum of
    (ZᵀZ) ∘ (WᵀW) and c_i = Σ_rows ⟨z_i, (t W)_i⟩. Batches add ZᵀZ (`moments`) and the per-column c; `gram`
    applies WᵀW and sums the blocks once (float64)."""

    moments: torch.Tensor  # ZᵀZ over the kept units' columns
    cross: torch.Tensor  # per column, then per unit once finished
    total: float = 0.0  # tᵀt

    @classmethod
    def empty(cls, columns: int) -> _Normal:
        return cls(torch.zeros(columns, columns, dtype=torch.float64), torch.zeros(columns, dtype=torch.float64))

    def add(self, z: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> None:
        """One batch's rows: `z` [rows, columns] the kept units' input columns, `weight` [hidden, columns] theirs,
        `target` [rows, hidden] what their contributions should sum to."""
        self.moments += (z.T @ z).double()
        self.cross += (z * (target @ weight)).sum(0).double()
        self.total += float(target.double().pow(2).sum())

    def gram(self, weight: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """G and c per unit, `weight` [hidden, columns] the kept units' columns, `size` columns per unit."""
        w = weight.double()
        k = self.cross.numel() // size
        gram = (self.moments * (w.T @ w)).reshape(k, size, k, size).sum((1, 3))
        return gram, self.cross.reshape(k, size).sum(1)


def _solve(gram: torch.Tensor, cross: torch.Tensor, total: float, max_scale: float, max_condition: float):
    """The scales m minimising ‖A m − t‖² (normal equations `gram` m = `cross`, `total` = ‖t‖²), clamped to
    [0, max_scale], or ones (skipped) when ill-conditioned or no better than ones; with the relative residual
    ‖A m − t‖² / ‖t‖² before (m = 1) and after."""
    k = gram.shape[0]
    ones = torch.ones(k, dtype=torch.float64)

    def residual(m: torch.Tensor) -> float:
        value = float(m @ gram @ m - 2 * m @ cross + total)
        return max(value, 0.0) / max(total, 1e-30)

    before = residual(ones)
    info = {"units": k, "residual_before": before}
    eig = torch.linalg.eigvalsh(gram)
    condition = float(eig[-1] / eig[0]) if float(eig[0]) > 0 else float("inf")
    info["condition"] = condition
    if condition > max_condition:
        return ones, info | {"residual_after": before, "status": "skipped: ill-conditioned"}
    scales = torch.linalg.solve(gram, cross)
    clamped = scales.clamp(0.0, max_scale)
    status = "clamped" if not torch.equal(clamped, scales) else "fit"
    after = residual(clamped)
    if not after < before:
        return ones, info | {"residual_after": before, "status": "skipped: no improvement"}
    return clamped, info | {"residual_after": after, "status": status}


def _fold(linear: nn.Linear, columns: torch.Tensor, scales: torch.Tensor) -> None:
    """Multiply `linear`'s input columns `columns` by `scales` in place."""
    with torch.no_grad():
        linear.weight[:, columns] *= scales.to(linear.weight.dtype)


def _rows(x: torch.Tensor, rows: torch.Tensor, first_only: bool) -> torch.Tensor:
    """[batch, seq, d] → [rows, d]: the real tokens, or the first token of each example."""
    return x[:, 0] if first_only else x[rows]


@dataclass(frozen=True)
class _Sublayer:
    """One fit: which Linear it scales, its kept units' column blocks, and the sizes."""

    kind: str  # "heads" | "neurons"
    path: str  # from the layer: the Linear whose input columns are scaled
    blocks: list[int]  # positions among the present units of the kept ones
    size: int  # input columns per unit

    @cached_property
    def columns(self) -> torch.Tensor:
        """The kept units' input columns of the Linear, in unit order (built once: every batch's pass reads it)."""
        return torch.tensor([b * self.size + j for b in self.blocks for j in range(self.size)], dtype=torch.long)


def _sublayers(model: nn.Module, index: int, alive: Masks) -> list[_Sublayer]:
    """The attention and FFN fits of layer `index` (kinds without a kept unit are left out)."""
    spec = arch_spec(model)
    heads, neurons = present_heads(model)[index], present_neurons(model)[index]
    kept_heads = [j for j, h in enumerate(heads) if bool(alive["heads"][index, h])]
    kept_neurons = [j for j, i in enumerate(neurons) if "neurons" not in alive or bool(alive["neurons"][index, i])]
    out = []
    if kept_heads:
        out.append(_Sublayer("heads", spec.out_proj, kept_heads, head_size(model)))
    if kept_neurons:
        out.append(_Sublayer("neurons", spec.ffn_out, kept_neurons, 1))
    return out


def _targets(reference: nn.Module, index: int, hidden: torch.Tensor, calls: LayerCalls):
    """Run the unpruned layer `index`: its output and the two sums the pruned one should match (attention's and
    the FFN's residual + projection output), [batch, seq, hidden]."""
    spec, layer = arch_spec(reference), layers(reference)[index]
    modules = {"out": get_path(layer, spec.out_proj), "ffn_in": get_path(layer, spec.ffn_in),
               "ffn_out": get_path(layer, spec.ffn_out)}  # fmt: skip
    with capture(modules) as seen:
        out = run_layer(reference, index, hidden, calls)
    attention = hidden + seen["out"][1]
    residual = spec.norms.ffn_residual(attention, seen["ffn_in"][0])
    return out, {"heads": attention, "neurons": residual + seen["ffn_out"][1]}


@dataclass
class _FfnPass:
    """What a neuron fit's pass over one batch saw: the down-projection's input and residual, and the layer's
    output (from which the layer's output after the fold is derived without running it again: `_ffn_output`)."""

    z: torch.Tensor
    residual: torch.Tensor
    out: torch.Tensor


def _accumulate(model, index, sub: _Sublayer, hidden, calls: LayerCalls, target, first_only, eq) -> _FfnPass | None:
    """Run pruned layer `index` (gates on) and add this batch's equations for `sub` to `eq`. A head fit stops the
    layer once W_O has run (the FFN after it is not needed); a neuron fit runs it whole and returns its `_FfnPass`."""
    spec, layer = arch_spec(model), layers(model)[index]
    proj = get_path(layer, sub.path)
    heads = sub.kind == "heads"
    modules = {"proj": proj, "out": get_path(layer, spec.out_proj), "ffn_in": get_path(layer, spec.ffn_in)}
    out = None
    with capture(modules, stop="proj" if heads else None) as seen:
        try:
            out = run_layer(model, index, hidden, calls)
        except Stop:
            pass
    if heads:
        residual = hidden
    else:
        residual = spec.norms.ffn_residual(hidden + seen["out"][1], seen["ffn_in"][0])
    bias = proj.bias if proj.bias is not None else 0.0
    goal = _rows(target - residual - bias, calls.rows, first_only).float()
    z = _rows(seen["proj"][0], calls.rows, first_only).float()
    columns = sub.columns
    eq.add(z[:, columns], proj.weight[:, columns].float(), goal)
    return None if heads else _FfnPass(seen["proj"][0], residual, out)


def _ffn_output(model: nn.Module, index: int, seen: _FfnPass) -> torch.Tensor:
    """Layer `index`'s output from its down-projection's input and residual: what the layer computes after its FFN
    on their sum (`Norms.after_ffn`: a post-norm architecture's LayerNorm, the sum itself for a pre-norm one)."""
    spec, layer = arch_spec(model), layers(model)[index]
    proj = get_path(layer, spec.ffn_out)
    return spec.norms.after_ffn(layer, seen.residual + F.linear(seen.z, proj.weight, proj.bias))


def rescale(
    model: nn.Module,
    reference: nn.Module,
    alive: Masks,
    batches: Sequence[dict[str, torch.Tensor]],
    *,
    max_scale: float = MAX_SCALE,
    max_condition: float = MAX_CONDITION,
) -> dict:
    """Fit and fold per-unit scales into `model` (masked by `alive`: `{"heads": [layers, heads] bool,
    "neurons": ...}` over original ids) so each sublayer matches unpruned `reference` on `batches`.

    Both models are set to eval mode. Returns `{"seconds", "examples", "layers": [{layer, kind, units,
    residual_before, residual_after, condition, status}]}`, the residuals relative to the target's energy.
    """
    t0 = time.perf_counter()
    model.eval()
    reference.eval()
    spec = arch_spec(model)
    heads = alive["heads"].float()
    neurons = alive["neurons"].float() if "neurons" in alive else None
    first_token = spec.reads_first_token(model.config)
    with_heads = [i for i in range(alive["heads"].shape[0]) if bool(alive["heads"][i].any())]
    cls_from = with_heads[-1] if first_token and with_heads else len(layers(model))  # tokens no longer mix after
    entries: list[dict] = []
    with torch.no_grad(), gated(model, heads, neurons):
        ref_calls, calls = record(reference, batches), record(model, batches)
        if batches:
            check_chain(model, calls[0])
        ref_hidden = [c.hidden for c in ref_calls]
        hidden = [c.hidden for c in calls]
        for index in tqdm(range(len(layers(model))), desc="rescale: layers", leave=False):
            outputs = [_targets(reference, index, h, c) for h, c in zip(ref_hidden, ref_calls, strict=True)]
            ref_hidden = [out for out, _ in outputs]
            after = None  # the layer's outputs once its fits are folded, where the neuron fit could derive them
            for sub in _sublayers(model, index, alive):
                first_only = index >= cls_from  # the last attention's output and all after: only the CLS row counts
                entry, after = _fit(model, index, sub, hidden, calls, [t[sub.kind] for _, t in outputs], first_only,
                                    (max_scale, max_condition))  # fmt: skip
                entries.append(entry)
            hidden = after or [run_layer(model, index, h, c) for h, c in zip(hidden, calls, strict=True)]
    seconds = time.perf_counter() - t0
    _log_fits(entries, seconds)
    return {"seconds": round(seconds, 2), "examples": sum(len(c.rows) for c in calls), "layers": entries}


def _fit(model, index, sub: _Sublayer, hidden, calls, targets, first_only: bool, limits: tuple[float, float]):
    """Accumulate, solve and fold one sublayer's scales: its log entry, and for a neuron fit the layer's outputs
    after the fold (derived from the pass that fed the fit, once checked against that pass's own output), else None."""
    proj = get_path(layers(model)[index], sub.path)
    eq = _Normal.empty(len(sub.blocks) * sub.size)
    work = zip(hidden, calls, targets, strict=True)
    passes = [_accumulate(model, index, sub, h, c, t, first_only, eq) for h, c, t in work]
    scales, info = _solve(*eq.gram(proj.weight[:, sub.columns], sub.size), eq.total, *limits)
    derive = (
        sub.kind == "neurons"
        and passes
        and torch.allclose(_ffn_output(model, index, passes[0]), passes[0].out, atol=CHAIN_ATOL, rtol=CHAIN_ATOL)
    )
    _fold(proj, sub.columns, scales.float().repeat_interleave(sub.size))
    after = [_ffn_output(model, index, seen) for seen in passes] if derive else None
    entry = {"layer": index, "kind": sub.kind, "first_token_only": first_only, **info,
             "scale_range": [round(float(scales.min()), 4), round(float(scales.max()), 4)]}  # fmt: skip
    return entry, after


def _log_fits(entries: list[dict], seconds: float) -> None:
    """One line per fit, a warning for each skipped or clamped one."""
    for e in entries:
        line = (
            f"rescale: layer {e['layer']} {e['kind']} ({e['units']}): residual {e['residual_before']:.4f} -> "
            f"{e['residual_after']:.4f}, scales {e['scale_range'][0]:.3f}..{e['scale_range'][1]:.3f}"
        )
        if e["status"] == "fit":
            log.info(line)
        else:
            log.warning("%s, %s (condition %.2e)", line, e["status"], e["condition"])
    log.info("rescale: %d fits in %.1fs", len(entries), seconds)


def recovery_summary(spec, steps: list[dict]) -> dict:
    """The report's `recovery` section: the mode (`prune.recovery` resolved), the sample a post-training run read,
    the seconds the fits and the fine-tunes took, and each step's per-sublayer fit residuals before and after."""
    fits = [{"step": s["step"], **s["rescale"]} for s in steps if "rescale" in s]
    return {
        "mode": spec.resolved_recovery,
        "sample_size": spec.sample_size if spec.reads_sample else None,
        "rescale_seconds": round(sum(f["seconds"] for f in fits), 2),
        "finetune_seconds": round(sum(s["finetune"].get("seconds", 0.0) for s in steps if "finetune" in s), 2),
        "steps_seconds": round(sum(s["seconds"] for s in steps), 2),
        "fits": fits,
    }


def post_training_sample(
    train: datasets.Dataset, config: PruneSpec, seed: int, model: nn.Module | None = None, tokenizer=None
) -> datasets.Dataset:
    """In a post-training mode (`config.post_training`), the seeded `sample_size` training examples that scoring
    and the fit use (the run reads no others); else `train` itself. A sample larger than the split is refused.
    Unlabelled text (no `labels`, `data.train_labels: false`) gets `model`'s own predictions as labels when a
    model is given: the unpruned model's classes stand in for gold ones (criteria and the allocation's loss then
    measure the departure from its predictions)."""
    if not config.post_training:
        return train
    if config.sample_size > len(train):
        raise UserError(
            f"prune.sample_size: {config.sample_size} examples asked, but the training split has {len(train)}; "
            f"expected at most {len(train)}"
        )
    sample = sample_split(train, config.sample_size, seed)
    if model is None or "labels" in sample.column_names:
        return sample
    return sample.add_column("labels", predicted_labels(model, sample, tokenizer))


@torch.no_grad()
def predicted_labels(model: nn.Module, ds: datasets.Dataset, tokenizer, batch_size: int = 64) -> list[int]:
    """`model`'s predicted class of every example of tokenised `ds`, in order."""
    model.eval()
    device = next(model.parameters()).device
    out: list[int] = []
    for batch in loader(ds, tokenizer, batch_size):
        logits = model(**model_inputs({k: v.to(device) for k, v in batch.items()})).logits
        out += logits.argmax(-1).tolist()
    return out


@dataclass
class Refit:
    """The pruning loop's rescale after each selection: the unpruned model to match (a copy taken before any step)
    and the fit's batches, the same on every process (not sharded), so every process folds the same scales."""

    reference: nn.Module
    batches: list[dict]

    @classmethod
    def prepare(cls, model: nn.Module, train: datasets.Dataset, tokenizer, config: PruneSpec, seed: int) -> Refit:
        batches = sample_batches(train, tokenizer, config.sample_size, config.score_batch_size, seed, by_length=True)
        return cls(copy.deepcopy(model).eval(), batches)

    def __call__(self, model: nn.Module, alive: Masks) -> dict:
        """Fit and fold `model`'s scales for the units `alive`; the step log's `rescale` entry."""
        return rescale(model, self.reference, alive, self.batches)
