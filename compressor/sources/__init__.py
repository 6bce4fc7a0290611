"""Model and dataset loading: hub names, local paths, and the built-in offline defaults."""

from compressor.sources.data import TaskData, load_task_data
from compressor.sources.models import load_model, load_tokenizer, resolve_model_path

__all__ = ["TaskData", "load_task_data", "load_model", "load_tokenizer", "resolve_model_path"]
