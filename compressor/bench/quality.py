"""Quality on the same examples for every candidate: accuracy with a Wilson interval, agreement, and the paired
comparison with the reference (exact McNemar test, interval for the accuracy difference)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

from compressor.bench.candidates import Batch, Candidate, check_names
from compressor.core.errors import UserError
from compressor.sources.batches import model_inputs


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


def collect_logits(candidate: Candidate, batches: Sequence[Batch]) -> np.ndarray:
    return np.concatenate([np.asarray(candidate.predict(model_inputs(b)), dtype=np.float32) for b in batches])


def measure_quality(candidates: Sequence[Candidate], batches: Sequence[Batch], reference: str) -> dict:
    """Accuracy (95% Wilson CI) of every candidate on the same batches, and paired comparison with `reference`.

    Batches are tokenised dicts with `labels` (without labels only agreement and logit differences are reported).
    Per candidate: accuracy, interval, agreement with the reference's predictions, max |Δlogit|, exact McNemar
    p-value and a 95% interval for the accuracy difference.
    """
    from compressor.sources.metrics import load_metric

    check_names(candidates)
    names = [c.name for c in candidates]
    if reference not in names:
        raise UserError(f"bench: reference '{reference}' is not among the candidates {names}")
    if not batches:
        raise UserError("bench: no evaluation batches (expected at least one tokenised batch)")
    has_labels = all("labels" in b for b in batches)
    labels = np.concatenate([b["labels"].numpy() for b in batches]) if has_labels else None
    logits = {c.name: collect_logits(c, batches) for c in candidates}
    preds = {name: x.argmax(-1) for name, x in logits.items()}
    n = int(len(preds[reference]))
    metric = load_metric("accuracy")
    out: dict[str, dict] = {}
    for c in candidates:
        p = preds[c.name]
        row: dict = {
            "n": n,
            "agreement": float(np.mean(p == preds[reference])),
            "max_abs_logit_diff": float(np.max(np.abs(logits[c.name] - logits[reference]))),
        }
        if labels is not None:
            correct = int(np.sum(p == labels))
            acc = metric.compute(predictions=p.tolist(), references=labels.tolist())["accuracy"]
            low, high = wilson_interval(correct, n)
            test = mcnemar_exact(p == labels, preds[reference] == labels)
            better, worse = test["candidate_only_correct"], test["reference_only_correct"]
            d_low, d_high = paired_difference_interval(better, worse, n)
            row |= {
                "accuracy": float(acc),
                "accuracy_ci95": [low, high],
                "accuracy_delta": float(acc) - float(np.mean(preds[reference] == labels)),
                "accuracy_delta_ci95": [d_low, d_high],
                "mcnemar": test,
            }
        out[c.name] = row
    return {"reference": reference, "n": n, "has_labels": has_labels, "results": out}
