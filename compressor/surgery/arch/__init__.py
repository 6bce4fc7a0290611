"""Architectures: one declaration module each (`bert`, `distilbert`, `deberta_v2`, `modernbert`, `mpnet`),
the parts a declaration is made of, BERT's by default (`parts`), the registry (`spec`) and the shape readers built on
it (`shape`). Adding an architecture means adding one module here, overriding the parts' methods where it differs (and
its tiny config to `compressor.testing.ARCHS`); importing this package registers every architecture.
"""

from compressor.surgery.arch import bert, deberta_v2, distilbert, modernbert, mpnet  # noqa: F401  (registration)
from compressor.surgery.arch.parts import FFN, Attention, Norms, PreNorm
from compressor.surgery.arch.shape import (
    config_head_counts,
    config_width,
    get_path,
    head_size,
    hidden_kwarg,
    layers,
    neuron_presence_mask,
    num_layers,
    original_ffn_size,
    original_hidden,
    original_num_heads,
    presence_mask,
    present_heads,
    present_hidden,
    present_neurons,
    pruned_heads,
    pruned_hidden,
    pruned_neurons,
    removed_layers,
    set_path,
)
from compressor.surgery.arch.spec import (
    ARCHITECTURES,
    ArchSpec,
    OrtFusion,
    UnsupportedArchitectureError,
    arch_spec,
    declared,
    supported_attention,
)

__all__ = [
    "ARCHITECTURES",
    "FFN",
    "ArchSpec",
    "Attention",
    "Norms",
    "OrtFusion",
    "PreNorm",
    "UnsupportedArchitectureError",
    "arch_spec",
    "config_head_counts",
    "config_width",
    "declared",
    "get_path",
    "head_size",
    "hidden_kwarg",
    "layers",
    "neuron_presence_mask",
    "num_layers",
    "original_ffn_size",
    "original_hidden",
    "original_num_heads",
    "presence_mask",
    "present_heads",
    "present_hidden",
    "present_neurons",
    "pruned_heads",
    "pruned_hidden",
    "pruned_neurons",
    "removed_layers",
    "set_path",
    "supported_attention",
]
