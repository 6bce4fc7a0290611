"""How well the latency table predicts real speed-ups: build it for a model shape, then time pruned models.

For each runtime, `pruning.latency.load_or_build` measures (or reads from its cache) the per-layer table of the
model's config (default: the built-in MiniLM-L6). A few pruned shapes — fewer heads, fewer FFN neurons, both, uneven
widths, whole layers dropped — are then built as real transformers models (random weights: speed does not depend on
them; heads kept by slicing Q/K/V rows and W_O columns here, FFN Linear layers sliced, removed layers deleted) and timed
against the unpruned model in interleaved rounds with the same `compressor.pruning.latency.probe` timing. The table's
predicted speed-up and the measured one are printed side by side with the relative error.

ONNX runtimes time plain `torch.onnx.export` graphs (int8: `deploy.export.quantize_graph` of that graph), for the
table's synthetic layers and for the pruned models alike; a run's `onnx/optimized` and `onnx/int8` variants also
carry ORT's fused-attention rewrites, which this comparison does not include. Timings on a loaded machine are
meaningless at small `--rounds` / `--min-time`: check `uptime` first.

Usage: .venv/bin/python benchmarks/latency_table.py [--runtimes pytorch onnx-fp32 onnx-int8] [--batch-size 32]
       [--seq-len 64] [--threads 2] [--grid 0 0.25 0.5 0.75 1] [--rounds 5] [--min-time 0.2]
       → prints a table and writes benchmarks/results/latency_table.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoModelForSequenceClassification  # noqa: E402

from compressor.core import atomic  # noqa: E402
from compressor.core.machine import cpu_model  # noqa: E402
from compressor.core.timing import set_threads  # noqa: E402
from compressor.pruning.latency import BUDGET_RUNTIMES, Dims, Widths, load_or_build  # noqa: E402
from compressor.pruning.latency.probe import measure, runner  # noqa: E402
from compressor.recipe import ModelSpec  # noqa: E402
from compressor.sources.models import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def shapes(dims: Dims) -> dict[str, Widths]:
    """Pruned shapes to check, as fractions of the model's widths (the last layers go first where layers are
    dropped, as the layer-dropping baseline does)."""
    L, H, N = dims.layers, dims.heads, dims.intermediate

    def per_layer(head_fracs: list[float], neuron_fracs: list[float]) -> Widths:
        return Widths(tuple(round(f * H) for f in head_fracs), tuple(round(f * N) for f in neuron_fracs))

    half = L // 2
    ramp = [1 - i / L for i in range(L)]  # 1, 5/6, ... : uneven, ending with a removed layer when L > 1
    return {
        "heads 50%": per_layer([0.5] * L, [1.0] * L),
        "neurons 50%": per_layer([1.0] * L, [0.5] * L),
        "heads and neurons 50%": per_layer([0.5] * L, [0.5] * L),
        "heads 50%, neurons 25%": per_layer([0.5] * L, [0.25] * L),
        "top half of layers dropped": per_layer([1.0] * half + [0.0] * (L - half), [1.0] * half + [0.0] * (L - half)),
        "uneven, last layer removed": per_layer(ramp[:-1] + [0.0], ramp[:-1] + [0.0]),
    }


class Logits(nn.Module):
    """A classifier called with token ids only, returning logits (a plain tensor, as ONNX export wants)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def _slice_ffn(layer: nn.Module, neurons: int) -> None:
    """Keep the first `neurons` FFN neurons of a BERT-like layer (which ones does not matter for speed)."""
    fc_in, fc_out = layer.intermediate.dense, layer.output.dense
    new_in, new_out = nn.Linear(fc_in.in_features, neurons), nn.Linear(neurons, fc_out.out_features)
    with torch.no_grad():
        new_in.weight.copy_(fc_in.weight[:neurons]), new_in.bias.copy_(fc_in.bias[:neurons])
        new_out.weight.copy_(fc_out.weight[:, :neurons]), new_out.bias.copy_(fc_out.bias)
    layer.intermediate.dense, layer.output.dense = new_in, new_out


def _slice_heads(layer: nn.Module, heads: int, head_size: int) -> None:
    """Keep the first `heads` heads of a BERT layer: Q/K/V rows and W_O columns (written here, independent of
    compressor's surgery, so the table checks it; transformers 5 has no `prune_heads` of its own)."""
    attn, width = layer.attention.self, heads * head_size
    for name in ("query", "key", "value"):
        old = getattr(attn, name)
        new = nn.Linear(old.in_features, width)
        with torch.no_grad():
            new.weight.copy_(old.weight[:width]), new.bias.copy_(old.bias[:width])
        setattr(attn, name, new)
    out = layer.attention.output.dense
    new_out = nn.Linear(width, out.out_features)
    with torch.no_grad():
        new_out.weight.copy_(out.weight[:, :width]), new_out.bias.copy_(out.bias)
    layer.attention.output.dense = new_out
    attn.num_attention_heads, attn.all_head_size = heads, width


def pruned_model(config, widths: Widths) -> nn.Module:
    """A random-weight model of `config` cut to `widths` (layers with (0, 0) deleted; heads and neurons > 0 else)."""
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa").eval()
    encoder = model.base_model.encoder
    full = Dims.from_config(config)
    for layer, heads, neurons in zip(encoder.layer, widths.heads, widths.neurons, strict=True):
        if 0 < heads < full.heads:
            _slice_heads(layer, heads, config.hidden_size // full.heads)
        if 0 < neurons < full.intermediate:
            _slice_ffn(layer, neurons)
    keep = [i for i, (h, n) in enumerate(zip(widths.heads, widths.neurons, strict=True)) if h or n]
    if any(not (widths.heads[i] and widths.neurons[i]) for i in keep):
        raise ValueError("latency_table: a kept layer needs both heads and neurons in this benchmark")
    encoder.layer = nn.ModuleList(encoder.layer[i] for i in keep)
    return Logits(model)


def compare(config, runtime: str, args: argparse.Namespace) -> dict:
    """Predicted and measured speed-ups of every shape on one runtime."""
    dims = Dims.from_config(config)
    options = {"cache_dir": args.cache_dir, "grid": args.grid, "rounds": args.rounds, "min_time_s": args.min_time}
    table = load_or_build(config, runtime, args.batch_size, args.seq_len, args.threads, **options)
    cases = {"original": dims.full(), **shapes(dims)}
    ids = torch.randint(5, dims.vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        calls = {name: runner(pruned_model(config, w), ids, runtime, args.threads, work) for name, w in cases.items()}
        ms = measure(calls, rounds=args.rounds, min_time_s=args.min_time)
    rows = []
    for name, widths in cases.items():
        predicted, measured = table.speedup(dims.full(), widths), ms["original"] / ms[name]
        rows.append({
            "shape": name, "heads": list(widths.heads), "neurons": list(widths.neurons),
            "predicted_ms": table.model_ms(widths.heads, widths.neurons), "measured_ms": ms[name],
            "predicted_speedup": predicted, "measured_speedup": measured,
            "relative_error": predicted / measured - 1,
        })  # fmt: skip
    worst = max(abs(r["relative_error"]) for r in rows)
    return {"table": table.to_dict(), "shapes": rows, "max_abs_relative_error": worst}


def render(runtime: str, result: dict) -> str:
    lines = [f"\n{runtime}: worst relative error of the predicted speed-up {result['max_abs_relative_error']:.1%}"]
    lines.append(f"{'shape':30} {'pred ms':>9} {'meas ms':>9} {'pred x':>7} {'meas x':>7} {'error':>7}")
    for r in result["shapes"]:
        lines.append(
            f"{r['shape']:30} {r['predicted_ms']:9.2f} {r['measured_ms']:9.2f} {r['predicted_speedup']:7.2f}"
            f" {r['measured_speedup']:7.2f} {r['relative_error']:7.1%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", nargs="+", choices=BUDGET_RUNTIMES, default=list(BUDGET_RUNTIMES))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grid", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per measurement (fastest call kept)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="latency table cache (default: $COMPRESSOR_CACHE)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "latency_table.json")
    args = parser.parse_args(argv)
    config = load_config(ModelSpec())
    previous = torch.get_num_threads()
    set_threads(args.threads)
    try:
        results = {runtime: compare(config, runtime, args) for runtime in args.runtimes}
    finally:
        torch.set_num_threads(previous)
    for runtime, result in results.items():
        print(render(runtime, result))
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "cache_dir")}
    out = {"settings": settings, "cpu": cpu_model(), "cpu_count": os.cpu_count(), "runtimes": results}
    atomic.write_text(args.out, json.dumps(out, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
