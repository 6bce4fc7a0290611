"""Saving and loading pruned models.

A saved directory is a normal transformers model directory: safetensors weights, tokenizer files and the *original*
`config.json`, plus what a pruned model needs to be rebuilt anywhere:

- `compressor_layout` in `config.json`: the architecture's module paths (under the key `family`, which saved models
  carry) and, per layer, the heads and FFN neurons left or that the layer was removed (transformers 5 has no config
  field for per-layer shapes);
- `modeling_compressor.py` (a copy of `surgery.portable`) and an `auto_map` entry, so plain transformers loads it
  with `AutoModelForSequenceClassification.from_pretrained(dir, trust_remote_code=True)`, no compressor install;
- our bookkeeping in `config.json` (`pruned_heads`, `pruned_neurons`, `removed_layers`, original ids) and
  `compressor_plan.json`, the replayable plan, plus a `README.md` model card when the original model is given.

`load_pruned` rebuilds the original architecture from the config, gives it the plan's shapes with the same
`apply_layout` the shipped file uses, and loads the weights strictly. It also reads directories written by
compressor under transformers 4.57 (no layout; a uniform FFN width may stand in the config as
`intermediate_size` with the original under `compressor_ffn_size`). An unpruned model is saved as a plain directory.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification
from transformers.utils import logging as hf_logging

from compressor.core import atomic
from compressor.surgery import portable
from compressor.surgery.arch import (
    arch_spec,
    head_size,
    original_ffn_size,
    original_num_heads,
    present_heads,
    present_hidden,
    present_neurons,
    pruned_heads,
    pruned_hidden,
    pruned_neurons,
    removed_layers,
    supported_attention,
)
from compressor.surgery.cost import model_stats
from compressor.surgery.portable import LAYOUT_KEY, LAYOUT_VERSION, apply_layout
from compressor.surgery.slicing import empty_layers

log = logging.getLogger(__name__)
hf_logging.disable_progress_bar()  # transformers 5 draws a bar per weight load and save; a run's progress is ours

PLAN_FILE = "compressor_plan.json"
CARD_FILE = "README.md"
PLAN_FORMAT = 2  # 2 adds pruned_neurons, removed_layers and ffn_size (format 1 files still load)
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
REMOTE_MODULE = "modeling_compressor"  # the shipped copy of surgery.portable


def save_pruned(
    model: nn.Module,
    out_dir: str | Path,
    tokenizer=None,
    metadata: dict | None = None,
    original: nn.Module | None = None,
    seq_len: int = 128,
) -> Path:
    """Write `model` (and `tokenizer`) to `out_dir` atomically: a sibling temp dir, renamed when complete.

    With `original` (the unpruned model) a README.md model card with parameters, encoder FLOPs per example at
    `seq_len` tokens and heads per layer before/after is written too, and the same numbers go into the plan file
    under "stats". Unsupported architectures are refused before anything is written.
    """
    plan = {
        "format": PLAN_FORMAT,
        "model_type": model.config.model_type,
        "pruned_heads": {str(k): v for k, v in pruned_heads(model).items()},
        "empty_layers": empty_layers(model),
        "pruned_neurons": {str(k): v for k, v in pruned_neurons(model).items()},
        "removed_layers": removed_layers(model),
        "pruned_hidden": pruned_hidden(model),
        "ffn_size": original_ffn_size(model),
        "metadata": metadata or {},
    }
    with atomic.directory(out_dir) as tmp:
        _save_weights_and_config(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if original is not None:
            plan["stats"] = write_model_card(tmp, original, model, seq_len, metadata)
        (tmp / PLAN_FILE).write_text(json.dumps(plan, indent=2))
    return Path(out_dir)


def uniform_ffn_width(model: nn.Module) -> int | None:
    """The FFN width shared by every layer of `model` (None when widths differ or a layer was removed)."""
    widths = {len(n) for n in present_neurons(model)}
    return widths.pop() if len(widths) == 1 and not removed_layers(model) else None


def layout(model: nn.Module) -> dict:
    """The `compressor_layout` of `model`: its architecture's paths, original sizes, per-layer heads / neurons left."""
    gone = set(removed_layers(model))
    units = enumerate(zip(present_heads(model), present_neurons(model), strict=True))
    out = {
        "version": LAYOUT_VERSION,
        "family": arch_spec(model).portable(),  # the architecture's paths; the key is what saved models carry
        "head_size": head_size(model),
        "num_heads": original_num_heads(model),
        "ffn_size": original_ffn_size(model),
        "blocks": [{"removed": True} if i in gone else {"heads": len(h), "ffn": len(n)} for i, (h, n) in units],
    }
    if pruned_hidden(model):  # only where the stream was cut, so other layouts stay as they were
        out["hidden"] = len(present_hidden(model))
    return out


def is_pruned(model: nn.Module) -> bool:
    """Whether any unit was removed (a plain transformers directory is enough otherwise)."""
    return bool(pruned_heads(model) or pruned_neurons(model) or removed_layers(model) or pruned_hidden(model))


def _stock_class(model: nn.Module) -> type:
    """The transformers class `model` is (or derives from, when it was loaded through the shipped code)."""
    return next(c for c in type(model).__mro__ if c.__module__.startswith("transformers."))


def _save_weights_and_config(model: nn.Module, out_dir: Path) -> None:
    """`save_pretrained` with the layout, `auto_map` and `modeling_compressor.py` of a pruned model; the in-memory
    config is left as it was."""
    cfg = model.config
    if not is_pruned(model):
        model.save_pretrained(out_dir)
        return
    base = _stock_class(model).__name__
    cfg.compressor_layout = layout(model)
    cfg.auto_map = {"AutoModelForSequenceClassification": f"{REMOTE_MODULE}.Pruned{base}"}
    try:
        model.save_pretrained(out_dir)
    finally:
        del cfg.compressor_layout, cfg.auto_map
    source = Path(portable.__file__).read_text()
    footer = f'\n\nPruned{base} = pruned_class("{base}")\n'
    (out_dir / f"{REMOTE_MODULE}.py").write_text(source + footer)


def _fmt(n: int) -> str:
    """`22.71 M (22,713,986)` for counts of 10,000 and more, the plain number otherwise."""
    if abs(n) < 10_000:
        return f"{n:,}"
    unit, scale = next((u, k) for u, k in (("G", 1e9), ("M", 1e6), ("k", 1e3)) if abs(n) >= k)
    return f"{n / scale:,.2f} {unit} ({n:,})"


def render_model_card(stats: dict, model_type: str, metadata: dict | None = None) -> str:
    """Markdown model card for the numbers of `model_stats` (pure, so reports can embed it too)."""
    before, after, t = stats["original"], stats["pruned"], stats["seq_len"]
    removed = stats["heads_total"] - after["heads"]
    rows = [
        ("parameters", before["parameters"], after["parameters"]),
        (f"encoder FLOPs per example (T={t})", before["encoder_flops_per_example"], after["encoder_flops_per_example"]),
        ("attention heads", before["heads"], after["heads"]),
        ("FFN neurons", before.get("ffn_neurons", 0), after.get("ffn_neurons", 0)),
        ("layers", before.get("layers", 0), after.get("layers", 0)),
    ]
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-classification",
        "tags: [pruned, attention-head-pruning, compressor]",
        "---",
        "",
        f"# {model_type} classifier with {removed} of {stats['heads_total']} attention heads removed",
        "",
        "Heads were removed physically (Q/K/V rows and output-projection columns sliced), not masked.",
        "",
        "## Cost per example",
        "",
        "| | original | pruned | original / pruned |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {_fmt(a)} | {_fmt(b)} | {a / max(b, 1):.2f}× |" for name, a, b in rows),
        "",
        "Encoder FLOPs = 2 × multiply-accumulates of the transformer layers' matrix products (Q/K/V/O projections,",
        "attention scores and weighted values, feed-forward) for one sequence of T tokens; embeddings, LayerNorm and",
        "the classifier head are not counted. Measured speed-ups are in the run report.",
        "",
        "## Heads left per layer",
        "",
        "| layer | heads left | removed (original ids) |",
        "|---:|---:|---|",
    ]
    for layer, (n_before, n_after) in enumerate(zip(before["heads_per_layer"], after["heads_per_layer"], strict=True)):
        ids = stats["pruned_heads"].get(str(layer), [])
        lines.append(f"| {layer} | {n_after} / {n_before} | {', '.join(map(str, ids)) or '—'} |")
    lines += _loading_section(bool(stats["pruned_heads"] or stats.get("pruned_neurons") or stats.get("removed_layers")))
    if metadata:
        lines += ["", "## Metadata", ""] + [f"- {k}: {v}" for k, v in metadata.items()]
    return "\n".join(lines) + "\n"


def _loading_section(pruned: bool) -> list[str]:
    """How to load the directory: plain transformers (with the shipped code when pruned) or compressor."""
    if not pruned:
        return ["", "## Loading", "", "A plain transformers directory (`AutoModelForSequenceClassification`)."]
    return [
        "",
        "## Loading",
        "",
        "Layers keep different numbers of heads and FFN neurons, which a transformers config cannot describe: the",
        f"directory ships `{REMOTE_MODULE}.py` (it imports only torch and transformers) to rebuild those shapes.",
        "",
        "```python",
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
        "",
        'model = AutoModelForSequenceClassification.from_pretrained("<dir>", trust_remote_code=True)',
        'tokenizer = AutoTokenizer.from_pretrained("<dir>")',
        "```",
        "",
        'With compressor installed, `compressor.load_pruned("<dir>")` gives the same model without remote code.',
        "Without `trust_remote_code=True`, transformers refuses the checkpoint with a size-mismatch error.",
    ]


def write_model_card(
    out_dir: str | Path, original: nn.Module, pruned: nn.Module, seq_len: int, metadata: dict | None = None
) -> dict:
    """Write README.md in `out_dir` stating parameters, encoder FLOPs per example and heads before/after.

    Returns the `model_stats` dict the card was rendered from (for run reports).
    """
    stats = model_stats(original, pruned, seq_len)
    (Path(out_dir) / CARD_FILE).write_text(render_model_card(stats, pruned.config.model_type, metadata))
    return stats


def read_plan(model_dir: str | Path) -> dict[int, list[int]]:
    """The cumulative head plan stored with a saved model ({} for an unpruned directory)."""
    return read_unit_plan(model_dir)["heads"]


def read_unit_plan(model_dir: str | Path) -> dict:
    """The cumulative plan of every unit kind: {"heads": {layer: ids}, "neurons": {layer: ids}, "layers": [ids],
    "ffn_size": original FFN width or None}. Format-1 plan files and plain directories have no neurons or layers.
    """
    path = Path(model_dir) / PLAN_FILE
    if path.exists():
        data = json.loads(path.read_text())
    else:
        config = AutoConfig.from_pretrained(model_dir)
        data = {  # a pruned model re-saved by plain transformers: its config still carries every unit kind
            "pruned_heads": getattr(config, "pruned_heads", None) or {},
            "pruned_neurons": getattr(config, "pruned_neurons", {}),
            "removed_layers": getattr(config, "removed_layers", []),
            "pruned_hidden": getattr(config, "pruned_hidden", []),
            "ffn_size": getattr(config, "compressor_ffn_size", None),
        }
    return {
        "heads": {int(k): v for k, v in data["pruned_heads"].items()},
        "neurons": {int(k): v for k, v in (data.get("pruned_neurons") or {}).items()},
        "layers": [int(i) for i in data.get("removed_layers") or []],
        "hidden": sorted(int(i) for i in data.get("pruned_hidden") or []),
        "ffn_size": data.get("ffn_size"),
    }


LEGACY_NAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def current_name(key: str) -> str:
    """`key` with a LayerNorm's legacy parameter name (`gamma`, `beta`) in today's (`weight`, `bias`), as
    transformers renames them on load: older checkpoints carry them, and transformers 5.5's `save_pretrained`
    writes them back."""
    for old, new in LEGACY_NAMES.items():
        if key.endswith(old):
            return key[: -len(old)] + new
    return key


def _read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """The state dict from `model.safetensors` or a sharded `model.safetensors.index.json`, under today's names."""
    if (model_dir / WEIGHTS_FILE).exists():
        files = [model_dir / WEIGHTS_FILE]
    elif (model_dir / WEIGHTS_INDEX).exists():
        shards = sorted(set(json.loads((model_dir / WEIGHTS_INDEX).read_text())["weight_map"].values()))
        files = [model_dir / shard for shard in shards]
    else:
        raise FileNotFoundError(f"{model_dir}: no {WEIGHTS_FILE} (expected a directory written by save_pruned)")
    return {current_name(k): v for file in files for k, v in load_file(str(file)).items()}


def _build(config, attn_implementation: str, dtype: torch.dtype) -> nn.Module:
    """The unpruned classifier for `config`; eager where SDPA is asked for and the architecture has none (DeBERTa-v2,
    MPNet: `ArchSpec.sdpa`)."""
    implementation = supported_attention(config.model_type, attn_implementation)
    if implementation != attn_implementation:
        log.info("%s has no SDPA attention; loading with eager attention", config.model_type)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation=implementation, dtype=dtype)


_SAVED_KEYS = ("pruned_heads", "pruned_neurons", "removed_layers", "pruned_hidden", "compressor_ffn_size", LAYOUT_KEY,
               "auto_map")  # fmt: skip


def _original_shape(config, ffn_size: int | None) -> None:
    """Reset `config` in place to the unpruned architecture (what `from_config` builds before the layout)."""
    for key in _SAVED_KEYS:
        if hasattr(config, key):
            delattr(config, key)
    if ffn_size is not None:
        setattr(config, arch_spec(config.model_type).ffn_size_attr, ffn_size)


def load_pruned(
    model_dir: str | Path, attn_implementation: str = "sdpa", dtype: torch.dtype = torch.float32
) -> nn.Module:
    """Rebuild the original architecture from the saved config, give it the plan's shapes, load the weights strictly.

    Works for every plan (layers without heads, uneven FFN widths, removed layers) and for directories saved under
    transformers 4.57. A `compressor_layout` that disagrees with the plan is refused rather than guessed between.
    """
    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    arch_spec(config.model_type)
    plan = read_unit_plan(model_dir)
    saved_layout = getattr(config, LAYOUT_KEY, None)
    state = _read_weights(model_dir)
    _original_shape(config, plan["ffn_size"])
    model = _build(config, attn_implementation, dtype)
    model.config.pruned_heads = {k: sorted(v) for k, v in sorted(plan["heads"].items()) if v}
    model.config.pruned_neurons = {k: sorted(v) for k, v in sorted(plan["neurons"].items()) if v}
    model.config.removed_layers = sorted(plan["layers"])
    if plan["hidden"]:
        model.config.pruned_hidden = plan["hidden"]
    shapes = layout(model)
    if saved_layout is not None:
        if saved_layout.get("version") != LAYOUT_VERSION:
            raise ValueError(
                f"{model_dir}: config.json's {LAYOUT_KEY} has version {saved_layout.get('version')!r}, not "
                f"{LAYOUT_VERSION}; update compressor"
            )
        if saved_layout.get("blocks") != shapes["blocks"] or saved_layout.get("hidden") != shapes.get("hidden"):
            raise ValueError(f"{model_dir}: config.json's {LAYOUT_KEY} does not match {PLAN_FILE}")
    apply_layout(model, shapes)
    for key, tensor in model.state_dict().items():  # zero-size markers of removed layers, absent from 4.57-era saves
        if tensor.numel() == 0 and key not in state:
            state[key] = tensor
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:
        raise ValueError(f"{model_dir}: weight shapes do not match the saved plan ({err})") from None
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(
            f"{model_dir}: weights do not match the saved plan (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval()
