"""Quality on the same examples for every candidate: accuracy with a Wilson interval, agreement, and the paired
comparison with the reference (exact McNemar test, interval for the accuracy difference)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import datasets
import numpy as np
from scipy import stats
from torch import nn
from tqdm.auto import tqdm

from compressor.bench.candidates import Batch, Candidate, check_names
from compressor.core.errors import UserError
from compressor.recovery.evaluate import predict
from compressor.sources.batches import in_sample_order, model_inputs

log = logging.getLogger("compressor")


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (scipy's implementation)."""
    if n == 0:
        return (float("nan"), float("nan"))
    ci = stats.binomtest(correct, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def mcnemar_exact(candidate_correct: np.ndarray, reference_correct: np.ndarray) -> dict:
    """Exact McNemar test: under H0 the discordant pairs split 50/50 (two-sided binomial test)."""
    better = int(np.sum(candidate_correct & ~reference_correct))
    worse = int(np.sum(~candidate_correct & reference_correct))
    p = 1.0 if better + worse == 0 else float(stats.binomtest(better, better + worse, 0.5).pvalue)
    return {"candidate_only_correct": better, "reference_only_correct": worse, "p_value": p}


def paired_difference_interval(better: int, worse: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Normal-approximation interval for accuracy(candidate) − accuracy(reference) on the same n examples."""
    if n == 0:
        return (float("nan"), float("nan"))
    diff = (better - worse) / n
    var = ((better + worse) - (better - worse) ** 2 / n) / n**2
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    half = z * max(var, 0.0) ** 0.5
    return diff - half, diff + half


def hits_string(correct: np.ndarray) -> str:
    """Per-example correctness as a string of "0"/"1", one character per example in the bench's order: what a
    repeat over seeds needs to resample test examples (`compressor.report.seeds`), small in JSON."""
    return "".join("1" if c else "0" for c in np.asarray(correct, dtype=bool).tolist())


def read_hits(hits: str) -> np.ndarray:
    """The boolean vector `hits_string` wrote."""
    return np.frombuffer(hits.encode("ascii"), dtype=np.uint8) == ord("1")


def collect_logits(candidate: Candidate, batches: Sequence[Batch]) -> np.ndarray:
    """The candidate's logits on `batches`, one row per example in the sample's order (`in_sample_order`)."""
    logits = [np.asarray(candidate.predict(model_inputs(b)), dtype=np.float32) for b in batches]
    return in_sample_order(batches, np.concatenate(logits))


def _labels(batches: Sequence[Batch]) -> np.ndarray:
    return in_sample_order(batches, np.concatenate([b["labels"].numpy() for b in batches]))


def _own_batches(c: Candidate, batches: Sequence[Batch], labels: np.ndarray | None) -> Sequence[Batch]:
    """The batches `c` is evaluated on: its own (another tokenizer) when it has them, checked to hold the same
    examples' labels in the same order as the bench's, else the bench's."""
    if c.eval_batches is None:
        return batches
    same = labels is None or np.array_equal(_labels(c.eval_batches), labels)
    if not c.eval_batches or not same:
        raise UserError(
            f"bench: candidate '{c.name}' brings evaluation batches of other examples than the bench's; expected "
            "its own tokenisation of the same examples in the same order"
        )
    return c.eval_batches


def paired_comparison(candidate_correct: np.ndarray, reference_correct: np.ndarray) -> dict:
    """Accuracy difference of two models on the same examples, its 95% interval and the exact McNemar test."""
    test = mcnemar_exact(candidate_correct, reference_correct)
    n = len(candidate_correct)
    better, worse = test["candidate_only_correct"], test["reference_only_correct"]
    low, high = paired_difference_interval(better, worse, n)
    delta = float(np.mean(candidate_correct) - np.mean(reference_correct)) if n else float("nan")
    return {"accuracy_delta": delta, "accuracy_delta_ci95": [low, high], "mcnemar": test}


def measure_quality(
    candidates: Sequence[Candidate],
    batches: Sequence[Batch],
    reference: str,
    compare: Sequence[tuple[str, str]] = (),
    keep_hits: bool = True,
) -> dict:
    """Accuracy (95% Wilson CI) of every candidate on the same examples, and paired comparison with `reference`.

    Batches are tokenised dicts with `labels` (without labels only agreement and logit differences are reported);
    a candidate with its own `eval_batches` (another tokenizer) is evaluated on those, the same examples.
    Per candidate: accuracy, interval, agreement with the reference's predictions, max |Δlogit| (None where the
    tokenisations differ), exact McNemar p-value and a 95% interval for the accuracy difference. `compare`: further
    (candidate, versus) pairs compared the same way, under "pairs". With labels and `keep_hits`, each row also
    keeps which examples it got right (`hits`, `hits_string`), so runs repeated over seeds can be compared example by
    example.
    """
    from compressor.sources.metrics import load_metric

    check_names(candidates)
    names = [c.name for c in candidates]
    if reference not in names:
        raise UserError(f"bench: reference '{reference}' is not among the candidates {names}")
    if not batches:
        raise UserError("bench: no evaluation batches (expected at least one tokenised batch)")
    has_labels = all("labels" in b for b in batches)
    labels = _labels(batches) if has_labels else None
    examples = sum(len(next(iter(b.values()))) for b in batches)
    log.info("bench: predictions of %d candidates on %d examples", len(candidates), examples)  # minutes on a family
    logits = {
        c.name: collect_logits(c, _own_batches(c, batches, labels))
        for c in tqdm(candidates, desc="bench predictions", leave=False)
    }
    preds = {name: x.argmax(-1) for name, x in logits.items()}
    n = int(len(preds[reference]))
    metric = load_metric("accuracy")
    own = {c.name for c in candidates if c.eval_batches is not None}
    out: dict[str, dict] = {}
    for c in candidates:
        p = preds[c.name]
        comparable = (c.name in own) == (reference in own) and logits[c.name].shape == logits[reference].shape
        row: dict = {
            "n": n,
            "agreement": float(np.mean(p == preds[reference])),
            "max_abs_logit_diff": float(np.max(np.abs(logits[c.name] - logits[reference]))) if comparable else None,
        }
        if labels is not None:
            correct = int(np.sum(p == labels))
            acc = metric.compute(predictions=p.tolist(), references=labels.tolist())["accuracy"]
            low, high = wilson_interval(correct, n)
            row |= {"accuracy": float(acc), "accuracy_ci95": [low, high]}
            row |= paired_comparison(p == labels, preds[reference] == labels)
            row |= {"hits": hits_string(p == labels)} if keep_hits else {}
        out[c.name] = row
    pairs = []
    for a, b in compare if labels is not None else ():
        pairs.append({"candidate": a, "versus": b, **paired_comparison(preds[a] == labels, preds[b] == labels)})
    return {"reference": reference, "n": n, "has_labels": has_labels, "results": out, "pairs": pairs}


def compare_on(baseline: nn.Module, pruned: nn.Module, test: datasets.Dataset, tokenizer) -> dict:
    """Test accuracy of both models, the difference (pruned − baseline) and McNemar's exact test on the pairs."""
    logits_b, labels = predict(baseline, test, tokenizer)
    logits_p, _ = predict(pruned, test, tokenizer)
    right_b = (logits_b.argmax(-1) == labels).numpy()
    right_p = (logits_p.argmax(-1) == labels).numpy()
    test_result = mcnemar_exact(right_p, right_b)
    return {
        "baseline_accuracy": float(np.mean(right_b)),
        "pruned_accuracy": float(np.mean(right_p)),
        "pruned_minus_baseline": float(np.mean(right_p) - np.mean(right_b)),
        "mcnemar": test_result,
        "mcnemar_p": test_result["p_value"],
        "n": int(labels.numel()),
    }
