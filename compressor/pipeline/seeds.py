"""`compressor run RECIPE --seeds 0,1,2` (or a recipe's `seeds: [0, 1, 2]`): the same run repeated over seeds.

Repeat `k` is a complete, ordinary run under `<output_dir>/seed-<k>/` (so `compressor pick` reads each) of the
recipe with `seed` moved to `repeat_seed(seed, k)` and `base_seed` held at the recipe's base fine-tune seed: the base
fine-tune, cached under `$COMPRESSOR_CACHE/finetuned/` by a key that holds its seed (`pipeline.finetune`), is made
once and shared, while everything the run seeds after it is redrawn: a post-training sample, the scoring batches,
each step's fine-tune (its examples, shuffle and dropout), the teacher targets' examples, the members' last
fine-tunes, the layer-drop baselines and the references' fine-tunes. The data splits (`data.split_seed`) and the
bench's test examples stay the same, so the repeats' gaps pair example by example. Seed 0 is the recipe's own run.

A finished repeat is kept on a rerun, an interrupted one resumes as any run does; then `seeds.json` and `seeds.md`
(`compressor.report.seeds`) say, per accuracy gap, each seed's value, the mean, the spread and a 95% interval.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml
from accelerate import Accelerator, PartialState

from compressor.core import atomic, outdir
from compressor.core.errors import UserError
from compressor.pipeline import runlog
from compressor.pipeline.preflight import preflight
from compressor.pipeline.runner import run_recipe
from compressor.recipe import Recipe, RecipeError, parse_recipe
from compressor.recipe.base import MAX_SEED, MAX_SEEDS
from compressor.report.seeds import render_seeds, summarize_seeds

log = logging.getLogger("compressor")
SEED_STRIDE = 1_000_000  # repeat k's seed is seed + k * SEED_STRIDE: past every offset a run adds to its own seed
SEEDS_JSON, SEEDS_MD = "seeds.json", "seeds.md"


def parse_seeds(text: str) -> list[int]:
    """`--seeds 0,1,2` as a list; anything else (empty, not integers, out of range, repeated) is one line."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or not all(p.isdigit() for p in parts):
        raise UserError(f"--seeds: expected comma-separated integers such as 0,1,2, got '{text}'")
    seeds = [int(p) for p in parts]
    if len(set(seeds)) != len(seeds) or max(seeds) > MAX_SEED or len(seeds) > MAX_SEEDS:
        raise UserError(f"--seeds: expected at most {MAX_SEEDS} distinct integers from 0 to {MAX_SEED}, got '{text}'")
    return seeds


def repeat_seed(seed: int, k: int) -> int:
    """The `seed` repeat `k` runs with: `seed` itself for 0, else far from any seed another repeat's steps,
    members or baselines derive (`seed + step`, `seed + 1000 * step`, `recovery.draws.member_seed`)."""
    return (seed + k * SEED_STRIDE) % 2**32


def seed_dir(out: Path, k: int) -> Path:
    return out / f"seed-{k}"


def seed_recipe(recipe: Recipe, k: int) -> Recipe:
    """Repeat `k`'s recipe: its own seed and directory, the base fine-tune's seed held, no further repeats."""
    data = recipe.model_dump(mode="json") | {
        "seed": repeat_seed(recipe.seed, k),
        "base_seed": recipe.base_finetune_seed,
        "seeds": None,
        "output_dir": str(seed_dir(Path(recipe.output_dir), k)),
    }
    return parse_recipe(data)


def _finished(recipe: Recipe) -> dict | None:
    """The report of repeat `recipe` when its directory holds it finished with this same recipe, else None."""
    out = outdir.target_path(recipe.output_dir)
    if not (out / outdir.DONE_FILE).exists():
        return None
    try:
        same = parse_recipe(yaml.safe_load((out / outdir.RESOLVED_FILE).read_text())) == recipe
    except (OSError, RecipeError, yaml.YAMLError):
        return None
    return json.loads((out / outdir.DONE_FILE).read_text()) if same else None


def _check_parent(recipe: Recipe) -> Path:
    """The repeats' parent directory: refused when it holds a single run (its files would mix with the repeats)."""
    out = outdir.target_path(recipe.output_dir)
    if outdir.is_run(out):
        raise UserError(
            f"output_dir: '{out}' holds a single run; expected a new directory or one of an earlier --seeds run"
        )
    return out


def run_seeds(recipe: Recipe, seeds: list[int], force: bool = False, accelerator: Accelerator | None = None) -> dict:
    """Run `recipe` once per seed in `seeds` (`seed_recipe`), keeping finished repeats unless `force`, then write
    `seeds.json` / `seeds.md` into its `output_dir`. Returns the summary (empty on helper processes)."""
    out = _check_parent(recipe)
    recipes = {k: seed_recipe(recipe, k) for k in seeds}
    done = {k: None if force else _finished(r) for k, r in recipes.items()}
    for k, r in recipes.items():  # every repeat that will run may, before the first one starts
        if done[k] is None:
            preflight(r, force)
    reports = {}
    for k, r in recipes.items():
        if done[k] is not None:
            log.info("seed %d: kept from an earlier run (%s)", k, r.output_dir)
            reports[k] = done[k]
            continue
        runlog.hold(PartialState().is_main_process)  # this repeat's lines go to its own run.log
        log.info("seed %d: running with seed %d, base fine-tune seed %d", k, r.seed, r.base_finetune_seed)
        reports[k] = run_recipe(r, force=force, accelerator=accelerator)
    if not all(reports.values()):  # a helper process of `accelerate launch`: the main one writes
        return {}
    summary = summarize_seeds(reports) | {
        "seed_of_repeat": {str(k): r.seed for k, r in recipes.items()},
        "base_seed": recipe.base_finetune_seed,
        "runs": {str(k): seed_dir(Path("."), k).as_posix() for k in seeds},
    }
    atomic.write_text(out / SEEDS_JSON, json.dumps(summary, indent=2))
    atomic.write_text(out / SEEDS_MD, render_seeds(summary))
    return summary
