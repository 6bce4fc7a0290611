"""Saving and loading pruned models.

A saved directory is a normal transformers model directory (safetensors weights, `config.json` with
`pruned_heads` in original head ids, tokenizer files) plus `compressor_plan.json`, the replayable plan.
Plain `AutoModelForSequenceClassification.from_pretrained` rebuilds it through transformers' own `prune_heads`
whenever no layer lost every head; `load_pruned` handles every case by rebuilding the original architecture from
the config, replaying the plan with our surgery, and loading the weights strictly.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification

from compressor.layout import arch_spec, pruned_heads
from compressor.surgery import empty_layers, prune_heads

PLAN_FILE = "compressor_plan.json"
PLAN_FORMAT = 1


def save_pruned(model: nn.Module, out_dir: str | Path, tokenizer=None, metadata: dict | None = None) -> Path:
    """Write `model` (and `tokenizer`) to `out_dir` atomically: a sibling temp dir, renamed when complete."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        plan = {
            "format": PLAN_FORMAT,
            "model_type": model.config.model_type,
            "pruned_heads": {str(k): v for k, v in pruned_heads(model).items()},
            "empty_layers": empty_layers(model),
            "metadata": metadata or {},
        }
        (tmp / PLAN_FILE).write_text(json.dumps(plan, indent=2))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def read_plan(model_dir: str | Path) -> dict[int, list[int]]:
    """The cumulative plan stored with a saved model ({} for an unpruned directory)."""
    path = Path(model_dir) / PLAN_FILE
    if path.exists():
        data = json.loads(path.read_text())
        return {int(k): v for k, v in data["pruned_heads"].items()}
    config = AutoConfig.from_pretrained(model_dir)
    return {int(k): v for k, v in (config.pruned_heads or {}).items()}


def load_pruned(
    model_dir: str | Path, attn_implementation: str = "sdpa", dtype: torch.dtype = torch.float32
) -> nn.Module:
    """Rebuild the original architecture from the saved config, replay the plan, load the weights strictly."""
    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    arch_spec(config.model_type)
    plan = read_plan(model_dir)
    config.pruned_heads = {}
    model = AutoModelForSequenceClassification.from_config(
        config, attn_implementation=attn_implementation, dtype=dtype
    )
    prune_heads(model, plan)
    state = load_file(str(model_dir / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(
            f"{model_dir}: weights do not match the replayed plan (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval()
