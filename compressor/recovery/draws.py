"""Which training examples a recovery fine-tune draws: a pure function of the split size, the cap and the
seed, so the teacher pass knows every step's examples before the first step (`teacher_examples`: the union over
every fine-tune a run distils: the steps, the layer-drop baseline, each member's last fine-tune, a reference).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compressor.recipe import PruneSpec, TrainSpec

MEMBER_SEED = 10_000  # member i's final fine-tune (`prune.member_finetune`) draws with seed + MEMBER_SEED + i


def member_seed(seed: int, index: int) -> int:
    """The seed of member `index`'s final fine-tune (and its layer-drop baseline's): apart from the steps' seeds
    (seed + k), so it draws its own examples and dropout."""
    return seed + MEMBER_SEED + index


def drawn_examples(n: int, max_examples: int | None, seed: int) -> list[int] | None:
    """Positions (in a split of `n` examples) of the examples one fine-tuning run with `seed` draws, or None when it
    uses them all. A pure function of its arguments, so the teacher pass knows every step's examples up front; the
    draw is `datasets.Dataset.shuffle(seed=seed)` then the first `max_examples` (the order fine-tuning always had).
    """
    if max_examples is None or n <= max_examples:
        return None
    return np.random.default_rng(seed).permutation(n)[:max_examples].tolist()


def member_examples(n: int, max_examples: int | None, seed: int, members: int) -> list[int] | None:
    """The examples the final fine-tunes of `members` members draw (`member_seed`), None when one uses them all."""
    return recovery_examples(n, max_examples, [member_seed(seed, i) for i in range(members)])


def recovery_examples(n: int, max_examples: int | None, seeds: Sequence[int]) -> list[int] | None:
    """The sorted union of the examples drawn by fine-tuning runs with `seeds` (None when one of them uses all)."""
    union: set[int] = set()
    for seed in seeds:
        drawn = drawn_examples(n, max_examples, seed)
        if drawn is None:
            return None
        union.update(drawn)
    return sorted(union)


def recovery_spec(finetune: TrainSpec | None, steps: int, n: int) -> TrainSpec | None:
    """The pruning run's whole recovery budget as one fine-tune on a split of `n` examples, same rate and batch:
    as many example passes as `steps` fine-tunes of `finetune`. Capped steps (each sees min(`max_examples`, `n`)
    examples) give `steps` × that many distinct examples while the split has that many; beyond it, the whole split
    for the fractional number of epochs that makes the same count (else the baseline would stop after one epoch with
    fewer updates than the steps had). Uncapped steps give `steps` × `epochs` epochs."""
    if finetune is None:
        return None
    if finetune.max_examples is None:
        return finetune.model_copy(update={"epochs": finetune.epochs * steps})
    total = min(finetune.max_examples, n) * steps
    if total <= n:
        return finetune.model_copy(update={"max_examples": total})
    return finetune.model_copy(update={"max_examples": None, "epochs": finetune.epochs * total / n})


def baseline_examples(n: int, finetune: TrainSpec | None, steps: int, seed: int) -> list[int] | None:
    """The train examples the baseline's fine-tune after `steps` pruning steps draws (None: all of them). With
    fewer steps (a budget met early) it draws a prefix of the same seeded permutation, so the recipe's
    `prune.steps` gives a superset known before the run."""
    spec = recovery_spec(finetune, steps, n)
    return [] if spec is None else drawn_examples(n, spec.max_examples, seed)


def step_examples(n: int, finetune: TrainSpec | None, seed: int, steps: int) -> list[int] | None:
    """The union of the train examples the recovery fine-tuning of pruning steps 0..steps-1 draws (step k
    fine-tunes with seed `seed + k`, as `compressor.recovery.loop.prune` does); None when a step uses them all."""
    if finetune is None:
        return []
    return recovery_examples(n, finetune.max_examples, range(seed, seed + steps))


def teacher_examples(n: int, prune: PruneSpec, reference: TrainSpec | None, seed: int, steps: int) -> list[int] | None:
    """Every train example a run's distilled fine-tunes draw (None: all of them), so one teacher pass covers them:
    the recovery fine-tunes of up to `steps` steps (top-ups too), the layer-drop baseline's, each member's last
    fine-tune (their baselines draw the same) and a distilled `reference`'s (None: no reference learns from it)."""
    finetune = prune.recovery_finetune
    draws = [step_examples(n, finetune, seed, steps)]
    if prune.baseline == "layer_drop":
        draws.append(baseline_examples(n, finetune, steps, seed))
    if prune.member_finetune is not None:
        draws.append(member_examples(n, prune.member_finetune.max_examples, seed, len(prune.resolved_budget.targets)))
    if reference is not None:  # a distilled reference draws as a base fine-tune does
        draws.append(drawn_examples(n, reference.max_examples, seed))
    return None if None in draws else sorted(set().union(*draws))
