"""Tiny randomly initialised models of every supported architecture, for tests and CI benchmarks.

Lives in the package (not tests/) so benchmarks and helper scripts can build the same models.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import AlbertConfig, AutoConfig, AutoModelForSequenceClassification, GPT2Config

from compressor.surgery.arch import arch_spec

ARCHS = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "deberta-v2", "modernbert", "mpnet")
# BERT and every architecture whose parts differ from BERT's; the rest of ARCHS are BERT's parts under other names
# and weights (RoBERTa, XLM-R, CamemBERT, ELECTRA), so the costliest per-architecture tests run those in CI's
# end-to-end tier only.
DISTINCT_ARCHS = tuple(a for a in ARCHS if a == "bert" or arch_spec(a).portable() != arch_spec("bert").portable())
SDPA_ARCHS = tuple(arch for arch in ARCHS if arch_spec(arch).sdpa)  # those transformers builds with SDPA attention
ARCH_ATTN = [
    (arch, attention) for attention in ("eager", "sdpa") for arch in (ARCHS if attention == "eager" else SDPA_ARCHS)
]
VOCAB = 120


def tiny_config(arch: str = "bert", layers: int = 3, heads: int = 4, head_size: int = 8, num_labels: int = 2):
    """A tiny config of model type `arch`: the shared sizes, plus what its architecture's declaration needs (`tiny`)."""
    hidden = heads * head_size
    spec = arch_spec(arch)
    sizes = {
        "vocab_size": VOCAB,
        "num_labels": num_labels,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        spec.ffn_size_attr: 2 * hidden + 3,
        "max_position_embeddings": 64,
    }
    return AutoConfig.for_model(arch, **sizes, **spec.tiny)


def has_sdpa(arch: str) -> bool:
    """Whether transformers has an SDPA attention for `arch`'s classifier (DeBERTa-v2 has eager attention only)."""
    config = tiny_config(arch, layers=1, heads=1)
    return bool(AutoModelForSequenceClassification._model_mapping[type(config)]._supports_sdpa)


def tiny_model(
    arch: str = "bert", seed: int = 0, attention: str = "eager", randomized: bool = True, **kwargs
) -> nn.Module:
    """A tiny classifier. `randomized`: every parameter random at a realistic scale (see `randomize`), for tests of
    equivalence; False keeps transformers' small init, the better starting point for a model a test trains."""
    torch.manual_seed(seed)
    config = tiny_config(arch, **kwargs)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attention)
    return (randomize(model, seed) if randomized else model).eval()


@torch.no_grad()
def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every parameter a random value that matters, in place.

    transformers' own init (weights N(0, 0.02), biases 0, LayerNorm 1/0) leaves a tiny model with logits of ~0.02
    and near-uniform attention, so a wrong bias slice or a broken empty-layer block changes its outputs by less
    than the 1e-5 the equivalence tests allow. Here Linear weights are N(0, 1/fan_in) (activations stay O(1),
    attention is peaked), biases N(0, 0.2²), LayerNorm scales 1 + N(0, 0.2²) and shifts N(0, 0.2²), embeddings
    N(0, 1): logits are O(1) and every parameter reaches the output.
    """
    g = torch.Generator().manual_seed(seed)

    def normal(p: torch.Tensor, std: float, mean: float = 0.0) -> None:
        p.copy_(mean + std * torch.randn(p.shape, generator=g))

    for module in model.modules():
        if isinstance(module, nn.Linear):
            normal(module.weight, module.in_features**-0.5)
        elif isinstance(module, nn.Embedding):
            normal(module.weight, 1.0)
        elif isinstance(module, nn.LayerNorm):
            normal(module.weight, 0.2, mean=1.0)
        else:
            continue
        if getattr(module, "bias", None) is not None:
            normal(module.bias, 0.2)
    return model


def tiny_unsupported_model(arch: str) -> nn.Module:
    """A tiny classifier of an architecture compressor refuses ('albert': shared layers, 'gpt2': a decoder)."""
    configs = {
        "albert": lambda: AlbertConfig(
            vocab_size=50,
            hidden_size=16,
            num_attention_heads=2,
            intermediate_size=20,
            num_hidden_layers=2,
            embedding_size=8,
        ),
        "gpt2": lambda: GPT2Config(vocab_size=50, n_embd=16, n_head=2, n_layer=2, n_positions=32, pad_token_id=0),
    }
    return AutoModelForSequenceClassification.from_config(configs[arch]())


def tiny_batch(batch: int = 3, seq: int = 9, seed: int = 0, labels: int = 2) -> dict[str, torch.Tensor]:
    """Random ids (avoiding special ids 0-3) with some padding in the last row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq // 2 :] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, labels, (batch,), generator=g)}


def _fake_quantize(
    x: torch.Tensor, levels: int, symmetric: bool, dim: int | None = None, span: tuple | None = None
) -> torch.Tensor:
    """`x` rounded to the nearest of `levels` evenly spaced values over its range (per row of `dim` when given; over
    `span` = (lo, hi), clipped to it, when given: a static range), the grid an exact int8 kernel computes on.
    Symmetric grids are centred on 0 (weights); others span lo..hi with 0 on the grid (activations)."""
    if not x.numel():  # an emptied layer's input or weight
        return x
    if span is not None:
        lo, hi = span
    elif dim is None:
        lo, hi = x.min(), x.max()
    else:
        lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    if symmetric:
        step = (torch.maximum(hi.abs(), lo.abs()) / ((levels - 1) // 2)).clamp_min(1e-12)
        return torch.round(x / step) * step
    lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)
    step = ((hi - lo) / (levels - 1)).clamp_min(1e-12)
    return torch.round((torch.minimum(torch.maximum(x, lo), hi) - lo) / step) * step + lo


# How far past the simulated int8 deviation (`simulated_int8_deviation`) a real int8 graph may land, for dynamic and
# for static (calibrated) activation ranges: what the simulation leaves out (ONNX Runtime's requantisation of fused
# ops; NNCF's SmoothQuant and its quantised attention products), never a CPU's kernel, which with 7-bit weights on
# CPUs without VNNI cannot saturate. Set from the tiny models of every architecture on an AVX2-only CPU, where the real
# deviation is largest (docs/versions.md, "int8 in the tests").
INT8_SLACK = {"dynamic": 4.0, "static": 8.0}


def logits_of(model: nn.Module, batch: dict) -> Callable[[], torch.Tensor]:
    """A call giving `model`'s logits on `batch` (its labels left out)."""
    return lambda: model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def _input_spans(model: nn.Module, calibrate: Callable[[], object]) -> dict[nn.Module, tuple]:
    """Per Linear of `model`, the (min, max) of its input over what `calibrate` runs: the static range a calibrated
    quantiser gives it."""
    spans: dict[nn.Module, tuple] = {}

    def record(module, args):
        if not args[0].numel():
            return
        lo, hi = args[0].min(), args[0].max()
        old = spans.get(module)
        spans[module] = (lo, hi) if old is None else (torch.minimum(old[0], lo), torch.maximum(old[1], hi))

    hooks = [m.register_forward_pre_hook(record) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        calibrate()
    finally:
        for hook in hooks:
            hook.remove()
    return spans


@torch.no_grad()
def simulated_int8_deviation(
    model: nn.Module, run: Callable[[], torch.Tensor], weight_bits: int = 7, calibrate: Callable | None = None
) -> float:
    """Max |Δ| of `run()` (an output of `model`) when every Linear and embedding of `model` computes on int8 grids,
    simulated in fp32.

    The CPU-independent scale a test compares a real int8 graph's deviation with: weights and embedding tables are
    rounded per output row to `weight_bits` signed levels (7: the reduced range compressor quantises with on CPUs
    without VNNI, the coarser of the two grids it uses), and each Linear's input to 8-bit levels over its range:
    the run's own (dynamic quantisation, ONNX Runtime's int8), or, given `calibrate` (a call running the calibration
    inputs), the range they spanned, clipped to it (static quantisation, OpenVINO's). An exact int8 kernel on any x86
    CPU lands within a small multiple of this (`INT8_SLACK`); a kernel that saturates does not."""
    expected = run()
    spans = _input_spans(model, calibrate) if calibrate is not None else {}
    levels = 2**weight_bits - 1
    saved, hooks = {}, []

    def quantize_input(module, args):
        return (_fake_quantize(args[0], 256, symmetric=False, span=spans.get(module)), *args[1:])

    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Embedding) and module.weight.numel():
            saved[module] = module.weight.detach().clone()
            module.weight.copy_(_fake_quantize(module.weight, levels, symmetric=True, dim=1))
        if isinstance(module, nn.Linear):
            hooks.append(module.register_forward_pre_hook(quantize_input))
    try:
        got = run()
    finally:
        for hook in hooks:
            hook.remove()
        for module, weight in saved.items():
            module.weight.copy_(weight)
    return float((got - expected).abs().max())


def int8_tolerance(model: nn.Module, run: Callable[[], torch.Tensor], calibrate: Callable | None = None) -> float:
    """The largest |Δ| a test accepts between an int8 graph of `model` and `model` on what `run` computes: a multiple
    (`INT8_SLACK`) of the simulated int8 deviation, with dynamic activation ranges, or the static ones `calibrate`
    gives (OpenVINO's int8, ONNX Runtime's int8_static). Holds on any x86 CPU: nothing in it was read off one CPU's
    kernels."""
    slack = INT8_SLACK["dynamic" if calibrate is None else "static"]
    return slack * simulated_int8_deviation(model, run, calibrate=calibrate)
