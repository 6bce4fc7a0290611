"""Predictions and accuracy of a (masked) PyTorch classifier over a tokenised split.

The split runs sorted by length (little padding) and comes back in its own order; head and neuron masks are
respected through `pruning.masking.gated`, so a masked model evaluates as its physically pruned copy would;
`evaluate_kept` evaluates that copy itself, at its cost.
"""

from __future__ import annotations

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from compressor.pruning.masking import gated
from compressor.pruning.units import Masks
from compressor.sources.batches import lengths, loader, model_inputs, to_device


@torch.inference_mode()
def predict(
    model: nn.Module,
    eval_ds: datasets.Dataset,
    tokenizer,
    accelerator: Accelerator | None = None,
    gates: torch.Tensor | None = None,
    batch_size: int = 64,
    neurons: torch.Tensor | None = None,
    desc: str = "predict",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) for the whole split, in its order; under several processes, gathered on every process.

    The split is run sorted by length (so batches pad little) and the results are put back in the split's order.
    A progress bar named `desc` counts the batches (a base-size model's pass over a train split takes minutes)."""
    model.eval()
    order = np.argsort(lengths(eval_ds), kind="stable")
    dl = loader(eval_ds.select(order), tokenizer, batch_size)
    if accelerator is not None:
        dl = accelerator.prepare_data_loader(dl)
    device = next(model.parameters()).device
    main = accelerator is None or accelerator.is_local_main_process
    logits, labels = [], []
    with gated(model, gates, neurons):
        for batch in tqdm(dl, desc=desc, leave=False, disable=not main):
            batch = to_device(batch, device)
            out = model(**model_inputs(batch)).logits
            lab = batch["labels"]
            if accelerator is not None:
                out, lab = accelerator.gather_for_metrics((out, lab))
            logits.append(out.float().cpu())
            labels.append(lab.cpu())
    back = torch.from_numpy(np.argsort(order, kind="stable"))
    return torch.cat(logits)[back], torch.cat(labels)[back]


def evaluate(
    model: nn.Module,
    eval_ds: datasets.Dataset,
    tokenizer,
    accelerator: Accelerator | None = None,
    gates: torch.Tensor | None = None,
    neurons: torch.Tensor | None = None,
) -> dict:
    """Accuracy and mean cross-entropy on a split (accuracy through the locally shipped `evaluate` module)."""
    from compressor.sources.metrics import load_metric

    logits, labels = predict(model, eval_ds, tokenizer, accelerator, gates, neurons=neurons, desc="evaluate")
    preds = logits.argmax(-1)
    acc = load_metric("accuracy").compute(predictions=preds.tolist(), references=labels.tolist())["accuracy"]
    return {"accuracy": float(acc), "loss": float(F.cross_entropy(logits, labels)), "n": int(labels.numel())}


def evaluate_kept(
    model: nn.Module, masks: Masks, eval_ds: datasets.Dataset, tokenizer, accelerator: Accelerator | None = None
) -> dict:
    """`evaluate` of the units `masks` keep in `model`, run on its physically pruned copy: the logits of the masked
    model (surgery's parity, checked as each member is saved) at the pruned model's cost."""
    unwrapped = accelerator.unwrap_model(model) if accelerator is not None else model
    return evaluate(masks.pruned_copy(unwrapped), eval_ds, tokenizer, accelerator)
