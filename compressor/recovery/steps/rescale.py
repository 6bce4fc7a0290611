"""`rescale`: per-unit scales fitted by least squares and folded into the weights, no training
(`compressor.recovery.rescale`, Kwon et al. 2022)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from compressor.recovery.steps.registry import register

if TYPE_CHECKING:
    from compressor.pruning.units import Masks
    from compressor.recovery.choice import LoopInputs


@register("rescale", samples=True)
class Rescale:
    """The unpruned model (a copy taken before any step) to match and the fit's `prune.sample_size` examples,
    prepared once per run (`Refit`)."""

    def __init__(self, loop: LoopInputs) -> None:
        from compressor.recovery.rescale import Refit  # the fitting stack loads when a run makes the step

        self.loop = loop
        unwrapped = loop.accelerator.unwrap_model(loop.model)
        self.refit = Refit.prepare(unwrapped, loop.train, loop.tokenizer, loop.config, loop.seed)

    def __call__(self, masks: Masks, step: int) -> dict:
        """Fit and fold the kept units' scales; the step log's `rescale` entry (each sublayer's fit)."""
        return self.refit(self.loop.accelerator.unwrap_model(self.loop.model), masks)
