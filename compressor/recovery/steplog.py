"""The pruning loop's one-line-per-step progress log (what `compressor run` prints and writes to run.log)."""

from __future__ import annotations

import logging

log = logging.getLogger("compressor")


def log_step(entry: dict, steps: int) -> None:
    """Log a finished step: heads left, validation accuracy after pruning and after fine-tuning, and for runs that
    prune neurons their counts and the budget's progress. `steps`: the scheduled count (later ones are top-ups)."""
    accuracy = {k: entry[k]["accuracy"] for k in ("val_after_prune", "val_after_finetune") if k in entry}
    log.info(
        "step %d%s: %d heads left %s | val acc after prune %s, after fine-tune %s (%.0fs)",
        entry["step"],
        f"/{steps}" if entry["step"] <= steps else f" ({steps} scheduled + top-ups)",
        entry["heads_left"],
        entry["heads_per_layer"],
        _fmt(accuracy.get("val_after_prune")),
        _fmt(accuracy.get("val_after_finetune", accuracy.get("val_after_prune"))),
        entry["seconds"],
    )
    if "neurons_left" in entry:
        log.info(
            "step %d: %d FFN neurons left %s, %d layers | %s",
            entry["step"],
            entry["neurons_left"],
            entry["neurons_per_layer"],
            entry["layers_left"],
            {k: entry[k] for k in ("flops_left_fraction", "predicted_speedup", "measured_speedup") if k in entry},
        )


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"
