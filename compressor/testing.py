"""Tiny randomly initialised models of every supported architecture, for tests and CI benchmarks.

Lives in the package (not tests/) so benchmarks and helper scripts can build the same models.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AlbertConfig, AutoConfig, AutoModelForSequenceClassification, GPT2Config

from compressor.surgery.arch import arch_spec

ARCHS = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "deberta-v2", "modernbert", "mpnet")
SDPA_ARCHS = tuple(arch for arch in ARCHS if arch_spec(arch).sdpa)  # those transformers builds with SDPA attention
ARCH_ATTN = [
    (arch, attention) for attention in ("eager", "sdpa") for arch in (ARCHS if attention == "eager" else SDPA_ARCHS)
]
VOCAB = 120


def tiny_config(arch: str = "bert", layers: int = 3, heads: int = 4, head_size: int = 8, num_labels: int = 2):
    """A tiny config of model type `arch`: the sizes every family shares, plus what its declaration needs (`tiny`)."""
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
