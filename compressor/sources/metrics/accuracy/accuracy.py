"""Accuracy as an `evaluate` metric module, shipped with compressor so nothing is fetched from the hub."""

import evaluate

from compressor.sources.metrics import label_metric_info

_DESCRIPTION = "Accuracy: the proportion of predictions equal to the references."
_KWARGS_DESCRIPTION = "predictions: list of int; references: list of int; normalize: bool; sample_weight: list of float"


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return label_metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION)

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        total = 0.0
        weight_sum = 0.0
        for i, (p, r) in enumerate(zip(predictions, references, strict=True)):
            w = 1.0 if sample_weight is None else float(sample_weight[i])
            total += w * (p == r)
            weight_sum += w
        return {"accuracy": float(total / weight_sum if normalize else total)}
