"""The parts an architecture's declaration is made of: its attention, its FFN and where it normalises, each with BERT's
behaviour as the default and methods that answer what the other stages ask (the rows of a head, the rows of a
neuron, the residual the FFN adds to, an empty attention). An architecture whose part differs overrides the method in
its own module (ModernBERT's fused Q/K/V and gated FFN, DeBERTa's relative positions, MPNet's shared bias): no stage
outside this package branches on what an architecture is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from compressor.surgery.portable import get_path


def blocks(index: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """`index` repeated in each of `count` consecutive row blocks of `width` (fused Q/K/V, gated FFN halves)."""
    return torch.cat([index + block * width for block in range(count)])


def is_path(path: object) -> bool:
    """Whether `path` is a dotted attribute path (`output.dense`)."""
    return isinstance(path, str) and bool(path) and all(part.isidentifier() for part in path.split("."))


@dataclass(frozen=True)
class Attention:
    """Where one layer's attention lives (dotted paths, relative to the noted parent), BERT's by default: separate
    query/key/value Linears with one block of head size rows per head, and W_O mixing the heads back."""

    block: str = "attention"  # from a layer: the attention block (replaced wholesale when a layer loses every head)
    self_attn: str = "attention.self"  # from a layer: the module holding Q/K/V and the head-count attributes
    query: str = "query"  # from self_attn
    key: str = "key"
    value: str = "value"
    out_proj: str = "attention.output.dense"  # from a layer: W_O, which mixes heads back into the residual stream
    heads_attr: str | None = "num_attention_heads"  # on self_attn (None: the forward infers it from the weights)
    width_attr: str | None = "all_head_size"  # heads × head size attribute on self_attn (None: as heads_attr)
    head_size_attr: str = "attention_head_size"
    probs_dropout: str | None = None  # from self_attn: the dropout eager attention applies to probabilities, where
    # attention maps are read; None: the architecture runs transformers' attention interface (read there instead)
    sdpa: bool = True  # transformers has SDPA for the architecture (loads asking for SDPA fall back to eager if not)

    @property
    def qkv(self) -> tuple[str, ...]:
        """The distinct Q/K/V Linears (one when fused), from self_attn."""
        return tuple(dict.fromkeys((self.query, self.key, self.value)))

    @property
    def attention_out(self) -> str:
        """W_O's path from the attention block (what an `EmptyAttention` keeps)."""
        return self.out_proj.removeprefix(self.block + ".")

    def projection_rows(self, module: nn.Module, index: torch.Tensor, width: int) -> dict[str, torch.Tensor]:
        """For each Linear of `module` (self_attn) with one block of output rows per head: the rows that keep the
        heads whose head-size rows are `index` among the `width` rows present heads have now."""
        return {name: index for name in self.qkv}

    def head_flops(self, config, seq_len: int, hidden: int, size: int) -> int:
        """FLOPs per example of one head of `size` in a stream of `hidden` channels at `seq_len` tokens: its Q/K/V
        rows and W_O columns, its scores and weighted values."""
        return 2 * (4 * seq_len * hidden * size + 2 * seq_len * seq_len * size)

    def keep_heads(self, module: nn.Module, head_ids: list[int]) -> None:
        """After slicing, tell `module` (self_attn) which original heads it holds where its forward needs to know
        (nothing to do by default)."""

    def width_refusal(self, kind: str) -> str | None:
        """Why this attention stops the residual width being cut, in words (None: it does not)."""
        return None

    def portable(self) -> dict[str, object]:
        """What a saved layout records beyond the paths, for `surgery.portable` to rebuild it (nothing by default)."""
        return {}

    def check(self) -> None:
        """Refuse a malformed declaration in one line (`register` calls it at import)."""
        for name in ("block", "self_attn", "query", "key", "value", "out_proj"):
            if not is_path(getattr(self, name)):
                label = "attention" if name == "block" else name
                raise ValueError(f"ArchSpec.{label}: expected a dotted attribute path, got {getattr(self, name)!r}")
        if self.probs_dropout is not None and not is_path(self.probs_dropout):
            raise ValueError(f"ArchSpec.probs_dropout: expected a dotted path or None, got {self.probs_dropout!r}")
        for name in ("heads_attr", "width_attr", "head_size_attr"):
            value = getattr(self, name)
            optional = value is None and name != "head_size_attr"  # None: the module keeps no such attribute
            if not optional and not (isinstance(value, str) and value.isidentifier()):
                raise ValueError(f"ArchSpec.{name}: expected an attribute name, got {value!r}")


@dataclass(frozen=True)
class FFN:
    """Where one layer's feed-forward lives, BERT's by default: ffn_in has one output row per neuron, ffn_out one
    input column per neuron."""

    ffn_in: str = "intermediate.dense"  # from a layer
    ffn_out: str = "output.dense"  # from a layer
    size_attr: str = "intermediate_size"  # the config attribute holding the FFN width (DistilBERT: hidden_dim)

    def in_rows(self, index: torch.Tensor, width: int) -> torch.Tensor:
        """The rows of ffn_in that keep the neurons at positions `index` of the `width` present now."""
        return index

    def neuron_rows(self) -> int:
        """How many rows of ffn_in one neuron has (what `in_rows` gives a layer of one neuron)."""
        return self.in_rows(torch.zeros(1, dtype=torch.long), 1).numel()

    def neuron_flops(self, seq_len: int, hidden: int) -> int:
        """FLOPs per example of one neuron in a stream of `hidden` channels: its ffn_in row(s), its ffn_out column."""
        return 2 * ((self.neuron_rows() + 1) * seq_len * hidden)

    def portable(self) -> dict[str, object]:
        """What a saved layout records beyond the paths (nothing by default)."""
        return {}

    def check(self) -> None:
        """Refuse a malformed declaration in one line."""
        for name in ("ffn_in", "ffn_out"):
            if not is_path(getattr(self, name)):
                raise ValueError(f"ArchSpec.{name}: expected a dotted attribute path, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Norms:
    """Where a layer normalises, BERT's post-norm by default: LayerNorm(x + attention(x)), then LayerNorm(h + FFN(h)),
    so the FFN's residual is its own input."""

    attention_norm: str | None = "output.LayerNorm"  # from the attention block: the LayerNorm it applies to W_O's
    # output plus the residual (a sibling `dropout` runs first); None where the block returns W_O's output as is
    # (the layer normalises: DistilBERT; pre-norm: ModernBERT). What a layer left without heads keeps
    ffn_norm: str | None = "output.LayerNorm"  # from a layer: the LayerNorm applied to the FFN's output plus its
    # residual, giving the layer's output

    def ffn_residual(self, attention_sum: torch.Tensor, ffn_input: torch.Tensor) -> torch.Tensor:
        """The residual the FFN's output is added to, from the layer input plus W_O's output (`attention_sum`) and
        what ffn_in received (`ffn_input`)."""
        return ffn_input

    def after_ffn(self, layer: nn.Module, total: torch.Tensor) -> torch.Tensor:
        """What `layer` outputs given its FFN's output plus residual (`total`)."""
        return get_path(layer, self.ffn_norm)(total) if self.ffn_norm is not None else total

    def width_refusal(self, kind: str) -> str | None:
        """Why this normalisation stops the residual width being cut, in words (None: it does not)."""
        return None

    def check(self) -> None:
        """Refuse a malformed declaration in one line."""
        for name in ("attention_norm", "ffn_norm"):
            if getattr(self, name) is not None and not is_path(getattr(self, name)):
                raise ValueError(f"ArchSpec.{name}: expected a dotted path or None, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class PreNorm(Norms):
    """LayerNorm before each sublayer: x + attention(norm(x)), then h + FFN(norm(h)), un-normalised (ModernBERT)."""

    attention_norm: str | None = None
    ffn_norm: str | None = None

    def ffn_residual(self, attention_sum: torch.Tensor, ffn_input: torch.Tensor) -> torch.Tensor:
        """The stream after attention: the FFN reads a normalised copy of it, and adds to it as it is."""
        return attention_sum

    def after_ffn(self, layer: nn.Module, total: torch.Tensor) -> torch.Tensor:
        """The sum itself: nothing normalises a pre-norm layer's output."""
        return total

    def width_refusal(self, kind: str) -> str | None:
        return f"{kind} normalises before each sublayer (pre-norm), so its residual stream is never re-normalised"
