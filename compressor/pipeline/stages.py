"""The stages that make one member shippable, as one typed sequence over a typed run state; and the run-level
pieces the bench and the analysis use (the original's exports, the bench settings, the measured speed-up).

`runner.run_recipe` builds a `RunState` (sources, base model, the API's `PruneResult`); for each member
(`pipeline.measure`: one for a one-target run) `run_stages` runs `STAGES` in order: surgery + save → layer-drop
baseline → export → model card. Each stage reads the state, may add to it (the saved model directory, the exports)
and returns its section of the report. The bench, the budget check and the analysis then run once for the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from compressor.core.runtimes import for_variant, runtime
from compressor.pruning.masking import gated
from compressor.recipe import BenchSpec, Recipe
from compressor.recovery.evaluate import evaluate
from compressor.recovery.layer_drop import LayerDropBaseline
from compressor.recovery.loop import PruneResult
from compressor.recovery.train import model_inputs
from compressor.sources import TaskData
from compressor.sources.batches import sample_batches
from compressor.surgery.checkpoint import save_pruned
from compressor.surgery.cost import model_stats

if TYPE_CHECKING:
    from compressor.deploy.quantize import Int8Options

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
    baseline: LayerDropBaseline | None = None  # the fine-tuned layer-dropping baseline (`prune.baseline`)
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per phase, in run order (report)
    relative_budget: dict | None = None  # a budget `relative_to` a reference: what it measured (report)

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Record the wall time of the block as `phase` in `timings` (the report's stage-time table)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] = round(time.perf_counter() - start, 1)


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: its report key, whether the recipe enables it, and what it does."""

    name: str
    run: Callable[[RunState], dict]
    enabled: Callable[[Recipe], bool] = lambda recipe: True
    label: str = ""  # its row in the report's time table (default: `name`)


def surgery_check(
    model: nn.Module,
    pruned: nn.Module,
    gates: torch.Tensor,
    batch: dict,
    neurons: torch.Tensor | None = None,
    hidden: torch.Tensor | None = None,
) -> float:
    """Max |Δlogit| between `model` masked by head `gates` (and FFN `neurons` gates, residual channels `hidden`)
    and `pruned`; raises when above `SURGERY_ATOL`."""
    with torch.inference_mode(), gated(model, gates, neurons, hidden):
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
    masks = result.masks
    diff = surgery_check(result.model, state.pruned, masks.head_gates(), batch, masks.neuron_gates(), masks.hidden)
    log.info("surgery: removed %d heads, masked vs pruned max |Δlogit| = %.2e", int((~masks.heads).sum()), diff)
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
        **{k: stats[k] for k in ("flop_ratio", "parameter_ratio", "empty_layers", "removed_layers")},
        "units_removed": _units_removed(stats),
    }


def _units_removed(stats: dict) -> dict:
    """Units removed per kind (heads, FFN neurons, whole layers) from `model_stats`."""
    before, after = stats["original"], stats["pruned"]
    return {
        "heads": before["heads"] - after["heads"],
        "neurons": before["ffn_neurons"] - after["ffn_neurons"],
        "layers": len(stats["removed_layers"]),
    }


def baseline_stage(state: RunState) -> dict:
    """The layer-dropping baseline's test accuracy and FLOPs, and McNemar's test against the pruned model."""
    from compressor.bench.quality import compare_on

    base = state.baseline
    comparison = compare_on(base.model, state.pruned, state.splits["test"], state.tokenizer)
    log.info(
        "baseline: %d top layers dropped, test acc %.4f vs pruned %.4f (McNemar p %.3g)",
        base.layers_dropped,
        comparison["baseline_accuracy"],
        comparison["pruned_accuracy"],
        comparison["mcnemar_p"],
    )
    return {**base.info, **comparison}


def export_stage(state: RunState) -> dict:
    """ONNX variants of the saved model, each checked against PyTorch on validation batches."""
    from compressor.deploy.export import export_onnx
    from compressor.deploy.quantize import int8_options

    spec, splits = state.recipe.export, state.splits
    batches = sample_batches(splits["validation"], state.tokenizer, 128, 32, seed=1)
    int8 = int8_options(spec.int8, spec.variants, splits["train"], splits["validation"], state.tokenizer)
    out = state.out / "onnx"
    state.exported = export_onnx(
        state.model_dir, out, spec.variants, batches, spec.atol, spec.opset, int8, spec.exporter
    )
    for name, info in state.exported.items():
        log.info(
            "export %s: %.1f MB, max |Δlogit| vs PyTorch %.2e, agreement %.4f",
            name,
            info["size_bytes"] / 1e6,
            info["max_abs_diff"],
            info["agreement"],
        )
    return state.exported


def with_quantize_only(recipe: Recipe, variants: list[str]) -> list[str]:
    """The original's export `variants` plus those of the `bench.quantize_only` runtimes (when export is enabled):
    the original quantized, the alternative to pruning that every frontier shows."""
    extra = [runtime(name).variant for name in recipe.bench.quantize_only] if recipe.export.enabled else []
    return list(dict.fromkeys([*variants, *extra]))


def export_original(state: RunState, variants: list[str]) -> dict:
    """The original exported to `variants` under `<output_dir>/onnx-original/` (the export's manifest per variant).
    Its int8 variants are built exactly as the pruned model's (`_original_variants`: the recipe's int8 options, from
    the optimised graph when the recipe asks for it), so a ratio between them measures pruning alone."""
    import tempfile

    from compressor.deploy.cache import cached_export, export_key
    from compressor.deploy.export import export_onnx
    from compressor.deploy.exporters import preference

    if not variants:
        return {}
    spec = state.recipe.export
    checks = sample_batches(state.splits["validation"], state.tokenizer, 128, 32, seed=1)
    wanted, int8 = _original_variants(state, variants)

    def build(out_dir: Path) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            save_pruned(state.original, Path(tmp) / "model", state.tokenizer)
            return export_onnx(Path(tmp) / "model", out_dir, wanted, checks, spec.atol, spec.opset, int8, spec.exporter)

    read = [*checks, *(int8.calibration if int8 else ()), *(int8.validation if int8 else ())]
    vocab = json.dumps(state.tokenizer.get_vocab(), sort_keys=True)  # the tokenizer files the variants carry
    settings = {
        "variants": wanted,
        "export": spec.model_dump(mode="json"),
        "exporters": preference(spec.exporter),  # what "auto" stands for here (`COMPRESSOR_EXPORTER`)
        "int8": repr(int8),
        "tokenizer": [type(state.tokenizer).__name__, hashlib.sha256(vocab.encode()).hexdigest()],
    }
    out = cached_export(export_key(state.original, read, settings), state.out / "onnx-original", build)
    return {variant: out[variant] for variant in variants if variant in out}


def _original_variants(state: RunState, variants: list[str]) -> tuple[list[str], Int8Options | None]:
    """The ONNX variants to build of the original for `variants`, and their int8 options: an int8 variant is
    quantised from the optimised graph when the pruned model's is (the recipe asks for `optimized`), with the
    recipe's per-channel, reduce-range, excluded-node and calibration settings, and the same validation gate: a
    quantised original is a choice `compressor pick` may return (quantize-only, no pruning)."""
    from compressor.deploy.quantize import int8_options

    spec = state.recipe.export
    quantized = [v for v in variants if for_variant(v).gated]
    if not quantized:
        return list(variants), None
    graphs = ["optimized"] if "optimized" in spec.variants and "optimized" not in variants else []
    int8 = int8_options(spec.int8, quantized, state.splits["train"], state.splits["validation"], state.tokenizer)
    return [*graphs, *variants], int8


def bench_spec_for(recipe: Recipe) -> BenchSpec:
    """The recipe's bench settings, extended so a speed-up budget's batch size and length are measured (its length
    first, so the bench's headline and its accuracy-vs-speed-up chart are at the budget's length)."""
    spec, budget = recipe.bench, recipe.prune.budget
    if budget is None or budget.kind != "speedup":
        return spec
    lengths = [budget.seq_len] + [s for s in spec.seq_lens if s != budget.seq_len]
    batches = spec.batch_sizes + [b for b in [budget.batch_size] if b not in spec.batch_sizes]
    return spec.model_copy(update={"seq_lens": lengths, "batch_sizes": batches})


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
    from compressor.report.card import add_deployment_section
    from compressor.surgery.checkpoint import CARD_FILE

    finetune = state.recipe.prune.recovery_finetune
    distill = finetune.distill.model_dump() if finetune is not None and finetune.distill is not None else None
    add_deployment_section(state.model_dir, state.exported or None, distill)
    return {"file": str(state.model_dir / CARD_FILE), "distillation": distill}


def _finite_or_nan(scores: torch.Tensor) -> torch.Tensor:
    """Scores with removed heads (-inf) as NaN, as the analysis maps expect."""
    return scores.float().masked_fill(torch.isneginf(scores), float("nan"))


STAGES: tuple[Stage, ...] = (  # what makes one member shippable; the run's bench and budget follow in `measure`
    Stage("pruned", save_stage, label="surgery + save"),
    Stage("baseline", baseline_stage, lambda recipe: recipe.prune.baseline is not None),
    Stage("export", export_stage, lambda recipe: recipe.export.enabled),
    Stage("model_card", card_stage, label="model card"),
)


def run_stages(state: RunState, stages: tuple[Stage, ...] = STAGES) -> dict:
    """Run the enabled stages in order, each adding its section to `state.report`; returns the report."""
    enabled = [stage for stage in stages if stage.enabled(state.recipe)]
    bar = tqdm(enabled, desc="stages", leave=False)
    for stage in bar:
        bar.set_postfix_str(stage.name)
        with state.timed(stage.label or stage.name):
            state.report[stage.name] = stage.run(state)
    return state.report
