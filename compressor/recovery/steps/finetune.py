"""`finetune`: train the kept units with `prune.finetune` (distilled from the teacher when it says so)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.recovery.steps.registry import register

if TYPE_CHECKING:
    from compressor.pruning.units import Masks
    from compressor.recovery.choice import LoopInputs


@register("finetune", trains=True)
class Finetune:
    """Step k fine-tunes with seed `seed + k` (the draws `compressor.recovery.distill.step_examples` predicts)."""

    def __init__(self, loop: LoopInputs) -> None:
        self.loop = loop

    def __call__(self, masks: Masks, step: int) -> dict:
        """Train the kept units of the masked model; the step log's `finetune` entry (the training statistics)."""
        from compressor.recovery.train import train_kept  # the training stack loads when a step runs, not at import

        loop = self.loop
        return train_kept(
            loop.model, masks, loop.train, loop.tokenizer, loop.config.recovery_finetune, loop.accelerator,
            seed=loop.seed + step, desc=f"step {step + 1}", teacher=loop.teacher,
        )  # fmt: skip
