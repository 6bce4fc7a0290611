"""F1 as an `evaluate` metric module, shipped with compressor so nothing is fetched from the hub.

Same interface as the hub's `f1` module (scikit-learn's `f1_score` underneath).
"""

import evaluate
import numpy as np
from sklearn.metrics import f1_score

from compressor.sources.metrics import label_metric_info

_DESCRIPTION = "F1: the harmonic mean of precision and recall, F1 = 2 * (precision * recall) / (precision + recall)."
_KWARGS_DESCRIPTION = (
    "predictions: list of int; references: list of int; labels: list of int; pos_label: int; "
    "average: 'binary' | 'micro' | 'macro' | 'weighted' | None; sample_weight: list of float"
)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class F1(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return label_metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION)

    def _compute(self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None):
        score = f1_score(
            references, predictions, labels=labels, pos_label=pos_label, average=average, sample_weight=sample_weight
        )
        score = np.asarray(score)
        return {"f1": float(score) if score.ndim == 0 else score.tolist()}
