"""The stages after pruning — export, benchmark, head-role analysis — each reading a saved model.

Kept out of runner.py so each stage is a short function over plain inputs; the CLI subcommands call the same
library functions directly.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from compressor.checkpoint import add_deployment_section
from compressor.selection import plan_to_mask
from compressor.train import sample_batches

log = logging.getLogger("compressor")


def export_stage(run, model_dir: Path) -> dict:
    from compressor.export import export_onnx
    from compressor.quantize import int8_options

    spec = run.recipe.export
    batches = sample_batches(run.splits["validation"], run.tokenizer, 128, 32, seed=1)
    int8 = int8_options(spec.int8, spec.variants, run.splits["train"], run.splits["validation"], run.tokenizer)
    result = export_onnx(model_dir, run.out / "onnx", spec.variants, batches, spec.atol, spec.opset, int8)
    for name, info in result.items():
        log.info(
            "export %s: %.1f MB, max |Δlogit| vs PyTorch %.2e, agreement %.4f",
            name,
            info["size_bytes"] / 1e6,
            info["max_abs_diff"],
            info["agreement"],
        )
    return result


def bench_stage(run, original: torch.nn.Module, pruned: torch.nn.Module, model_dir: Path, exported: dict) -> dict:
    from compressor import bench
    from compressor.checkpoint import load_pruned

    spec = run.recipe.bench
    seq = spec.seq_lens
    fast_original = _as_sdpa(original)
    pruned_candidate = bench.pytorch_candidate(
        "pytorch-pruned", load_pruned(model_dir, attn_implementation="sdpa"), seq, model_dir
    )
    candidates = [bench.pytorch_candidate("pytorch-original", fast_original, seq), pruned_candidate]
    for name, info in exported.items():
        candidates.append(
            bench.onnx_candidate(
                f"onnx-{name}",
                info["dir"],
                spec.threads,
                flops_per_example=pruned_candidate.flops_by_seq_len,
                heads_per_layer=pruned_candidate.heads_per_layer,
            )
        )
    n = spec.eval_examples or len(run.splits["test"])
    batches = sample_batches(run.splits["test"], run.tokenizer, n, 32, seed=0)
    return bench.bench(candidates, batches, spec, run.out / "bench", reference="pytorch-original")


def _as_sdpa(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of an eager-attention model using SDPA (what users deploy), for fair timing."""
    import tempfile

    from compressor.checkpoint import load_pruned, save_pruned

    with tempfile.TemporaryDirectory() as tmp:
        save_pruned(model, Path(tmp) / "m")
        return load_pruned(Path(tmp) / "m", attn_implementation="sdpa")


def analysis_stage(run, original: torch.nn.Module, steps_log: list[dict]) -> dict:
    """Head roles of the original model, and per pruning step the roles of the kept vs removed heads.

    Inputs are encoded as in training (pairs as pairs). spaCy is optional: when its English model cannot be
    loaded the analysis logs one warning and runs without syntactic roles (`syntax_skipped` says why), rather than
    failing at the end of a long run.
    """
    from compressor import analysis

    spec = run.recipe.analysis
    fields = run.data.text_fields
    texts = analysis.model_texts(run.data.test, fields, spec.examples)
    train_texts = analysis.model_texts(run.data.train, fields)
    first_scores = (
        {
            run.recipe.prune.criterion.name: torch.tensor(
                [[float("nan") if s is None else s for s in row] for row in steps_log[0]["scores"]]
            )
        }
        if steps_log
        else None
    )
    result = analysis.analyze_heads(
        original,
        run.tokenizer,
        texts,
        train_texts,
        max_length=run.recipe.data.max_length,
        scores=first_scores,
        syntax="auto",
        config=analysis.RoleConfig(**spec.roles.model_dump()),
    )
    alive = torch.ones_like(analysis.role_masks(result)["any"], dtype=torch.bool)
    per_step = []
    for entry in steps_log:
        alive = plan_to_mask({int(k): v for k, v in entry["removed"].items()}, alive)
        per_step.append({"step": entry["step"], **analysis.kept_vs_removed(result, alive)})
    result["pruning_steps"] = per_step
    analysis.write_analysis(result, run.out / "analysis")
    return {
        "counts": result.get("counts"),
        "syntax_skipped": result["settings"]["syntax_skipped"],
        "pruning_steps": per_step,
    }


def after_prune(run, original, pruned, model_dir: Path, alive, steps_log: list[dict], report: dict) -> None:
    """Run the enabled post-pruning stages, adding their results to `report`."""
    recipe = run.recipe
    exported = {}
    if recipe.export.enabled:
        exported = export_stage(run, model_dir)
        report["export"] = exported
    distill = recipe.prune.finetune.distill if recipe.prune.finetune is not None else None
    add_deployment_section(model_dir, exported or None, distill and distill.model_dump())
    if recipe.bench.enabled:
        report["bench"] = bench_stage(run, original, pruned, model_dir, exported)
    if recipe.analysis.enabled:
        report["analysis"] = analysis_stage(run, original, steps_log)
