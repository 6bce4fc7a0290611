"""Reference models (`bench.references`): other models the members are compared with on the same frontier.

A practitioner deciding whether to prune their fine-tuned base model compares it with the obvious alternative: a
smaller off-the-shelf model fine-tuned on the same task. Each reference is any model the sources load (a built-in,
a hub id, a local directory), and it is

- checked when the run starts, from its config alone (a supported architecture, position embeddings for the run's
  lengths, a tokenizer, and no task head or label set other than the task's), in one line naming it
  (`check_references`), before anything long runs;
- fine-tuned on the run's training split, tokenised by its own tokenizer, with `bench.reference_finetune` (else the
  recipe's `base_finetune`), and cached exactly as the base model is (`finetune.cached_finetune`: a base run of the
  same model shares the entry); with `bench.reference_distill`, distilled from the run's teacher targets as the
  members are (the alternative of distilling the original into the small model), cached under its own key;
- saved under `<output_dir>/references/<label>/` and exported by the member export stage (ONNX variants, the int8
  gate);
- benchmarked beside the members and the original, on its own tokenisation of the same test examples
  (`bench.references`), and marked as a reference on the frontier, in the report and by `compressor pick`.

`reference.json` is written last in its directory: a resumed run keeps a finished reference and redoes the rest.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from compressor.core import atomic
from compressor.core.errors import UserError
from compressor.pipeline.finetune import cached_finetune
from compressor.pipeline.stages import STAGES, RunState, run_stages
from compressor.pruning.selection import check_positions
from compressor.recipe import ModelSpec, Recipe
from compressor.recovery.distill import TeacherTargets
from compressor.recovery.evaluate import evaluate
from compressor.sources import load_tokenizer
from compressor.sources.batches import tokenize_splits
from compressor.sources.models import foreign_head, load_config, max_positions
from compressor.surgery.checkpoint import save_pruned

log = logging.getLogger("compressor")
REFERENCES_DIR = "references"
REFERENCE_FILE = "reference.json"  # written last in a reference's directory: its presence means it is complete
REFERENCE_STAGES = ("export",)  # the member stages a reference goes through after it is saved
FIELD = "bench.references"


@dataclass(frozen=True)
class Reference:
    """One entry of `bench.references`: its label (a directory and candidate-name part) and how it loads."""

    label: str
    spec: ModelSpec


def references(recipe: Recipe) -> list[Reference]:
    """The recipe's references, each labelled by its source's last name ("builtin:minilm-l6" → "minilm-l6",
    "org/model" → "model", a directory → its name), made unique by a suffix."""
    out: list[Reference] = []
    for source in recipe.bench.references:
        name = source.removeprefix("builtin:").rstrip("/").rsplit("/", 1)[-1]
        label = base = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "reference"
        taken = {r.label for r in out}
        for n in range(2, len(taken) + 2):
            if label not in taken:
                break
            label = f"{base}-{n}"
        out.append(Reference(label, ModelSpec(source=source)))
    return out


def check_references(recipe: Recipe, label_names: list[str]) -> None:
    """Refuse, in one line naming the reference, one that cannot be compared fairly: a config that does not load
    or an unsupported architecture, too few position embeddings for the run's lengths, no tokenizer, or another
    task head or label set than `label_names` (fine-tuning would silently discard what it was trained for). Reads
    configs and tokenizers only."""
    for ref in references(recipe):
        source = ref.spec.source
        try:
            config = load_config(ref.spec)
            check_positions(recipe, max_positions(config), "its")
            load_tokenizer(ref.spec)
        except UserError as err:
            raise UserError(f"{FIELD}: reference '{source}': {str(err).removeprefix('model.source: ')}") from None
        problem = foreign_head(config, label_names)
        if problem is not None:
            raise UserError(
                f"{FIELD}: reference '{source}' {problem}; expected a pretrained encoder or a sequence classifier "
                "of the task's labels (a reference is fine-tuned on the task)"
            )


def prepare_references(run: RunState, teacher: TeacherTargets | None = None) -> list[dict]:
    """Every reference fine-tuned (cached; distilled from `teacher` when given), saved and exported; their report
    sections (empty on the processes that only train)."""
    sections = [prepare_reference(run, ref, teacher) for ref in references(run.recipe)]
    return sections if run.main else []


def completed(ref_dir: Path) -> dict | None:
    """The reference's saved section when an earlier try of this run finished it (else None)."""
    path = ref_dir / REFERENCE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def prepare_reference(run: RunState, ref: Reference, teacher: TeacherTargets | None = None) -> dict:
    """Fine-tune `ref` on the run's split with its own tokenizer (distilled from `teacher` when given), or reuse the
    cached fine-tune, then, on the main process, evaluate it on test, save it under `references/<label>/model` and
    export it as a member is exported. Returns its report section; `reference.json` is written last."""
    out = run.out / REFERENCES_DIR / ref.label
    if (done := completed(out)) is not None:
        log.info("reference %s: kept from an earlier try (%s)", ref.label, out)
        return done
    tokenizer = load_tokenizer(ref.spec)
    splits = tokenize_splits(run.data, tokenizer, run.recipe.data.max_length)
    with run.timed(f"reference {ref.label}: fine-tune"):
        what, settings = f"reference {ref.label}: fine-tune", run.recipe.bench.reference_finetune
        model, info = cached_finetune(run, ref.spec, tokenizer, splits["train"], what, settings, teacher)
    if not run.main:
        return {}
    model = model.cpu().eval()
    test = evaluate(model, splits["test"], tokenizer)
    log.info("reference %s: test acc %.4f", ref.label, test["accuracy"])
    shutil.rmtree(out, ignore_errors=True)  # an earlier try's unfinished reference: redone whole
    out.mkdir(parents=True)
    model_dir = save_pruned(model, out / "model", tokenizer, {"reference": ref.spec.source, "test": test})
    state = dataclasses.replace(run, out=out, tokenizer=tokenizer, splits=splits, report={}, original=None,
                                result=None, pruned=None, model_dir=model_dir, exported={}, baseline=None,
                                timings={})  # fmt: skip
    with run.timed(f"reference {ref.label}: export"):
        run_stages(state, tuple(s for s in STAGES if s.name in REFERENCE_STAGES))
    section = {
        "label": ref.label,
        "source": ref.spec.source,
        "finetune": info,
        "distilled": teacher is not None,
        "test": test,
        "model_dir": str(model_dir),
        "parameters": sum(p.numel() for p in model.parameters()),
        **{name: state.report[name] for name in REFERENCE_STAGES if name in state.report},
    }
    atomic.write_text(out / REFERENCE_FILE, json.dumps(section, indent=2, default=str))
    return section
