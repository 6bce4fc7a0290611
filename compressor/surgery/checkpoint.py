"""Saving and loading pruned models.

A saved directory is a normal transformers model directory (safetensors weights, `config.json` with
`pruned_heads` in original head ids, tokenizer files) plus `compressor_plan.json`, the replayable plan, and a
`README.md` model card when the original model is given. Plain `AutoModelForSequenceClassification.from_pretrained`
rebuilds it through transformers' own `prune_heads` whenever no layer lost every head; `load_pruned` handles every
case by rebuilding the original architecture from the config, replaying the plan with our surgery, and loading the
weights strictly.

Pruned FFN neurons (`pruned_neurons`) and removed layers (`removed_layers`) are in the plan too. Vanilla
transformers has one `intermediate_size` per model, so a model whose remaining layers all keep the same FFN width
(the `prune.uniform_ffn` option), no removed layer and no layer without heads is saved with that width as
`intermediate_size` and loads with plain `from_pretrained`; any other shape needs `load_pruned`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification

from compressor.core import atomic
from compressor.surgery.arch import (
    arch_spec,
    original_ffn_size,
    present_neurons,
    pruned_heads,
    pruned_neurons,
    removed_layers,
)
from compressor.surgery.cost import model_stats
from compressor.surgery.slicing import empty_layers, prune_heads, prune_neurons, remove_layers

log = logging.getLogger(__name__)

PLAN_FILE = "compressor_plan.json"
CARD_FILE = "README.md"
PLAN_FORMAT = 2  # 2 adds pruned_neurons, removed_layers and ffn_size (format 1 files still load)
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


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
        "ffn_size": original_ffn_size(model),
        "plain_loadable": plain_loadable(model),
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


def plain_loadable(model: nn.Module) -> bool:
    """Whether plain `AutoModelForSequenceClassification.from_pretrained` can rebuild `model` once saved:
    every layer keeps at least one head, the same FFN width (at least one neuron) and no layer was removed."""
    return not empty_layers(model) and bool(uniform_ffn_width(model))


def _save_weights_and_config(model: nn.Module, out_dir: Path) -> None:
    """`save_pretrained`, writing a uniform FFN width as the config's own width so plain transformers builds it
    (the original width goes under `compressor_ffn_size`); the in-memory config is restored afterwards."""
    cfg = model.config
    width_key = "intermediate_size" if hasattr(cfg, "intermediate_size") else "hidden_dim"
    original, width = getattr(cfg, width_key), uniform_ffn_width(model)
    if width is None or width == original_ffn_size(model) or not plain_loadable(model):
        model.save_pretrained(out_dir, safe_serialization=True)
        return
    cfg.compressor_ffn_size = original_ffn_size(model)
    setattr(cfg, width_key, width)
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
    finally:
        setattr(cfg, width_key, original)
        del cfg.compressor_ffn_size


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
    lines += ["", "## Loading", "", "```python", "import compressor", "", 'model = compressor.load_pruned("<dir>")']
    lines.append("```")
    lines.append("")
    if stats.get("removed_layers") or len(set(after.get("ffn_neurons_per_layer", [0]))) > 1:
        lines.append(
            "Layers have different FFN widths or were removed whole (plain transformers has one `intermediate_size` "
            "and a fixed layer count): load with `compressor.load_pruned`."
        )
    elif stats["empty_layers"]:
        lines.append(
            f"Layer(s) {', '.join(map(str, stats['empty_layers']))} have no heads left (attention reduces to the "
            "output bias), which plain transformers cannot build: load with `compressor.load_pruned`."
        )
    else:
        lines.append("No layer lost every head, so `AutoModelForSequenceClassification.from_pretrained` works too.")
    if metadata:
        lines += ["", "## Metadata", ""] + [f"- {k}: {v}" for k, v in metadata.items()]
    return "\n".join(lines) + "\n"


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
            "pruned_heads": config.pruned_heads or {},
            "pruned_neurons": getattr(config, "pruned_neurons", {}),
            "removed_layers": getattr(config, "removed_layers", []),
            "ffn_size": getattr(config, "compressor_ffn_size", None),
        }
    return {
        "heads": {int(k): v for k, v in data["pruned_heads"].items()},
        "neurons": {int(k): v for k, v in (data.get("pruned_neurons") or {}).items()},
        "layers": [int(i) for i in data.get("removed_layers") or []],
        "ffn_size": data.get("ffn_size"),
    }


def _read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """The state dict from `model.safetensors` or a sharded `model.safetensors.index.json`."""
    if (model_dir / WEIGHTS_FILE).exists():
        return load_file(str(model_dir / WEIGHTS_FILE))
    if (model_dir / WEIGHTS_INDEX).exists():
        shards = sorted(set(json.loads((model_dir / WEIGHTS_INDEX).read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(model_dir / shard)))
        return state
    raise FileNotFoundError(f"{model_dir}: no {WEIGHTS_FILE} (expected a directory written by save_pruned)")


def _build(config, attn_implementation: str, dtype: torch.dtype) -> nn.Module:
    """The unpruned classifier for `config`; falls back to eager where SDPA is unsupported (ELECTRA in 4.57)."""
    try:
        return AutoModelForSequenceClassification.from_config(
            config, attn_implementation=attn_implementation, dtype=dtype
        )
    except ValueError as err:
        if attn_implementation != "sdpa" or "does not support" not in str(err):
            raise
        log.info("%s has no SDPA attention; loading with eager attention", config.model_type)
        return AutoModelForSequenceClassification.from_config(config, attn_implementation="eager", dtype=dtype)


def _original_shape(config, ffn_size: int | None) -> None:
    """Reset `config` in place to the unpruned architecture the plan is replayed on."""
    config.pruned_heads = {}
    for key in ("pruned_neurons", "removed_layers", "compressor_ffn_size"):
        if hasattr(config, key):
            delattr(config, key)
    if ffn_size is not None:
        setattr(config, "intermediate_size" if hasattr(config, "intermediate_size") else "hidden_dim", ffn_size)


def load_pruned(
    model_dir: str | Path, attn_implementation: str = "sdpa", dtype: torch.dtype = torch.float32
) -> nn.Module:
    """Rebuild the original architecture from the saved config, replay the plan, load the weights strictly.

    Works for every plan, including layers that lost every head, uneven FFN widths and removed layers (which
    plain `from_pretrained` cannot build).
    """
    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    arch_spec(config.model_type)
    plan = read_unit_plan(model_dir)
    state = _read_weights(model_dir)
    _original_shape(config, plan["ffn_size"])
    model = _build(config, attn_implementation, dtype)
    prune_heads(model, plan["heads"])
    prune_neurons(model, plan["neurons"])
    remove_layers(model, plan["layers"])
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:
        raise ValueError(f"{model_dir}: weight shapes do not match the replayed plan ({err})") from None
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(
            f"{model_dir}: weights do not match the replayed plan (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval()
