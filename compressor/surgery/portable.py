"""Per-layer shapes of a pruned encoder, buildable without compressor: this file is copied verbatim into every saved
model directory as `modeling_compressor.py`, so plain transformers loads the model with `trust_remote_code=True`.

transformers builds every layer of an encoder at the size `config.json` gives, and has no field for per-layer head
counts or FFN widths. A saved model therefore keeps the *original* config plus a `compressor_layout` entry: the
architecture's module paths and, per layer, the heads and FFN neurons left (or that the layer was removed).
`apply_layout` rebuilds the stock model at those shapes before the weights load; `load_pruned` in compressor uses the
same function, so both routes build the same modules.

Self-contained on purpose: it imports only torch and transformers, and compressor imports nothing back into it.
"""

from __future__ import annotations

import warnings

import torch
import transformers
from torch import nn

LAYOUT_KEY = "compressor_layout"
LAYOUT_VERSION = 1
HEAD_IDS = "compressor_head_ids"  # buffer of a pruned attention's present original head ids (shared-bias architectures)


def get_path(root: nn.Module, path: str) -> nn.Module:
    """The sub-module at dotted `path` (list indices as digits)."""
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def set_path(root: nn.Module, path: str, value: nn.Module) -> None:
    """Replace the sub-module at dotted `path` by `value`."""
    parent, _, name = path.rpartition(".")
    setattr(get_path(root, parent) if parent else root, name, value)


def _parent(root: nn.Module, path: str) -> tuple[nn.Module, str]:
    """The module holding `path`'s last name (missing ones made as empty containers) and that name."""
    *parents, leaf = path.split(".")
    for name in parents:
        if not hasattr(root, name):
            root.add_module(name, nn.Module())
        root = getattr(root, name)
    return root, leaf


def empty_linear(in_features: int, out_features: int, like: nn.Linear) -> nn.Linear:
    """A Linear of the given shape with `like`'s bias presence, dtype and device (weights are loaded after)."""
    with warnings.catch_warnings():  # kaiming init warns on a zero-element weight (no head or no neuron left)
        warnings.simplefilter("ignore")
        new = nn.Linear(in_features, out_features, bias=like.bias is not None)
    return new.to(device=like.weight.device, dtype=like.weight.dtype)


class EmptyAttention(nn.Module):
    """Attention block of a layer with no heads left: its output is W_O's bias, zeros where W_O has none (then
    residual and LayerNorm where the architecture's block normalises).

    `norm` is the architecture's declared path from the block to that LayerNorm (`Norms.attention_norm`:
    `output.LayerNorm` for BERT-like blocks, `LayerNorm` for MPNet's; None where the block returns W_O's output as
    is). The sub-module holding it is kept under its own name, so state-dict keys stay the architecture's own.
    Returns `(output, None)` like a transformers attention block; no attention map exists for zero heads.
    """

    def __init__(self, block: nn.Module, out_proj: str, norm: str | None):
        super().__init__()
        dense = get_path(block, out_proj)
        zero = empty_linear(0, dense.out_features, dense)
        if dense.bias is not None and not dense.bias.is_meta:
            with torch.no_grad():
                zero.bias.copy_(dense.bias)
        self._norm = norm
        if norm is not None:
            holder, _, leaf = norm.rpartition(".")
            if holder:
                top = holder.split(".")[0]
                self.add_module(top, get_path(block, top))
            else:
                self.add_module(leaf, get_path(block, leaf))
                self.dropout = block.dropout
        parent, name = _parent(self, out_proj)
        setattr(parent, name, zero)
        self._out_proj = out_proj

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
        """Shape-only tensor ops and no data-dependent branch, so ONNX tracing sees a constant graph."""
        bias = get_path(self, self._out_proj).bias
        bias = torch.zeros_like(hidden_states) if bias is None else bias.expand_as(hidden_states)
        if self._norm is None:
            return bias, None
        holder, _, leaf = self._norm.rpartition(".")
        node = get_path(self, holder) if holder else self
        return getattr(node, leaf)(node.dropout(bias) + hidden_states), None


def legacy_attention_norm(block: nn.Module) -> str | None:
    """The LayerNorm path of a layout saved before architectures declared it (`attention_norm`), as it was read off the
    block then: BERT-like blocks normalise in `output`, MPNet's block itself."""
    if hasattr(block, "output"):
        return "output.LayerNorm"
    return "LayerNorm" if isinstance(getattr(block, "LayerNorm", None), nn.LayerNorm) else None


class SkippedLayer(nn.Module):
    """A layer removed whole (no heads and no FFN neurons): returns its input, with no parameters.

    `marker` (a dotted path, e.g. the architecture's `output.dense.bias`) holds a zero-size buffer where the stock layer
    keeps a weight, so stock transformers meets a size mismatch and refuses the checkpoint instead of filling the
    removed layer with fresh random weights. Put in place with `skip_layer`, which keeps its output in
    `output_hidden_states` (one entry per layer). `returns_tuple`: `(input, None)` for encoders that unpack or index
    their layers' tuples (DeBERTa, MPNet), as a layer without attention map returns.
    """

    def __init__(self, marker: str | None = None, returns_tuple: bool = False):
        super().__init__()
        self.returns_tuple = returns_tuple
        if marker:
            node, leaf = _parent(self, marker)
            node.register_buffer(leaf, torch.zeros(0))

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor | tuple[torch.Tensor, None]:
        return (hidden_states, None) if self.returns_tuple else hidden_states


def _capture_hidden_state(model: nn.Module, replaced: nn.Module, skipped: SkippedLayer) -> None:
    """Give `skipped` the hook transformers' output capture puts on every layer of its architecture's class, which
    `skipped` is not: without it `output_hidden_states` would drop the removed layer's entry and shift the rest.

    The hooks are otherwise installed lazily, once per model, on modules of the declared class (`_can_record_outputs`),
    so one installed here is neither duplicated later nor lost when the model had run with them already.
    """
    try:
        from transformers.utils.output_capturing import OutputRecorder, install_output_capuring_hook
    except ImportError:  # another transformers: hidden states of removed layers are not reported
        return
    spec = (getattr(model.base_model, "_can_record_outputs", None) or {}).get("hidden_states")
    if isinstance(spec, type):
        spec = OutputRecorder(target_class=spec, index=0)
    if isinstance(spec, OutputRecorder) and spec.target_class is not None and isinstance(replaced, spec.target_class):
        initial = getattr(spec, "capture_initial_hidden_state", None)  # not an argument of early 5.x (compat.py)
        install_output_capuring_hook(skipped, "hidden_states", spec.index, *(() if initial is None else (initial,)))


def removal_marker(layer: nn.Module, ffn_out: str) -> str:
    """The `SkippedLayer` marker for `layer`: W_2's bias, or its weight where W_2 has no bias (ModernBERT)."""
    return ffn_out + (".bias" if getattr(get_path(layer, ffn_out), "bias", None) is not None else ".weight")


def skip_layer(
    model: nn.Module, stack: nn.ModuleList, index: int, marker: str | None = None, returns_tuple: bool = False
) -> None:
    """Replace `stack[index]` (a layer of `model`) by a `SkippedLayer` with `marker` (and `returns_tuple`); one
    already skipped is left as it is. The layer's plain attributes (str, int, bool) stay readable on it: an encoder
    loop may read them (ModernBERT picks each layer's mask by its `attention_type`)."""
    if isinstance(stack[index], SkippedLayer):
        return
    skipped = SkippedLayer(marker, returns_tuple)
    for name, value in vars(stack[index]).items():
        if not name.startswith("_") and name != "training" and isinstance(value, (str, int, bool)):
            setattr(skipped, name, value)
    _capture_hidden_state(model, stack[index], skipped)
    stack[index] = skipped


def _argument_index(cls: type, arg: str) -> int:
    """Position of `arg` among `cls.forward`'s arguments after `self` (refused in one line when it has none)."""
    forward = cls.forward
    while hasattr(forward, "__wrapped__"):  # decorated forwards: the arguments of the function they wrap
        forward = forward.__wrapped__
    names = forward.__code__.co_varnames[1 : forward.__code__.co_argcount]
    if arg not in names:
        raise ValueError(f"shared_bias: {cls.__name__}.forward has no argument '{arg}' to select heads from")
    return names.index(arg)


def _select_bias(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: the shared bias ([batch, original heads, q, k]) narrowed to `module`'s present heads."""
    (arg, pos), ids = module.compressor_shared_bias, getattr(module, HEAD_IDS)
    if kwargs.get(arg) is not None:
        kwargs[arg] = kwargs[arg].index_select(1, ids)
    elif pos < len(args) and args[pos] is not None:
        args = (*args[:pos], args[pos].index_select(1, ids), *args[pos + 1 :])
    return args, kwargs


def select_bias_heads(attn: nn.Module, arg: str, head_ids) -> None:
    """Make `attn` take only the columns `head_ids` (its present heads' original ids, a persistent buffer) of the
    bias it receives as argument `arg`, shared by every layer at the original head count (MPNet's position bias).
    Called again it only replaces the ids."""
    index = _argument_index(type(attn), arg)
    ids = torch.as_tensor(list(head_ids), dtype=torch.long, device=next(attn.parameters()).device)
    if HEAD_IDS in attn._buffers:
        attn._buffers[HEAD_IDS] = ids
        return
    attn.compressor_shared_bias = (arg, index)
    attn.register_buffer(HEAD_IDS, ids)
    attn.register_forward_pre_hook(_select_bias, with_kwargs=True)


def shrink_attention(layer: nn.Module, arch: dict, heads: int, head_size: int) -> None:
    """Rebuild `layer`'s Q/K/V rows (and those of its architecture's other per-head Linears), and W_O columns, for
    `heads` heads (an `EmptyAttention` for none); a fused Q/K/V Linear (`fused_qkv`) gets the three blocks of rows."""
    if heads == 0:
        block = get_path(layer, arch["attention"])
        norm = arch["attention_norm"] if "attention_norm" in arch else legacy_attention_norm(block)
        set_path(layer, arch["attention"], EmptyAttention(block, arch["attention_out"], norm))
        return
    attn, width = get_path(layer, arch["self_attn"]), heads * head_size
    extra = [name for name in arch.get("head_rows", ()) if isinstance(getattr(attn, name, None), nn.Linear)]
    fused = dict.fromkeys((arch["query"], arch["key"], arch["value"]))
    for name in (*fused, *extra):
        blocks = 3 if arch.get("fused_qkv") and name in fused else 1
        old = getattr(attn, name)
        setattr(attn, name, empty_linear(old.in_features, width * blocks, old))
    out = get_path(layer, arch["out_proj"])
    set_path(layer, arch["out_proj"], empty_linear(width, out.out_features, out))
    for attr, value in ((arch["heads_attr"], heads), (arch["width_attr"], width)):
        if attr:  # None: the architecture's forward reads the head count off the weights
            setattr(attn, attr, value)
    if arch.get("shared_bias"):  # placeholder ids (invalid, so never silently used): the saved buffer loads over
        select_bias_heads(attn, arch["shared_bias"], [-1] * heads)


def shrink_ffn(layer: nn.Module, arch: dict, width: int) -> None:
    """Rebuild `layer`'s FFN for `width` neurons (W_1 rows, both halves of a gated W_1; W_2 columns)."""
    first, second = get_path(layer, arch["ffn_in"]), get_path(layer, arch["ffn_out"])
    set_path(layer, arch["ffn_in"], empty_linear(first.in_features, width * (2 if arch.get("gated_ffn") else 1), first))
    set_path(layer, arch["ffn_out"], empty_linear(width, second.out_features, second))


def stream_paths(model: nn.Module, arch: dict) -> dict[str, list[str]]:
    """Where the residual stream of `model` (a post-norm architecture's classifier) is read and written, as dotted paths
    from `model`: "tables" (the embedding tables of the stream's width), "norms" (every LayerNorm over it),
    "readers" (Linears whose input columns are the stream: each layer's Q/K/V and FFN-in, the head's Linears) and
    "writers" (Linears whose output rows are: each layer's W_O and FFN-out, the head's hidden Linear, whose
    output is cut alike so that the head stays one index set; also listed as "head"). A Linear may be both a
    reader and a writer (the pooler's dense).

    The width is that of the input embeddings; outside the encoder layers a Linear is the stream's by its shape, so
    a head whose label count equals the width is refused (`width_refusal` in compressor). One traversal serves the
    cut of a trained model and the rebuild of a saved one, so both give the same modules."""
    width = model.get_input_embeddings().embedding_dim
    names = {id(m): name for name, m in model.named_modules()}
    embeddings = model.get_input_embeddings()
    owner = next(m for m in model.modules() if any(c is embeddings for c in m.children()))
    out: dict[str, list[str]] = {"tables": [], "norms": [], "readers": [], "writers": [], "head": []}
    out["tables"] = [names[id(m)] for m in owner.modules() if isinstance(m, nn.Embedding) and m.embedding_dim == width]
    norms = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    out["norms"] = [name for name, norm in norms if norm.normalized_shape == (width,)]
    stack = get_path(model.base_model, arch["layers"])
    inside = {id(m) for m in stack.modules()}
    attn_names = dict.fromkeys((arch["query"], arch["key"], arch["value"]))
    for layer in stack:
        prefix = names[id(layer)] + "."
        try:
            attn = get_path(layer, arch["self_attn"])
            out["readers"] += [prefix + arch["self_attn"] + "." + q for q in attn_names if hasattr(attn, q)]
        except AttributeError:  # a layer without heads (EmptyAttention) or removed whole (SkippedLayer)
            pass
        sides = ((arch["ffn_in"], "readers"), (arch["out_proj"], "writers"), (arch["ffn_out"], "writers"))
        for path, kind in sides:
            try:
                found = get_path(layer, path)
            except AttributeError:
                continue
            if isinstance(found, nn.Linear):  # not a removed layer's marker container
                out[kind].append(prefix + path)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and id(module) not in inside:
            if module.in_features == width:
                out["readers"].append(name)
            if module.out_features == width:
                out["writers"].append(name)
                out["head"].append(name)
    return out


def _narrowed(module: nn.Module, width: int, index: torch.Tensor | None, rows: bool, cols: bool) -> nn.Module:
    """`module` (Embedding, LayerNorm or Linear) at stream width `width`: with `index`, holding its weights at those
    channels (an Embedding's and a LayerNorm's along the stream; a Linear's `rows` and/or `cols`); without, an
    empty module of that shape (a rebuild whose weights load after)."""
    if isinstance(module, nn.Embedding):
        new, dims = nn.Embedding(module.num_embeddings, width, padding_idx=module.padding_idx), {"weight": (1,)}
    elif isinstance(module, nn.LayerNorm):
        new = nn.LayerNorm(width, eps=module.eps, elementwise_affine=module.elementwise_affine,
                           bias=module.bias is not None)  # fmt: skip
        dims = {"weight": (0,), "bias": (0,)}
    else:
        new = empty_linear(width if cols else module.in_features, width if rows else module.out_features, module)
        dims = {"weight": (0,) * rows + (1,) * cols, "bias": (0,) * rows}
    new = new.to(device=module.weight.device, dtype=module.weight.dtype)
    if index is None:
        return new
    with torch.no_grad():
        for key, along in dims.items():
            source = getattr(module, key, None)
            if source is None:
                continue
            kept = source.detach()
            for dim in along:
                kept = kept.index_select(dim, index.to(kept.device))
            getattr(new, key).copy_(kept)
            getattr(new, key).requires_grad_(source.requires_grad)
    return new


def narrow_stream(model: nn.Module, arch: dict, width: int, index: torch.Tensor | None = None) -> nn.Module:
    """Give `model`'s residual stream `width` channels, in place: with `index` (positions in the current stream,
    sorted), keeping those channels' weights; without, as empty modules for a saved model's weights to load into."""
    paths = stream_paths(model, arch)
    readers, writers = set(paths["readers"]), set(paths["writers"])
    for path in paths["tables"] + paths["norms"]:
        set_path(model, path, _narrowed(get_path(model, path), width, index, rows=False, cols=False))
    for path in dict.fromkeys(paths["readers"] + paths["writers"]):
        linear = get_path(model, path)
        set_path(model, path, _narrowed(linear, width, index, rows=path in writers, cols=path in readers))
    return model


def apply_layout(model: nn.Module, layout: dict) -> nn.Module:
    """Give a freshly built (full-size) `model` the per-layer shapes of `layout`, in place; weights load after."""
    if layout.get("version") != LAYOUT_VERSION:
        raise ValueError(f"{LAYOUT_KEY}: version {layout.get('version')!r} is not {LAYOUT_VERSION}; update compressor")
    arch, size = layout["family"], int(layout["head_size"])
    stack = get_path(model.base_model, arch["layers"])
    if len(stack) != len(layout["blocks"]):
        raise ValueError(f"{LAYOUT_KEY}: {len(layout['blocks'])} blocks for a model of {len(stack)} layers")
    full_heads = int(layout["num_heads"])
    full_ffn = int(layout["ffn_size"])
    for index, block in enumerate(layout["blocks"]):
        if block.get("removed"):
            marker = removal_marker(stack[index], arch["ffn_out"])
            skip_layer(model, stack, index, marker, bool(arch.get("layer_tuple")))
            continue
        if int(block["heads"]) != full_heads:
            shrink_attention(stack[index], arch, int(block["heads"]), size)
        if int(block["ffn"]) != full_ffn:
            shrink_ffn(stack[index], arch, int(block["ffn"]))
    if "hidden" in layout:  # the residual stream's width, where it was cut (absent otherwise)
        narrow_stream(model, arch, int(layout["hidden"]))
    return model


def pruned_class(base_name: str) -> type:
    """A subclass of transformers' `base_name` that applies the config's layout after building the stock model."""
    base = getattr(transformers, base_name)

    def __init__(self, config, *args, **kwargs):  # noqa: N807
        base.__init__(self, config, *args, **kwargs)
        layout = getattr(config, LAYOUT_KEY, None)
        if layout:
            apply_layout(self, layout)

    name = f"Pruned{base_name}"
    return type(name, (base,), {"__init__": __init__, "__module__": __name__, "__qualname__": name})
