"""Sources, the first stage: models, tokenizers and datasets from hub names, local paths and the built-in offline
defaults (`models`, `data`), their fingerprints for caching (`fingerprint`), the model-input contract, tokenisation
and batching (`batches`), and the shipped metric modules (`metrics`).

May import `core`, `recipe` and `surgery` (a model compressor saved earlier loads through `surgery.checkpoint`).
The names below load lazily, so a light import (`sources.batches`'s contract) does not pull in every loader.
"""

from __future__ import annotations

from compressor.core.lazy import lazy_attributes

__all__ = ["TaskData", "load_task_data", "load_model", "load_tokenizer", "resolve_model_path"]
_LAZY = {
    "TaskData": "compressor.sources.data",
    "load_task_data": "compressor.sources.data",
    "load_model": "compressor.sources.models",
    "load_tokenizer": "compressor.sources.models",
    "resolve_model_path": "compressor.sources.models",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
