"""The stages after pruning, as one typed sequence over a typed run state.

`runner.run_recipe` builds a `RunState` (sources, base model, the API's `PruneResult`) and calls `run_stages`,
which runs `STAGES` in order: surgery + save → export → bench → analysis. Each stage reads the state, may add to
it (the saved model directory, the exports) and returns its section of the report.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from compressor.api import PruneResult
from compressor.checkpoint import load_pruned, save_pruned
from compressor.cost import model_stats
from compressor.layout import pruned_heads
from compressor.masking import gated
from compressor.recipe import Recipe
from compressor.sources import TaskData
from compressor.surgery import prune_heads
from compressor.train import evaluate, model_inputs, sample_batches

log = logging.getLogger("compressor")
SURGERY_ATOL = 1e-4  # max |Δlogit| allowed between the masked and the physically pruned model


@dataclass
class RunState:
    """Everything one run has produced so far; stages read it and add to it."""

    recipe: Recipe
    out: Path
    accelerator: Accelerator
    data: TaskData
    tokenizer: object
    splits: dict = field(default_factory=dict)  # tokenised train/validation/test
    report: dict = field(default_factory=dict)
    original: nn.Module | None = None  # unpruned copy of the base model (eager attention, CPU)
    result: PruneResult | None = None  # the pruning loop's output (masked model, masks, scores, log)
    pruned: nn.Module | None = None  # heads physically removed
    model_dir: Path | None = None
    exported: dict = field(default_factory=dict)

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: its report key, whether the recipe enables it, and what it does."""

    name: str
    run: Callable[[RunState], dict]
    enabled: Callable[[Recipe], bool] = lambda recipe: True


def surgery_check(model: nn.Module, pruned: nn.Module, gates: torch.Tensor, batch: dict) -> float:
    """Max |Δlogit| between `model` masked by `gates` and `pruned`; raises when above `SURGERY_ATOL`."""
    with torch.inference_mode(), gated(model, gates):
        masked_logits = model(**model_inputs(batch)).logits
    with torch.inference_mode():
        diff = float((pruned(**model_inputs(batch)).logits - masked_logits).abs().max())
    if diff > SURGERY_ATOL:
        raise RuntimeError(f"surgery: pruned model differs from the masked model by {diff:.2e} (> {SURGERY_ATOL})")
    return diff


def save_stage(state: RunState) -> dict:
    """Physically remove the masked heads, prove the result equals the masked model, evaluate and save it.

    Also adds the original model's size and FLOPs to `report["original"]`.
    """
    result, recipe = state.result, state.recipe
    state.pruned = result.pruned()
    batch = next(iter(sample_batches(state.splits["validation"], state.tokenizer, 64, 64, seed=0)))
    diff = surgery_check(result.model, state.pruned, result.masks.head_gates(), batch)
    log.info("surgery: removed %d heads, masked vs pruned max |Δlogit| = %.2e", int((~result.masks.heads).sum()), diff)
    test = evaluate(state.pruned, state.splits["test"], state.tokenizer)
    original_test = state.report["original"]["test"]["accuracy"]
    log.info("pruned: test acc %.4f (original %.4f)", test["accuracy"], original_test)
    metadata = {
        "recipe": recipe.name,
        "original_test_accuracy": original_test,
        "pruned_test_accuracy": test["accuracy"],
    }
    seq = recipe.bench.seq_len
    state.model_dir = save_pruned(
        state.pruned, state.out / "model", state.tokenizer, metadata, original=state.original, seq_len=seq
    )
    stats = model_stats(state.original, state.pruned, seq)
    state.report["original"].update(stats["original"])
    return {
        "test": test,
        "heads_left": int(result.masks.heads.sum()),
        "heads_total": result.masks.heads.numel(),
        "heads_per_layer": result.masks.heads_per_layer(),
        "model_dir": str(state.model_dir),
        "plan": {str(k): v for k, v in result.plan.items()},
        "masked_vs_pruned_max_abs_diff": diff,
        **stats["pruned"],
        **{k: stats[k] for k in ("flop_ratio", "parameter_ratio", "empty_layers")},
    }


def export_stage(state: RunState) -> dict:
    """ONNX variants of the saved model, each checked against PyTorch on validation batches."""
    from compressor.export import export_onnx
    from compressor.quantize import int8_options

    spec, splits = state.recipe.export, state.splits
    batches = sample_batches(splits["validation"], state.tokenizer, 128, 32, seed=1)
    int8 = int8_options(spec.int8, spec.variants, splits["train"], splits["validation"], state.tokenizer)
    out = state.out / "onnx"
    state.exported = export_onnx(state.model_dir, out, spec.variants, batches, spec.atol, spec.opset, int8)
    for name, info in state.exported.items():
        log.info(
            "export %s: %.1f MB, max |Δlogit| vs PyTorch %.2e, agreement %.4f",
            name,
            info["size_bytes"] / 1e6,
            info["max_abs_diff"],
            info["agreement"],
        )
    return state.exported


def as_sdpa(model: nn.Module) -> nn.Module:
    """A copy of an eager-attention model (pruned or not) using SDPA (what users deploy), for fair timing.

    transformers builds the attention modules of these architectures at construction time, so the copy is rebuilt
    from the config (eager where SDPA is unsupported), pruned the same way and given the same weights, in memory.
    """
    from compressor.checkpoint import _build as build_classifier  # its SDPA→eager fallback (ELECTRA)

    config = copy.deepcopy(model.config)
    config.pruned_heads = {}
    fast = build_classifier(config, "sdpa", next(model.parameters()).dtype)
    prune_heads(fast, pruned_heads(model))
    fast.load_state_dict(model.state_dict())
    return fast.eval()


def bench_stage(state: RunState) -> dict:
    """Quality and throughput of the original, the saved pruned model and its ONNX exports."""
    from compressor import bench

    spec = state.recipe.bench
    seq = spec.seq_lens
    pruned = bench.pytorch_candidate(
        "pytorch-pruned", load_pruned(state.model_dir, attn_implementation="sdpa"), seq, state.model_dir
    )
    candidates = [bench.pytorch_candidate("pytorch-original", as_sdpa(state.original), seq), pruned]
    for name, info in state.exported.items():
        candidates.append(
            bench.onnx_candidate(
                f"onnx-{name}",
                info["dir"],
                spec.threads,
                flops_per_example=pruned.flops_by_seq_len,
                heads_per_layer=pruned.heads_per_layer,
            )
        )
    test = state.splits["test"]
    batches = sample_batches(test, state.tokenizer, spec.eval_examples or len(test), 32, seed=0)
    return bench.bench(candidates, batches, spec, state.out / "bench", reference="pytorch-original")


def analysis_stage(state: RunState) -> dict:
    """Head roles of the original model, and per pruning step the roles of the kept vs removed heads.

    Inputs are encoded as in training (pairs as pairs). spaCy is optional: when its English model cannot be
    loaded the analysis logs one warning and runs without syntactic roles (`syntax_skipped` says why), rather than
    failing at the end of a long run. The first step's scores and every step's mask come from the prune result.
    """
    from compressor import analysis

    spec, fields = state.recipe.analysis, state.data.text_fields
    steps = state.result.steps if state.result is not None else []
    scores = state.result.scores if state.result is not None else []
    first = {state.recipe.prune.criterion.name: _finite_or_nan(scores[0])} if scores else None
    result = analysis.analyze_heads(
        state.original,
        state.tokenizer,
        analysis.model_texts(state.data.test, fields, spec.examples),
        analysis.model_texts(state.data.train, fields),
        max_length=state.recipe.data.max_length,
        scores=first,
        syntax="auto",
        config=spec.roles,
    )
    masks = [m.heads for m in state.result.step_masks] if state.result is not None else []
    per_step = [
        {"step": entry["step"], **analysis.kept_vs_removed(result, alive)}
        for entry, alive in zip(steps, masks, strict=True)
    ]
    result["pruning_steps"] = per_step
    analysis.write_analysis(result, state.out / "analysis")
    return {
        "counts": result.get("counts"),
        "syntax_skipped": result["settings"]["syntax_skipped"],
        "pruning_steps": per_step,
    }


def card_stage(state: RunState) -> dict:
    """The model card's recovery and deployment section: whether distillation was on, and each export's gate
    verdict (a rejected int8 variant is marked there too)."""
    from compressor.checkpoint import CARD_FILE, add_deployment_section

    finetune = state.recipe.prune.finetune
    distill = finetune.distill.model_dump() if finetune is not None and finetune.distill is not None else None
    add_deployment_section(state.model_dir, state.exported or None, distill)
    return {"file": str(state.model_dir / CARD_FILE), "distillation": distill}


def _finite_or_nan(scores: torch.Tensor) -> torch.Tensor:
    """Scores with removed heads (-inf) as NaN, as the analysis maps expect."""
    return scores.float().masked_fill(torch.isneginf(scores), float("nan"))


STAGES: tuple[Stage, ...] = (
    Stage("pruned", save_stage),
    Stage("export", export_stage, lambda recipe: recipe.export.enabled),
    Stage("model_card", card_stage),
    Stage("bench", bench_stage, lambda recipe: recipe.bench.enabled),
    Stage("analysis", analysis_stage, lambda recipe: recipe.analysis.enabled),
)


def run_stages(state: RunState, stages: tuple[Stage, ...] = STAGES) -> dict:
    """Run the enabled stages in order, each adding its section to `state.report`; returns the report."""
    enabled = [stage for stage in stages if stage.enabled(state.recipe)]
    bar = tqdm(enabled, desc="stages", leave=False)
    for stage in bar:
        bar.set_postfix_str(stage.name)
        state.report[stage.name] = stage.run(state)
    return state.report
