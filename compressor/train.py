"""Tokenisation, data loaders, the Accelerate fine-tuning loop and evaluation.

Head (and FFN neuron) masks are respected by running inside `masking.gated(...)`: a gated unit gets zero
gradient, so masked and physically pruned models stay numerically equivalent through fine-tuning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Sampler
from tqdm.auto import tqdm
from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup

from compressor.batches import model_inputs
from compressor.distill import TeacherTargets, mixed_loss, with_index
from compressor.masking import gated
from compressor.recipe import TrainSpec


def tokenize(ds: datasets.Dataset, tokenizer, text_fields: Sequence[str], max_length: int) -> datasets.Dataset:
    """Tokenise one split (single sentences or pairs), keeping only model inputs and `labels`."""

    def encode(batch: dict) -> dict:
        texts = [batch[f] for f in text_fields]
        out = tokenizer(*texts, truncation=True, max_length=max_length)
        out["labels"] = batch["label"]
        return out

    keep = [c for c in ds.column_names]
    return ds.map(encode, batched=True, remove_columns=keep, desc="tokenize", load_from_cache_file=False)


GROUP_BATCHES = 50  # batches per length-sorted group (HF Trainer's `group_by_length` uses the same mega-batch size)


class LengthGroupedBatches(Sampler[list[int]]):
    """Seeded shuffled batches of examples of similar length, so dynamic padding pads little.

    Why: real classification text is ragged (Rotten Tomatoes: 27 tokens on average, 64 at most), and a random batch
    pads to its longest member: ~1.9x the real tokens there, all of it computed by every Linear. Each epoch shuffles
    the examples (seed + epoch), sorts each group of `GROUP_BATCHES` batches by length, cuts it into batches and
    shuffles the batches, so every example is still seen once per epoch in a seeded, reproducible order.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int):
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        order = rng.permutation(len(self.lengths))
        span = self.batch_size * GROUP_BATCHES
        batches = []
        for start in range(0, len(order), span):
            group = order[start : start + span]
            group = group[np.argsort(-self.lengths[group], kind="stable")]
            batches += [group[i : i + self.batch_size].tolist() for i in range(0, len(group), self.batch_size)]
        yield from (batches[i] for i in rng.permutation(len(batches)))


def lengths(ds: datasets.Dataset) -> list[int]:
    """Tokens per example of a tokenised split."""
    return [len(ids) for ids in ds["input_ids"]]


def loader(
    ds: datasets.Dataset, tokenizer, batch_size: int, shuffle: bool = False, seed: int = 0, by_length: bool = False
) -> DataLoader:
    """Dynamic-padding loader; shuffling uses its own seeded generator so runs are reproducible, and with
    `by_length` it shuffles batches of similar length (`LengthGroupedBatches`)."""
    collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")
    if shuffle and by_length:
        return DataLoader(ds, batch_sampler=LengthGroupedBatches(lengths(ds), batch_size, seed), collate_fn=collate)
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=generator, collate_fn=collate)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def drawn_examples(n: int, max_examples: int | None, seed: int) -> list[int] | None:
    """Positions (in a split of `n` examples) of the examples one fine-tuning run with `seed` draws, or None when it
    uses them all. A pure function of its arguments, so the teacher pass knows every step's examples up front; the
    draw is `datasets.Dataset.shuffle(seed=seed)` then the first `max_examples` (the order fine-tuning always had).
    """
    if max_examples is None or n <= max_examples:
        return None
    return np.random.default_rng(seed).permutation(n)[:max_examples].tolist()


def recovery_examples(n: int, max_examples: int | None, seeds: Sequence[int]) -> list[int] | None:
    """The sorted union of the examples drawn by fine-tuning runs with `seeds` (None when one of them uses all)."""
    union: set[int] = set()
    for seed in seeds:
        drawn = drawn_examples(n, max_examples, seed)
        if drawn is None:
            return None
        union.update(drawn)
    return sorted(union)


def train(
    model: nn.Module,
    train_ds: datasets.Dataset,
    tokenizer,
    spec: TrainSpec,
    accelerator: Accelerator,
    gates: torch.Tensor | None = None,
    seed: int = 0,
    desc: str = "fine-tune",
    neurons: torch.Tensor | None = None,
    teacher: TeacherTargets | None = None,
) -> dict:
    """Fine-tune `model` in place with AdamW + linear warm-up/decay; returns loss and timing.

    `spec.epochs` may be fractional; `spec.max_examples` caps the examples seen per epoch (seeded subset,
    `drawn_examples`). With `teacher` (cached targets for every drawn example, see `compressor.distill`) the loss
    mixes the task loss with distillation; the examples and their order are exactly those of plain fine-tuning.
    """
    if teacher is not None:
        train_ds = with_index(train_ds)
    if (drawn := drawn_examples(len(train_ds), spec.max_examples, seed)) is not None:
        train_ds = train_ds.select(drawn)
    dl = loader(train_ds, tokenizer, spec.batch_size, shuffle=True, seed=seed, by_length=spec.group_by_length)
    per_epoch = math.ceil(len(dl) / accelerator.num_processes)
    total = max(1, math.ceil(per_epoch * spec.epochs))
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
            "weight_decay": spec.weight_decay,
        },
        {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=spec.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(spec.warmup_ratio * total), total)
    wrapped, optimizer, dl, scheduler = accelerator.prepare(model, optimizer, dl, scheduler)
    wrapped.train()
    start, step, running = time.perf_counter(), 0, 0.0
    bar = tqdm(total=total, desc=desc, disable=not accelerator.is_local_main_process, leave=False)
    with gated(model, gates, neurons):
        while step < total:
            for batch in dl:
                loss = mixed_loss(wrapped, model_inputs(batch), batch, teacher)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                step += 1
                running += loss.item()
                bar.update(1)
                bar.set_postfix(loss=f"{running / step:.4f}")
                if step >= total:
                    break
    bar.close()
    wrapped.eval()
    model.eval()
    accelerator.free_memory()
    stats = {"steps": step, "train_loss": running / max(step, 1), "seconds": time.perf_counter() - start}
    return {**stats, "distill": teacher.spec.model_dump()} if teacher is not None else stats


@torch.inference_mode()
def predict(
    model: nn.Module,
    eval_ds: datasets.Dataset,
    tokenizer,
    accelerator: Accelerator | None = None,
    gates: torch.Tensor | None = None,
    batch_size: int = 64,
    neurons: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) for the whole split, in its order; under several processes, gathered on every process.

    The split is run sorted by length (so batches pad little: ~1.9x fewer tokens on Rotten Tomatoes) and the
    results are put back in the split's order."""
    model.eval()
    order = np.argsort(lengths(eval_ds), kind="stable")
    dl = loader(eval_ds.select(order), tokenizer, batch_size)
    if accelerator is not None:
        dl = accelerator.prepare_data_loader(dl)
    device = next(model.parameters()).device
    logits, labels = [], []
    with gated(model, gates, neurons):
        for batch in dl:
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
    from compressor.metrics import load_metric

    logits, labels = predict(model, eval_ds, tokenizer, accelerator, gates, neurons=neurons)
    preds = logits.argmax(-1)
    acc = load_metric("accuracy").compute(predictions=preds.tolist(), references=labels.tolist())["accuracy"]
    return {"accuracy": float(acc), "loss": float(F.cross_entropy(logits, labels)), "n": int(labels.numel())}


def sample_batches(
    ds: datasets.Dataset,
    tokenizer,
    n: int,
    batch_size: int,
    seed: int,
    accelerator: Accelerator | None = None,
    by_length: bool = False,
) -> list[dict]:
    """A fixed, seeded sample of `n` examples as padded batches (each process gets its shard under DDP); with
    `by_length`, batches of similar length in a seeded order (`LengthGroupedBatches`), where no consumer needs
    the batches to mix lengths (the int8 gate does: it must see batches like the ones served)."""
    if len(ds) > n:
        ds = ds.shuffle(seed=seed).select(range(n))
    dl = loader(ds, tokenizer, batch_size, shuffle=by_length, seed=seed, by_length=by_length)
    if accelerator is not None and accelerator.num_processes > 1:
        dl = accelerator.prepare_data_loader(dl)
    return list(dl)
