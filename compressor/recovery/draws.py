"""Which training examples a recovery fine-tune draws: a pure function of the split size, the cap and the
seed, so the teacher pass knows every step's examples before the first step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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
