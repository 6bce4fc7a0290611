"""One peer pruning run, inside that peer's own virtual environment (started by `benchmarks/peers.py`).

Standalone on purpose: it imports torch, transformers and the peer library only (TextPruner needs transformers 4.x,
which compressor does not run on). It loads the task-tuned base model directory, prunes it with the peer to a target
number of attention heads and FFN neurons, and writes what was kept as 0/1 masks over the original units
(`result.json`) together with the pruned model's logits on a probe batch (`probe_logits.pt`): `peers.py` replays the
masks with compressor's own slicing on the same base model and checks the logits agree, so the model it measures is
exactly the peer's.

- TextPruner 1.1: `TransformerPruner` with `pruning_method='iterative'`, uneven heads and FFN widths per layer
  (`head_even_masking=False`, `ffn_even_masking=False`), gradient importance on the scoring batches. The pruner runs
  with `keep_shape=True` (weights of pruned units zeroed, which computes the same function as slicing them) and its
  masks are read back; MPNet, which TextPruner does not list, gets a module map of the same kind as its BERT one.
- Torch-Pruning 1.6.1: `MetaPruner` over the dependency graph, `GroupTaylorImportance`, global ranking, heads as
  whole units (`prune_num_heads`) and FFN neurons; the embedding width (the residual stream) is not pruned, so the
  units are the same kinds as ours. The kept units are read off the pruned weights by matching them with the
  original's rows; the pruned model is also saved whole (`torch.save`).

Usage: python peers_worker.py JOB.json   (written by peers.py: peer, model_dir, batches, probe, heads, ffn, iters, out)
"""

from __future__ import annotations

import json
import sys
import time
from importlib import metadata
from pathlib import Path

import torch
import transformers
from torch import nn


class _Total(float):
    """TextPruner's per-layer average target whose product with the layer count is the exact total (it multiplies
    the average by the layer count; a plain float could come out one unit off)."""

    def __new__(cls, total: int, layers: int):
        value = super().__new__(cls, total / layers)
        value.total, value.layers = total, layers
        return value

    def __mul__(self, other):
        return self.total if other == self.layers else float(self) * other

    __rmul__ = __mul__


def _model(model_dir: str) -> nn.Module:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager")
    return model.eval()


def _register_mpnet() -> None:
    """TextPruner's module map for MPNet (`mpnet.encoder.layer.N.attention.attn.{q,k,v,o}`, FFN as BERT)."""
    from textpruner.model_map import MODEL_MAP
    from textpruner.model_utils.model_structure import ModelStructure

    class MPNetStructure(ModelStructure):
        MODEL_PREFIX = "mpnet."
        ENCODER_PREFIX = r"encoder.layer.[0-9]+\."
        LAYER_PATTERNS = dict(
            query=r"attention.attn.q$",
            key=r"attention.attn.k$",
            value=r"attention.attn.v$",
            att_dense=r"attention.attn.o$",
            interm_dense=r"intermediate.dense$",
            output_dense=r"output.dense$",
        )
        ATTENTION_PREFIX = ("attention.attn",)
        ATTENTION_LAYERS = ("q", "k", "v")
        MHA_LAYERS = ("q", "k", "v", "att_dense")

    MODEL_MAP.setdefault("mpnet", {"structure": MPNetStructure})


def textpruner(job: dict, model: nn.Module, batches: list[dict]) -> dict:
    """Masks of TextPruner's iterative pruning to `job["heads"]` heads and `job["ffn"]` FFN neurons in total."""
    from textpruner import GeneralConfig, TransformerPruner, TransformerPruningConfig

    _register_mpnet()
    layers = model.config.num_hidden_layers
    config = TransformerPruningConfig(
        target_ffn_size=_Total(job["ffn"], layers),
        target_num_of_heads=_Total(job["heads"], layers),
        pruning_method="iterative",
        n_iters=job["iters"],
        head_even_masking=False,
        ffn_even_masking=False,
    )
    general = GeneralConfig(use_device="cpu", output_dir=str(Path(job["out"]) / "textpruner"))
    pruner = TransformerPruner(model, transformer_pruning_config=config, general_config=general)
    start = time.perf_counter()
    pruner.prune(dataloader=batches, keep_shape=True, save_model=False)
    seconds = time.perf_counter() - start
    return {"heads": pruner.head_mask.bool(), "neurons": pruner.ffn_mask.bool(), "seconds": seconds, "model": model}


def _attention_modules(model: nn.Module) -> list[tuple[nn.Module, nn.Linear, nn.Linear, nn.Linear, nn.Linear]]:
    """Per layer: (self-attention module, query, key, value, output projection) of a BERT or MPNet classifier."""
    out = []
    for layer in model.base_model.encoder.layer:
        if hasattr(layer.attention, "self"):  # BERT
            a = layer.attention.self
            out.append((a, a.query, a.key, a.value, layer.attention.output.dense))
        else:  # MPNet
            a = layer.attention.attn
            out.append((a, a.q, a.k, a.v, a.o))
    return out


def _kept_rows(original: torch.Tensor, pruned: torch.Tensor, group: int = 1) -> list[int]:
    """Original row-group ids (groups of `group` rows) that `pruned`'s rows are, in order (exact match)."""
    orig = original.reshape(-1, group * original.shape[1])
    new = pruned.reshape(-1, group * pruned.shape[1])
    kept, start = [], 0
    for n, row in enumerate(new):
        index = next((i for i in range(start, len(orig)) if torch.equal(orig[i], row)), None)
        if index is None:
            raise ValueError(f"row {n} of the pruned weight is no row of the original's (after row {start - 1})")
        kept.append(index)
        start = index + 1
    return kept


def torch_pruning(job: dict, model: nn.Module, batches: list[dict]) -> dict:
    """Torch-Pruning's Taylor pruning to `job["heads"]` heads and `job["ffn"]` FFN neurons (ratios of the totals)."""
    import torch_pruning as tp

    layers = model.base_model.encoder.layer
    original = {k: v.clone() for k, v in model.state_dict().items()}
    attn = _attention_modules(model)
    heads = int(model.config.num_attention_heads)
    size = attn[0][1].out_features // heads
    total_heads, ffn_total = heads * len(layers), layers[0].intermediate.dense.out_features * len(layers)
    num_heads = {linear: heads for a in attn for linear in a[1:4]}
    ffn, qkv = tuple(layer.intermediate.dense for layer in layers), tuple(num_heads)  # a global ranking in each
    names = {m: n for n, m in model.named_modules()}
    ignored = [model.classifier] + [a[4] for a in attn] + [layer.output.dense for layer in layers]
    pooler = getattr(model.base_model, "pooler", None)
    ignored += [pooler] if pooler is not None else []
    example = {k: v[:2] for k, v in batches[0].items() if k != "labels"}
    encoder = model.base_model.encoder
    if hasattr(encoder, "relative_attention_bias"):  # MPNet: see `_detached_position_bias`
        encoder.compute_position_bias = _detached_position_bias(encoder.compute_position_bias)
    pruner = tp.pruner.MetaPruner(
        model,
        example,
        importance=tp.importance.GroupTaylorImportance(),
        global_pruning=True,
        iterative_steps=job["iters"],
        pruning_ratio=0.0,  # own scopes below: one shared scope would count Q/K/V widths it never prunes
        pruning_ratio_dict={ffn: 1 - (job["ffn"] + 0.5) / ffn_total, qkv: 1 - (job["heads"] + 0.5) / total_heads},
        num_heads=num_heads,
        prune_num_heads=True,
        prune_head_dims=False,
        head_pruning_ratio=1 - job["heads"] / total_heads,
        ignored_layers=ignored,
        output_transform=lambda out: out.logits.sum(),
    )
    start = time.perf_counter()
    for _ in range(job["iters"]):
        model.zero_grad()
        for batch in batches:
            model(**batch).loss.backward()
        pruner.step()
        for a, q, _, _, _ in attn:  # the attention modules' head counts, as Torch-Pruning's BERT example sets them
            a.num_attention_heads = q.out_features // size
            a.all_head_size = q.out_features
            if hasattr(a, "o"):  # MPNet: the relative position bias is shared at the original head count
                _narrow_position_bias(a, _kept_rows(original[names[q] + ".weight"], q.weight.detach(), size))
    seconds = time.perf_counter() - start
    model.zero_grad()
    return {**_torch_pruning_masks(model, original, attn, size), "seconds": seconds, "model": model}


def _detached_position_bias(compute):
    """MPNet's encoder computes one relative position bias at the original head count and adds it in every layer.
    Traced as it is, Torch-Pruning's graph couples every layer's heads through that one embedding (so it would
    remove the same head ids everywhere and slice the shared embedding); detached, the bias is a constant to the
    graph, the embedding stays whole and each layer's attention takes its kept heads' columns
    (`_narrow_position_bias`). The forward values are unchanged; only the embedding gets no gradient."""

    def detached(*args, **kwargs):
        return compute(*args, **kwargs).detach()

    return detached


def _select_bias(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of an MPNet self-attention: the shared position bias narrowed to its kept heads."""
    ids = module.kept_head_ids
    if kwargs.get("position_bias") is not None:
        kwargs["position_bias"] = kwargs["position_bias"].index_select(1, ids)
    elif len(args) > 2 and args[2] is not None:  # forward(hidden_states, attention_mask, position_bias, ...)
        args = (*args[:2], args[2].index_select(1, ids), *args[3:])
    return args, kwargs


def _narrow_position_bias(attention: nn.Module, kept: list[int]) -> None:
    """Make a pruned MPNet self-attention take only its kept heads' columns of the encoder's position bias."""
    if not hasattr(attention, "kept_head_ids"):
        attention.register_forward_pre_hook(_select_bias, with_kwargs=True)
    attention.kept_head_ids = torch.tensor(kept, dtype=torch.long)


def _torch_pruning_masks(model: nn.Module, original: dict, attn: list, size: int) -> dict:
    """The kept heads and FFN neurons of a Torch-Pruning result, by matching its weights with the original's."""
    names = {m: n for n, m in model.named_modules()}
    heads = torch.zeros(len(attn), original[names[attn[0][1]] + ".weight"].shape[0] // size, dtype=torch.bool)
    layers = model.base_model.encoder.layer
    neurons = torch.zeros(len(layers), original[names[layers[0].intermediate.dense] + ".weight"].shape[0]).bool()
    for i, (_, q, _, _, _) in enumerate(attn):
        heads[i, _kept_rows(original[names[q] + ".weight"], q.weight.detach(), size)] = True
        ffn = layers[i].intermediate.dense
        neurons[i, _kept_rows(original[names[ffn] + ".weight"], ffn.weight.detach())] = True
    return {"heads": heads, "neurons": neurons}


PEERS = {"textpruner": textpruner, "torch-pruning": torch_pruning}


def main(job_file: str) -> None:
    job = json.loads(Path(job_file).read_text())
    torch.manual_seed(0)
    torch.set_num_threads(job.get("threads") or torch.get_num_threads())
    model = _model(job["model_dir"])
    batches = torch.load(job["batches"], weights_only=True)
    probe = torch.load(job["probe"], weights_only=True)
    result = PEERS[job["peer"]](job, model, batches)
    pruned = result.pop("model").eval()
    with torch.inference_mode():
        logits = pruned(**probe).logits
    out = Path(job["out"])
    torch.save(logits, out / "probe_logits.pt")
    if job["peer"] == "torch-pruning" and not hasattr(pruned.base_model.encoder, "relative_attention_bias"):
        torch.save(pruned, out / "model.pt")  # whole (MPNet's carries hooks of this script: its masks only)
    summary = {
        "heads_mask": result["heads"].int().tolist(),
        "ffn_mask": result["neurons"].int().tolist(),
        "heads_left": int(result["heads"].sum()),
        "ffn_left": int(result["neurons"].sum()),
        "prune_seconds": result["seconds"],
        "versions": {
            job["peer"]: metadata.version(job["peer"]),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    (out / "result.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1])
