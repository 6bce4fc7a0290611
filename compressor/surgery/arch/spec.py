"""What an architecture family declares, the validated registry of families, and the lookup every stage uses.

A family is declared once, in its own module of this package (`bert.py`, `distilbert.py`): where its layers,
attention projections, head-count attributes and FFN Linears live, plus the few facts other stages used to special-
case by model type (position embeddings reserved for padding, token type inputs, the ONNX Runtime fusion family).
`register` validates a declaration when it is made, so a typo fails at import, not in the middle of a run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from torch import nn

from compressor.core.errors import UserError


class UnsupportedArchitectureError(UserError, ValueError):
    """Raised before any work is done when a model's architecture cannot have its heads removed."""


@dataclass(frozen=True)
class ArchSpec:
    """Attribute paths for one architecture family (dotted, relative to the noted parent)."""

    layers: str  # from the base model to the nn.ModuleList of layers
    attention: str  # from a layer to the attention block (replaced wholesale when a layer loses every head)
    self_attn: str  # from a layer to the module holding q/k/v and the head-count attributes
    query: str  # from self_attn
    key: str
    value: str
    out_proj: str  # from a layer: the projection W_O that mixes heads back into the residual stream
    heads_attr: str | None  # head-count attribute on self_attn (None: the forward infers it from the projections)
    width_attr: str | None  # heads * head_size attribute on self_attn (None: as heads_attr)
    head_size_attr: str
    ffn_in: str = "intermediate.dense"  # from a layer: the FFN's first Linear (one output row per neuron)
    ffn_out: str = "output.dense"  # from a layer: the FFN's output Linear (one input column per neuron)
    token_type_ids: bool = True  # the forward takes token_type_ids (DistilBERT's does not)
    probs_dropout: str | None = None  # from self_attn: the dropout module eager attention applies to probabilities,
    # where attention maps are read; None: the family runs transformers' attention interface (read there instead)
    padding_positions: bool = False  # position ids start after pad_token_id (RoBERTa): pad + 1 embeddings are reserved
    ort_model_type: str = "bert"  # the ONNX Runtime transformer optimizer's fusion family for this graph
    ort_fuses_attention: bool = True  # ORT's optimizer fuses this family's attention into Attention nodes
    head_rows: tuple[str, ...] = ()  # from self_attn: further Linears with one block of output rows per head, sliced
    # with Q/K/V where the module has them (DeBERTa's pos_key_proj / pos_query_proj of relative positions)
    layer_returns_tuple: bool = False  # a layer returns a tuple (hidden states first) that the encoder indexes, not
    # the hidden states alone (DeBERTa, MPNet)
    extra_head_flops: Callable[[object, int], int] | None = None  # (config, seq_len) → FLOPs of one head beyond its
    # Q/K/V/O rows, scores and weighted values (DeBERTa's relative-position terms); None: nothing more
    sdpa: bool = True  # transformers has an SDPA path for the family (loads asking for SDPA fall back to eager if not)
    shared_bias: str | None = None  # self_attn's forward argument carrying a [batch, original heads, q, k] bias
    # computed once for all layers (MPNet's relative position bias); a pruned layer selects its present heads from it
    fused_qkv: bool = False  # query, key and value name ONE Linear whose output rows are [Q | K | V], each
    # heads × head_size in head order (ModernBERT's Wqkv): a head is three row blocks of it
    gated_ffn: bool = False  # ffn_in's output rows are [input | gate] halves of the FFN width (GLU): neuron i is
    # rows i and i + width of ffn_in, plus column i of ffn_out
    pre_norm: bool = False  # LayerNorm before each sublayer (x + attn(norm(x)), then h + ffn(norm(h))): the FFN's
    # residual is the layer input plus W_O's output; False (post-norm): the residual is ffn_in's own input
    pooling_attr: str | None = None  # config attribute naming how the classifier pools ("cls": the first token, as
    # when None), e.g. ModernBERT's classifier_pooling; any other value: the head reads every token
    attention_norm: str | None = "output.LayerNorm"  # from the attention block: the LayerNorm it applies to W_O's
    # output plus the residual (a sibling `dropout` runs first); None where the block returns W_O's output as is
    # (the layer normalises: DistilBERT; pre-norm: ModernBERT). What a layer left without heads keeps (`EmptyAttention`)
    ffn_norm: str | None = "output.LayerNorm"  # from a layer: the LayerNorm a post-norm layer applies to the
    # down-projection's output plus its residual, giving the layer's output; None: that sum is the output (pre-norm)
    ffn_size_attr: str = "intermediate_size"  # the config attribute holding the FFN width (DistilBERT: hidden_dim)
    encoder_side_module: str | None = None  # a module the encoder runs after its first layer, outside the layer
    # list, on the layers' parent (DeBERTa-v2's optional `conv`): where one is present, the encoder cannot be started
    # at a later layer (`criteria.attribution.start_at` runs every layer instead)
    tiny: Mapping[str, object] = field(default_factory=dict)  # config values the family's tiny test models need
    # beyond the shared sizes (`compressor.testing.tiny_config`)

    @property
    def qkv(self) -> tuple[str, ...]:
        """The distinct Q/K/V Linears (one when fused), from self_attn."""
        return tuple(dict.fromkeys((self.query, self.key, self.value)))

    @property
    def qkv_blocks(self) -> int:
        """Row blocks of heads × head_size in each of `qkv`'s Linears (3 when fused, else 1)."""
        return 3 if self.fused_qkv else 1

    @property
    def ffn_in_blocks(self) -> int:
        """Row blocks of the FFN width in ffn_in (2 when gated, else 1)."""
        return 2 if self.gated_ffn else 1

    def reads_first_token(self, config) -> bool:
        """Whether the classification head reads only the first token's final hidden state (CLS pooling)."""
        return self.pooling_attr is None or getattr(config, self.pooling_attr, "cls") == "cls"

    @property
    def attention_out(self) -> str:
        """W_O's path from the attention block (what an `EmptyAttention` keeps)."""
        return self.out_proj.removeprefix(self.attention + ".")

    def portable(self) -> dict[str, object]:
        """The module paths `surgery.portable` needs to rebuild this family's shapes, for a saved config (the optional
        entries only where set, so the other families' saved layouts stay as they were)."""
        names = ("layers", "attention", "self_attn", "query", "key", "value", "out_proj", "heads_attr", "width_attr",
                 "ffn_in", "ffn_out", "attention_norm")  # fmt: skip
        out: dict[str, object] = {name: getattr(self, name) for name in names}
        out["attention_out"] = self.attention_out
        if self.head_rows:
            out["head_rows"] = list(self.head_rows)
        if self.layer_returns_tuple:
            out["layer_tuple"] = True
        if self.shared_bias:
            out["shared_bias"] = self.shared_bias
        out.update({name: True for name in ("fused_qkv", "gated_ffn") if getattr(self, name)})
        return out


ARCHITECTURES: dict[str, ArchSpec] = {}  # config.model_type → declaration, filled by the family modules
_PATH_FIELDS = ("layers", "attention", "self_attn", "query", "key", "value", "out_proj", "ffn_in", "ffn_out")
_ATTR_FIELDS = ("heads_attr", "width_attr", "head_size_attr")
_OPTIONAL_ATTRS = ("heads_attr", "width_attr")  # None where the attention module keeps no such attribute


def register(spec: ArchSpec, *model_types: str) -> ArchSpec:
    """Declare `spec` for `model_types` (their `config.model_type`), validated: dotted attribute paths and attribute
    names only, at least one model type, none declared twice."""
    if not model_types:
        raise ValueError("register: name at least one model_type")
    for name in _PATH_FIELDS:
        path = getattr(spec, name)
        if not path or not all(part.isidentifier() for part in path.split(".")):
            raise ValueError(f"ArchSpec.{name}: expected a dotted attribute path, got {path!r}")
    if spec.probs_dropout is not None and not all(p.isidentifier() for p in spec.probs_dropout.split(".")):
        raise ValueError(f"ArchSpec.probs_dropout: expected a dotted path or None, got {spec.probs_dropout!r}")
    if isinstance(spec.head_rows, str) or not all(name.isidentifier() for name in spec.head_rows):
        raise ValueError(f"ArchSpec.head_rows: expected a tuple of attribute names, got {spec.head_rows!r}")
    if spec.ffn_norm is not None and not all(p.isidentifier() for p in spec.ffn_norm.split(".")):
        raise ValueError(f"ArchSpec.ffn_norm: expected a dotted path or None, got {spec.ffn_norm!r}")
    if spec.pooling_attr is not None and not spec.pooling_attr.isidentifier():
        raise ValueError(f"ArchSpec.pooling_attr: expected an attribute name or None, got {spec.pooling_attr!r}")
    if spec.shared_bias is not None and not spec.shared_bias.isidentifier():
        raise ValueError(f"ArchSpec.shared_bias: expected an argument name or None, got {spec.shared_bias!r}")
    for name in _ATTR_FIELDS:
        value = getattr(spec, name)
        if not (value is None and name in _OPTIONAL_ATTRS) and not (isinstance(value, str) and value.isidentifier()):
            raise ValueError(f"ArchSpec.{name}: expected an attribute name, got {value!r}")
    if spec.fused_qkv and len(spec.qkv) != 1:
        raise ValueError(f"ArchSpec.fused_qkv: query, key and value must name the one fused Linear, got {spec.qkv}")
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
    """`requested`, or "eager" where SDPA is asked for and the family declares none in transformers (`sdpa`)."""
    spec = declared(model_type)
    return "eager" if requested == "sdpa" and spec is not None and not spec.sdpa else requested
