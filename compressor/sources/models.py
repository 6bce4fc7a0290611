"""Models and tokenizers: the built-in MiniLM-L6, a local directory, or a hub id, through the same code path.

The architecture is checked from the config alone (before any weights load), so unsupported models are refused
early with their name. Directories written by compressor (with a pruning plan) load through `load_pruned`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils import logging as hf_logging

from compressor.core.errors import UserError
from compressor.recipe import ModelSpec, RecipeError
from compressor.sources.builtins import builtin_path
from compressor.surgery.arch import UnsupportedArchitectureError, arch_spec, declared, supported_attention
from compressor.surgery.checkpoint import PLAN_FILE, WEIGHTS_FILE, WEIGHTS_INDEX, load_pruned


def resolve_model_path(spec: ModelSpec) -> str:
    """Turn `model.source` into something `from_pretrained` takes (a directory or a hub id)."""
    if spec.source.startswith("builtin:"):
        return str(builtin_path(spec.source))
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
    spec = declared(getattr(config, "model_type", ""))
    return limit - (spec.reserved_positions(config) if spec is not None else 0)


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
        f"{WEIGHTS_INDEX} (pickle .bin checkpoints are not loaded, for safety: re-save with save_pretrained)"
    )


def check_task_head(spec: ModelSpec, config) -> None:
    """A task-tuned model must bring every weight of its sequence classifier (the pooler and classifier of BERT,
    the classification head of RoBERTa, ...). A token-classification, question-answering or masked-LM checkpoint
    with the right label count would otherwise load with a freshly initialised head, run to the end and report
    chance accuracy. Reads only the weight names (safetensors headers), before any weights load; a hub model whose
    names cannot be read here is checked by `load_model` when it loads (still a one-line error)."""
    if not spec.task_tuned:
        return
    source = resolve_model_path(spec)
    if (Path(source) / PLAN_FILE).exists():
        return  # compressor's own output: `load_pruned` loads it strictly
    names = _local_weight_names(spec, Path(source)) if Path(source).is_dir() else _hub_weight_names(spec)
    if names is None:
        return
    with torch.device("meta"):  # the classifier `config` describes: names and shapes, no memory, no weights
        skeleton = AutoModelForSequenceClassification.from_config(config, trust_remote_code=spec.trust_remote_code)
    missing = _needed_weights(skeleton) - _as_loaded(names, skeleton.base_model_prefix)
    if missing:
        raise UserError(_missing_head_message(config, missing))


def check_sequence_classifier(model: nn.Module, field: str = "model") -> None:
    """Refuse, in one line, a model that is not a sequence classifier (a token-classification, question-answering or
    bare encoder model would otherwise fail deep inside the first loss). The one home of this check: the sources
    pass every loaded model through it and `compressor.prune` every model it is given."""
    config = getattr(model, "config", None)
    name = type(model).__name__
    if config is None:
        raise UserError(f"{field}: a {name} has no transformers config; expected a sequence classifier")
    try:
        expected = AutoModelForSequenceClassification._model_mapping[type(config)]
    except KeyError:  # remote code or a config transformers does not map: its class name is all there is to read
        expected = None
    if isinstance(model, expected) if expected is not None else name.endswith("ForSequenceClassification"):
        return
    want = expected.__name__ if expected is not None else "a *ForSequenceClassification model"
    raise UserError(
        f"{field}: {name} is not a sequence classifier; expected {want} (AutoModelForSequenceClassification)"
    )


def _needed_weights(model: nn.Module) -> set[str]:
    """Every weight name the sequence classifier loads, less those transformers may leave out on purpose."""
    optional = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or []]
    return {name for name in model.state_dict() if not any(p.search(name) for p in optional)}


def _as_loaded(names: set[str], prefix: str) -> set[str]:
    """Checkpoint weight names as transformers maps them onto the classifier: legacy LayerNorm `gamma`/`beta`
    renamed, and a bare encoder's names (saved without a head) under the model's `prefix`."""
    names = {re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", n)) for n in names}
    if any(n.startswith(f"{prefix}.") for n in names):
        return names
    return {f"{prefix}.{n}" for n in names}


def _missing_head_message(config, missing: set[str] | list[str]) -> str:
    """One line naming the head the checkpoint has (from its config's `architectures`) and the weights it lacks."""
    names = sorted(missing)
    listed = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
    other = [a for a in getattr(config, "architectures", None) or [] if not a.endswith("ForSequenceClassification")]
    what = f"is a {other[0]} (its weights lack {listed})" if other else f"lacks the classifier weights {listed}"
    return (
        f"model.source: the checkpoint {what}; expected a sequence-classification model for task_tuned: true "
        "(task_tuned: false trains a new classifier)"
    )


def _local_weight_names(spec: ModelSpec, path: Path) -> set[str]:
    """The weight names in a local model directory's safetensors index or file header (no tensor is read)."""
    from safetensors import safe_open

    try:
        if (path / WEIGHTS_INDEX).is_file():
            return set(json.loads((path / WEIGHTS_INDEX).read_text())["weight_map"])
        with safe_open(str(path / WEIGHTS_FILE), "pt") as weights:
            return set(weights.keys())
    except Exception as err:  # a truncated file, a broken index: the load would fail the same way, later
        raise UserError(
            f"model.source: cannot read the weight names of '{spec.source}' ({type(err).__name__}); expected "
            f"readable {WEIGHTS_FILE} or {WEIGHTS_INDEX}"
        ) from None


def _hub_weight_names(spec: ModelSpec) -> set[str] | None:
    """The weight names of a hub model from its safetensors headers (a few kilobytes, or the local cache), or
    None when they cannot be read here (offline and not cached, no safetensors)."""
    from huggingface_hub import get_safetensors_metadata, try_to_load_from_cache

    for name in (WEIGHTS_INDEX, WEIGHTS_FILE):
        cached = try_to_load_from_cache(spec.source, name, revision=spec.revision)
        if isinstance(cached, str):
            return _local_weight_names(spec, Path(cached).parent)
    try:
        return set(get_safetensors_metadata(spec.source, revision=spec.revision).weight_map)
    except Exception:  # offline, gated, no safetensors: `load_model` checks what actually loaded
        return None


def model_labels(config) -> list[str]:
    """The label names of the classifier `config` describes, in id order."""
    return [config.id2label[i] for i in range(config.num_labels)]


def labels_match(config, label_names: list[str]) -> bool:
    """Whether the classifier `config` describes has the label set `label_names`: as many labels, and the same
    names in the same order (case aside) unless one side's are placeholders (`LABEL_0`, ... or bare numbers)."""
    if config.num_labels != len(label_names):
        return False
    names = model_labels(config)
    generic = all(n.startswith("LABEL_") for n in names) or all(n.isdigit() for n in label_names)
    return generic or [n.lower() for n in names] == [n.lower() for n in label_names]


PRETRAINING_HEADS = ("Model", "ForMaskedLM", "ForPreTraining")  # `architectures` suffixes with no task head


def foreign_head(config, label_names: list[str]) -> str | None:
    """Why a checkpoint cannot be fine-tuned as a classifier of `label_names` without discarding a task it was
    trained for (a token-classification, question-answering, ... head, or a sequence classifier or label map of
    another label set), or None when it can: a bare or pretraining checkpoint, or a classifier of these labels.
    Reads the config only."""
    heads = list(getattr(config, "architectures", None) or [])
    other = [a for a in heads if not a.endswith(("ForSequenceClassification", *PRETRAINING_HEADS))]
    if other:
        return f"is a {other[0]} (another task head)"
    classifier = any(a.endswith("ForSequenceClassification") for a in heads)
    real_names = not all(n.startswith("LABEL_") for n in model_labels(config))
    if (classifier or real_names) and not labels_match(config, label_names):
        return f"has {config.num_labels} labels {model_labels(config)[:6]} where the task has {label_names[:6]}"
    return None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "*.model")


def load_tokenizer(spec: ModelSpec):
    """The model's tokenizer; a local directory without tokenizer files is refused (transformers 5 would build an
    empty-vocabulary tokenizer for it and map every word to [UNK])."""
    source = resolve_model_path(spec)
    if Path(source).is_dir() and not any(any(Path(source).glob(name)) for name in TOKENIZER_FILES):
        raise UserError(
            f"model.source: cannot load a tokenizer from '{spec.source}' (no tokenizer files); expected "
            "tokenizer.json or vocab files with tokenizer_config.json in the directory"
        )
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

    Base models get a fresh classifier head; task-tuned ones keep theirs (the runner checks the label set first),
    and one whose checkpoint lacks a weight of that head is refused (`check_task_head` catches it earlier where the
    weight names can be read). Weights load from safetensors only (no pickle); remote code only when the recipe
    enables it. Always in float32, whatever the checkpoint stores: fine-tunes keep fp32 master weights (mixed
    precision is autocast over them), and scoring, surgery parity and export compare in fp32.
    """
    config = load_config(spec)
    source = resolve_model_path(spec)
    attention = supported_attention(config.model_type, attention)  # eager for architectures without SDPA
    if (Path(source) / PLAN_FILE).exists():
        model = load_pruned(source, attn_implementation=attention)
        check_sequence_classifier(model, "model.source")
        return model
    kwargs = {}
    if not spec.task_tuned:  # a fresh head for our labels
        kwargs = {"num_labels": len(label_names) if label_names else config.num_labels, "ignore_mismatched_sizes": True}
        if label_names:
            kwargs["id2label"] = dict(enumerate(label_names))
            kwargs["label2id"] = {name: i for i, name in enumerate(label_names)}
    previous = hf_logging.get_verbosity()
    if spec.task_tuned:  # a missing weight is refused below in one line; transformers' warning would only repeat it
        hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            source,
            revision=spec.revision,
            trust_remote_code=spec.trust_remote_code,
            attn_implementation=attention,
            dtype=torch.float32,  # transformers 5 keeps a half-precision checkpoint's dtype; we train and export fp32
            use_safetensors=True,
            output_loading_info=True,
            **kwargs,
        )
    finally:
        hf_logging.set_verbosity(previous)
    if spec.task_tuned and info["missing_keys"]:  # never a silently re-initialised head on a "task-tuned" model
        raise UserError(_missing_head_message(config, info["missing_keys"]))
    check_sequence_classifier(model, "model.source")
    return model
