"""The pruning loop's step log: the neuron fields of an entry, and the one line per step that `compressor run`
prints and writes to run.log."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("compressor")
_WORDS = {"finetune": "fine-tune"}  # how the log names a recovery step (else by its name)


def unit_entry(heads: torch.Tensor, neurons: torch.Tensor, plan: dict) -> dict:
    """The step log's neuron and layer fields (runs that prune neurons), from the head and neuron masks after the
    step and its unit plan of new removals."""
    per_layer = neurons.sum(1)
    return {
        "removed_neurons": {str(k): len(v) for k, v in plan.get("neurons", {}).items()},
        "neurons_left": int(per_layer.sum()),
        "neurons_per_layer": [int(n) for n in per_layer],
        "layers_left": int(((per_layer > 0) | heads.any(1)).sum()),
    }


def log_step(entry: dict, steps: int) -> None:
    """Log a finished step: heads left, validation accuracy after pruning and after each recovery step (rescale's
    with its fits, on a line of its own), and for runs that prune neurons their counts and the budget's progress.
    `steps`: the scheduled count (later ones are top-ups)."""
    after = [  # each recovery step's validation, in the order the steps ran, but rescale's (its own line below)
        f", after {_WORDS.get(name, name)} {_fmt(entry[f'val_after_{name}']['accuracy'])}"
        for name in (k.removeprefix("val_after_") for k in entry if k.startswith("val_after_"))
        if name not in ("prune", "rescale")
    ]
    log.info(
        "step %d%s: %d heads left %s | val acc after prune %s%s (%.0fs)",
        entry["step"],
        f"/{steps}" if entry["step"] <= steps else f" ({steps} scheduled + top-ups)",
        entry["heads_left"],
        entry["heads_per_layer"],
        _fmt(entry.get("val_after_prune", {}).get("accuracy")),
        "".join(after),
        entry["seconds"],
    )
    if "rescale" in entry:
        fits = entry["rescale"]["layers"]
        log.info(
            "step %d: rescaled %d sublayers in %.1fs, mean residual %.4f -> %.4f | val acc after rescale %s",
            entry["step"],
            len(fits),
            entry["rescale"]["seconds"],
            sum(f["residual_before"] for f in fits) / max(len(fits), 1),
            sum(f["residual_after"] for f in fits) / max(len(fits), 1),
            _fmt(entry.get("val_after_rescale", {}).get("accuracy")),
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
