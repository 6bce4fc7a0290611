"""What an architecture declares, the validated registry of architectures, and the lookup every stage uses.

An architecture is declared once, in its own module of this package (`bert.py`, `distilbert.py`, ...): an `ArchSpec`
made of its attention, FFN and norm parts (`parts`), BERT's by default, where the architecture's module overrides what
differs, plus the few facts other stages ask about the model as a whole (position embeddings reserved for padding, token
type inputs, ONNX Runtime's optimizer model type). Stages call the spec's and its parts' methods; none tests a quirk of
an architecture. `register` validates a declaration when it is made, so a typo fails at import, not mid-run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import nn

from compressor.core.errors import UserError
from compressor.surgery.arch.parts import FFN, Attention, Norms, is_path
from compressor.surgery.portable import EmptyAttention, get_path, removal_marker, skip_layer


class UnsupportedArchitectureError(UserError, ValueError):
    """Raised before any work is done when a model's architecture cannot have its heads removed."""


def _part(part: str, name: str) -> property:
    """`ArchSpec.<name>`, read from its part (the paths every stage reads by name)."""
    return property(lambda self: getattr(getattr(self, part), name), doc=f"`{part}.{name}`")


class OrtFusion(NamedTuple):
    """How ONNX Runtime's transformer optimizer handles an architecture's graph."""

    model_type: str  # ONNX Runtime's optimizer model type for this graph
    fuses_attention: bool  # whether it fuses the architecture's attention into Attention nodes


@dataclass(frozen=True)
class ArchSpec:
    """One architecture: where its layers are, its attention, FFN and norm parts, and the few facts other
    stages ask about the model as a whole. Every default is BERT's."""

    layers: str = "encoder.layer"  # from the base model to the nn.ModuleList of layers
    attn: Attention = Attention()
    ffn: FFN = FFN()
    norms: Norms = Norms()
    token_type_ids: bool = True  # the forward takes token_type_ids (DistilBERT's does not)
    padding_positions: bool = False  # position ids start after pad_token_id (RoBERTa): pad + 1 embeddings are reserved
    ort_model_type: str = "bert"  # ONNX Runtime's optimizer model type for this graph
    ort_fuses_attention: bool = True  # ORT's optimizer fuses this architecture's attention into Attention nodes
    layer_returns_tuple: bool = False  # a layer returns a tuple (hidden states first) that the encoder indexes, not
    # the hidden states alone (DeBERTa, MPNet)
    pooling_attr: str | None = None  # config attribute naming how the classifier pools ("cls": the first token, as
    # when None), e.g. ModernBERT's classifier_pooling; any other value: the head reads every token
    encoder_side_module: str | None = None  # a module the encoder runs after its first layer, outside the layer
    # list, on the layers' parent (DeBERTa-v2's optional `conv`)
    tiny: Mapping[str, object] = field(default_factory=dict)  # config values the architecture's tiny test models need
    # beyond the shared sizes (`compressor.testing.tiny_config`)

    attention = _part("attn", "block")
    self_attn = _part("attn", "self_attn")
    query = _part("attn", "query")
    key = _part("attn", "key")
    value = _part("attn", "value")
    qkv = _part("attn", "qkv")
    out_proj = _part("attn", "out_proj")
    attention_out = _part("attn", "attention_out")
    heads_attr = _part("attn", "heads_attr")
    width_attr = _part("attn", "width_attr")
    head_size_attr = _part("attn", "head_size_attr")
    probs_dropout = _part("attn", "probs_dropout")
    sdpa = _part("attn", "sdpa")
    ffn_in = _part("ffn", "ffn_in")
    ffn_out = _part("ffn", "ffn_out")
    ffn_size_attr = _part("ffn", "size_attr")

    def reads_first_token(self, config) -> bool:
        """Whether the classification head reads only the first token's final hidden state (CLS pooling)."""
        return self.pooling_attr is None or getattr(config, self.pooling_attr, "cls") == "cls"

    def takes_token_types(self, config) -> bool:
        """Whether a model of `config` takes `token_type_ids` (the architecture's forward does, and the model has token
        types: DeBERTa-v3's `type_vocab_size` is 0, and its forward then ignores them)."""
        return self.token_type_ids and (getattr(config, "type_vocab_size", 1) or 0) > 0

    def reserved_positions(self, config) -> int:
        """Position embeddings that no token uses (RoBERTa-style ids start after the padding id: pad + 1)."""
        return (getattr(config, "pad_token_id", None) or 0) + 1 if self.padding_positions else 0

    def ort_fusion(self) -> OrtFusion:
        """ONNX Runtime's optimizer model type for this graph and whether it fuses the attention."""
        return OrtFusion(self.ort_model_type, self.ort_fuses_attention)

    def empty_attention(self, block: nn.Module) -> nn.Module:
        """What replaces attention block `block` of a layer left without heads (W_O's bias, then what the block
        normalises)."""
        return EmptyAttention(block, self.attention_out, self.norms.attention_norm)

    def skip_layer(self, model: nn.Module, index: int) -> None:
        """Replace layer `index` of `model` by a `SkippedLayer` that returns what the encoder expects of a layer."""
        stack = get_path(model.base_model, self.layers)
        skip_layer(model, stack, index, removal_marker(stack[index], self.ffn_out), self.layer_returns_tuple)

    def starts_anywhere(self, model: nn.Module) -> bool:
        """Whether `model`'s encoder can be started at a later layer by running its layer list's tail: not where it
        runs a module of its own after the first layer (DeBERTa-v2's `conv`, where present), which would then follow
        the wrong layer."""
        if self.encoder_side_module is None:
            return True
        parent = self.layers.rpartition(".")[0]
        encoder = get_path(model.base_model, parent) if parent else model.base_model
        return getattr(encoder, self.encoder_side_module, None) is None

    def width_refusal(self, kind: str) -> str | None:
        """Why this architecture's residual width cannot be cut exactly, in words (None where its parts allow it)."""
        return self.norms.width_refusal(kind) or self.attn.width_refusal(kind)

    def portable(self) -> dict[str, object]:
        """The module paths `surgery.portable` needs to rebuild this architecture's shapes, for a saved config (the
        optional entries only where set, so the other architectures' saved layouts stay as they were)."""
        a, f = self.attn, self.ffn
        out: dict[str, object] = {
            "layers": self.layers, "attention": a.block, "self_attn": a.self_attn, "query": a.query, "key": a.key,
            "value": a.value, "out_proj": a.out_proj, "heads_attr": a.heads_attr, "width_attr": a.width_attr,
            "ffn_in": f.ffn_in, "ffn_out": f.ffn_out, "attention_norm": self.norms.attention_norm,
            "attention_out": a.attention_out, **a.portable(), **f.portable(),
        }  # fmt: skip
        if self.layer_returns_tuple:
            out["layer_tuple"] = True
        return {name: out[name] for name in _PORTABLE_ORDER if name in out}


_PORTABLE_ORDER = ("layers", "attention", "self_attn", "query", "key", "value", "out_proj", "heads_attr", "width_attr",
                   "ffn_in", "ffn_out", "attention_norm", "attention_out", "head_rows", "layer_tuple", "shared_bias",
                   "fused_qkv", "gated_ffn")  # fmt: skip
ARCHITECTURES: dict[str, ArchSpec] = {}  # config.model_type → declaration, filled by the architecture modules


def register(spec: ArchSpec, *model_types: str) -> ArchSpec:
    """Declare `spec` for `model_types` (their `config.model_type`), validated: dotted attribute paths and attribute
    names only (each part checks its own), at least one model type, none declared twice."""
    if not model_types:
        raise ValueError("register: name at least one model_type")
    if not is_path(spec.layers):
        raise ValueError(f"ArchSpec.layers: expected a dotted attribute path, got {spec.layers!r}")
    for part in (spec.attn, spec.ffn, spec.norms):
        part.check()
    if spec.pooling_attr is not None and not spec.pooling_attr.isidentifier():
        raise ValueError(f"ArchSpec.pooling_attr: expected an attribute name or None, got {spec.pooling_attr!r}")
    unknown = set(spec.portable()) - set(_PORTABLE_ORDER)
    if unknown:
        raise ValueError(f"ArchSpec.portable: entries {sorted(unknown)} unknown; expected some of {_PORTABLE_ORDER}")
    for model_type in model_types:
        if model_type in ARCHITECTURES:
            raise ValueError(f"register: model_type '{model_type}' is already declared")
        ARCHITECTURES[model_type] = spec
    return spec


def declared(model_type: str) -> ArchSpec | None:
    """The declaration of `model_type`, or None when it has none (no error: for checks that apply where known)."""
    return ARCHITECTURES.get(model_type)


def arch_spec(model_or_type: nn.Module | str) -> ArchSpec:
    """Return the spec for a model (or a `config.model_type`), refusing unsupported architectures by name.

    Refused: every model type not in `ARCHITECTURES` (ALBERT shares one layer's weights across depth, decoders
    such as GPT-2 have fused/causal attention) and supported types configured as decoders (cross-attention).
    """
    model_type = model_or_type if isinstance(model_or_type, str) else model_or_type.config.model_type
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"model: architecture '{model_type}' is not supported for head pruning; "
            f"expected one of {sorted(ARCHITECTURES)}"
        )
    config = None if isinstance(model_or_type, str) else model_or_type.config
    if config is not None and (getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False)):
        raise UnsupportedArchitectureError(
            f"model: architecture '{model_type}' configured as a decoder (is_decoder/add_cross_attention) is not "
            "supported for head pruning; expected an encoder-only classifier"
        )
    return ARCHITECTURES[model_type]


def supported_attention(model_type: str, requested: str) -> str:
    """`requested`, or "eager" where SDPA is asked for and the architecture declares none in transformers (`sdpa`)."""
    spec = declared(model_type)
    return "eager" if requested == "sdpa" and spec is not None and not spec.sdpa else requested
