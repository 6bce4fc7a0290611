"""Save → reload round trips (our loader and plain transformers with the shipped code), old 4.57-era directories,
tokenizer, model card and refusals."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertTokenizer

import compressor
from compressor.surgery import portable
from compressor.surgery.arch import (
    UnsupportedArchitectureError,
    arch_spec,
    get_path,
    layers,
    original_ffn_size,
    present_heads,
    present_neurons,
    pruned_heads,
    pruned_neurons,
    removed_layers,
)
from compressor.surgery.checkpoint import CARD_FILE, PLAN_FILE, load_pruned, read_plan, read_unit_plan, save_pruned
from compressor.surgery.cost import count_parameters, encoder_flops, model_stats
from compressor.surgery.portable import LAYOUT_KEY
from compressor.surgery.slicing import EmptyAttention, empty_layers, prune_heads, pruned_copy, remove_layers
from compressor.testing import ARCH_ATTN, ARCHS, SDPA_ARCHS, tiny_batch, tiny_model, tiny_unsupported_model

LAYERS, HEADS = 3, 4
INPUTS = {k: v for k, v in tiny_batch(batch=3, seq=9).items() if k != "labels"}  # the last row is half padding
PLANS = {
    "uneven": {0: [1, 3], 2: [0]},
    "one head left": {0: [0, 1, 2], 1: [1, 2, 3], 2: [0, 2, 3]},
    "empty layer": {0: [2], 1: [0, 1, 2, 3]},
    "all empty": {layer: list(range(HEADS)) for layer in range(LAYERS)},
}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "good", "bad", "##s", "##ly"]
REMOTE_FILE = "modeling_compressor.py"


@cache
def base(arch: str, attention: str = "eager", n_layers: int = LAYERS) -> torch.nn.Module:
    return tiny_model(arch, attention=attention, layers=n_layers, heads=HEADS, head_size=8)


def logits(model: torch.nn.Module, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(**INPUTS, **kwargs).logits


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].shape == sb[key].shape and torch.equal(sa[key], sb[key]), key


def assert_same_units(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Same units left, by original id, read through compressor's bookkeeping."""
    assert present_heads(a) == present_heads(b)
    assert present_neurons(a) == present_neurons(b)
    assert removed_layers(a) == removed_layers(b)
    assert original_ffn_size(a) == original_ffn_size(b)


def remote(path: Path, attention: str = "eager") -> torch.nn.Module:
    """What a user without compressor does: plain transformers running the shipped modeling file."""
    model = AutoModelForSequenceClassification.from_pretrained(
        path, trust_remote_code=True, attn_implementation=attention
    )
    assert type(model).__module__.startswith("transformers_modules.")  # the shipped copy, not compressor's
    return model.eval()


def config_json(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


# --- every kind of pruning at once: uneven heads, uneven FFN, an empty attention block, a removed layer ---------

COMBINED_LAYERS = 4


def combined(arch: str, attention: str = "eager") -> torch.nn.Module:
    """Layer 0: 2 heads, half the FFN; layer 1: no head (EmptyAttention), FFN less 5; layer 2: 3 heads, full FFN;
    layer 3: removed whole."""
    model = base(arch, attention, COMBINED_LAYERS)
    width = original_ffn_size(model)
    heads = {0: [1, 3], 1: list(range(HEADS)), 2: [2]}
    neurons = {0: list(range(0, width, 2)), 1: list(range(5))}
    return remove_layers(pruned_copy(model, heads, neurons), [3])


@pytest.mark.parametrize("arch,attention", ARCH_ATTN)
def test_any_plan_reloads_through_both_routes(tmp_path: Path, arch: str, attention: str) -> None:
    """`load_pruned` and plain `from_pretrained(trust_remote_code=True)` both rebuild the pruned model exactly:
    same weights, same units, logits (padded batch) and every hidden state within 1e-5 of the in-memory model."""
    pruned = combined(arch, attention)
    width = original_ffn_size(pruned)
    assert empty_layers(pruned) == [1, 3] and removed_layers(pruned) == [3]
    assert [len(n) for n in present_neurons(pruned)] == [width - len(range(0, width, 2)), width - 5, width, 0]
    assert max_diff(logits(pruned), logits(base(arch, attention, COMBINED_LAYERS))) > 1e-3  # pruning mattered
    path = save_pruned(pruned, tmp_path / f"{arch}-{attention}")

    saved = config_json(path)
    assert saved[LAYOUT_KEY]["blocks"] == [
        {"heads": 2, "ffn": width - len(range(0, width, 2))},
        {"heads": 0, "ffn": width - 5},
        {"heads": 3, "ffn": width},
        {"removed": True},
    ]
    assert saved.get("intermediate_size", saved.get("hidden_dim")) == width  # the original config is saved
    assert saved.get("num_attention_heads", saved.get("n_heads")) == HEADS
    assert "compressor_ffn_size" not in saved
    assert not hasattr(pruned.config, LAYOUT_KEY) and not hasattr(pruned.config, "auto_map")  # in-memory untouched

    with torch.no_grad():
        reference = pruned(**INPUTS, output_hidden_states=True)
    for loaded in (load_pruned(path, attn_implementation=attention), remote(path, attention)):
        assert loaded.config._attn_implementation == attention
        assert not loaded.training
        assert_same_units(loaded, pruned)
        assert_same_weights(loaded, pruned)
        with torch.no_grad():
            out = loaded(**INPUTS, output_hidden_states=True)
        assert max_diff(out.logits, reference.logits) <= 1e-5
        assert len(out.hidden_states) == COMBINED_LAYERS + 1 == len(reference.hidden_states)
        for mine, theirs in zip(out.hidden_states, reference.hidden_states, strict=True):
            assert max_diff(mine, theirs) <= 1e-5
        blocks = layers(loaded)
        assert type(blocks[3]).__name__ == "SkippedLayer" and not list(blocks[3].parameters())
        assert type(get_path(blocks[1], arch_spec(loaded).attention)).__name__ == "EmptyAttention"


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_transformers_refuses_without_remote_code(tmp_path: Path, arch: str) -> None:
    """Without `trust_remote_code` transformers builds the stock shapes and refuses the pruned weights."""
    path = save_pruned(combined(arch), tmp_path / f"refuse-{arch}")
    for kwargs in ({}, {"trust_remote_code": False}):
        with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
            AutoModelForSequenceClassification.from_pretrained(path, **kwargs)


def test_plain_transformers_refuses_a_model_with_only_removed_layers(tmp_path: Path) -> None:
    """No other shape differs: the removed layer's zero-size marker is what makes stock transformers refuse."""
    pruned = remove_layers(pruned_copy(base("bert"), {}), [1])
    path = save_pruned(pruned, tmp_path / "removed-only")
    assert max_diff(logits(remote(path)), logits(pruned)) == 0.0  # the shipped code loads it right
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForSequenceClassification.from_pretrained(path)


@pytest.mark.parametrize("arch", ["bert", "distilbert", "electra"])
def test_shipped_modeling_file_is_portable_plus_footer(tmp_path: Path, arch: str) -> None:
    pruned = combined(arch)
    path = save_pruned(pruned, tmp_path / f"shipped-{arch}")
    base_name = type(base(arch)).__name__
    source = (path / REMOTE_FILE).read_text()
    assert source == inspect.getsource(portable) + f'\n\nPruned{base_name} = pruned_class("{base_name}")\n'
    assert config_json(path)["auto_map"] == {
        "AutoModelForSequenceClassification": f"modeling_compressor.Pruned{base_name}"
    }
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in the shipped file"
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "warnings", "torch", "transformers"}, imported


LOAD_WITHOUT_COMPRESSOR = """
import json, sys
sys.modules["compressor"] = None  # any import of compressor now raises ImportError
import torch
from transformers import AutoModelForSequenceClassification
inputs = {k: torch.tensor(v) for k, v in json.loads(sys.argv[1]).items()}
out = {}
for path in sys.argv[2:]:
    model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
    with torch.no_grad():
        out[path] = model(**inputs).logits.tolist()
assert not [m for m, mod in sys.modules.items() if m.startswith("compressor") and mod is not None]
print(json.dumps(out))
"""


def test_shipped_code_loads_where_compressor_cannot_be_imported(tmp_path: Path) -> None:
    """A fresh interpreter in which `import compressor` fails loads the pruned models (default SDPA) right."""
    paths = {arch: save_pruned(combined(arch), tmp_path / f"nocomp-{arch}") for arch in ("roberta", "distilbert")}
    batch = json.dumps({k: v.tolist() for k, v in INPUTS.items()})
    result = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_COMPRESSOR, batch, *map(str, paths.values())],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for arch, path in paths.items():
        assert max_diff(torch.tensor(out[str(path)]), logits(combined(arch))) <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_unpruned_model_is_saved_as_a_plain_directory(tmp_path: Path, arch: str) -> None:
    model = base(arch)
    path = save_pruned(model, tmp_path / f"plain-{arch}")
    saved = config_json(path)
    assert LAYOUT_KEY not in saved and "auto_map" not in saved and "pruned_heads" not in saved
    assert not (path / REMOTE_FILE).exists()
    empty = {"heads": {}, "neurons": {}, "layers": [], "hidden": []}
    assert read_unit_plan(path) == {**empty, "ffn_size": original_ffn_size(model)}
    plain = AutoModelForSequenceClassification.from_pretrained(path, attn_implementation="eager").eval()
    assert type(plain) is type(model)
    for loaded in (plain, load_pruned(path, attn_implementation="eager")):
        assert_same_weights(loaded, model)
        assert torch.equal(logits(loaded), logits(model))
        assert pruned_heads(loaded) == {} and pruned_neurons(loaded) == {} and removed_layers(loaded) == []


# --- directories written by compressor under transformers 4.57 -----------------------------------------------


def write_old_format(model: torch.nn.Module, path: Path, case: str) -> Path:
    """`model` saved as compressor wrote it under transformers 4.57: the config's `pruned_heads` (read by 4.57
    itself) and our other bookkeeping, no layout or shipped code, a format-2 plan file (format 1 for "heads only",
    none for "resaved": a user re-saved the plain-transformers load), and the pruned weights as they are.

    "uniform ffn": every layer kept the same FFN width, so 4.57 compressor wrote that width as the config's
    `intermediate_size` (`hidden_dim` for DistilBERT) and the original under `compressor_ffn_size`.
    """
    path.mkdir()
    config = json.loads(model.config.to_json_string(use_diff=False))
    for key in (LAYOUT_KEY, "auto_map", "dtype", "_attn_implementation_autoset"):
        config.pop(key, None)
    config |= {"transformers_version": "4.57.1", "torch_dtype": "float32"}
    config["pruned_heads"] = {str(k): v for k, v in pruned_heads(model).items()}
    original = original_ffn_size(model)
    widths = {len(n) for n in present_neurons(model)}
    if case in ("uniform ffn", "resaved"):
        assert len(widths) == 1 and not removed_layers(model)
        config["intermediate_size" if "intermediate_size" in config else "hidden_dim"] = widths.pop()
        config["compressor_ffn_size"] = original
    plan = {
        "format": 2,
        "model_type": model.config.model_type,
        "pruned_heads": config["pruned_heads"],
        "empty_layers": empty_layers(model),
        "pruned_neurons": {str(k): v for k, v in pruned_neurons(model).items()},
        "removed_layers": removed_layers(model),
        "ffn_size": original,
        "plain_loadable": case == "uniform ffn",
        "metadata": {},
    }
    if case == "heads only":
        assert not pruned_neurons(model)
        plan = {k: plan[k] for k in ("pruned_heads", "empty_layers", "metadata")} | {"format": 1}
        config.pop("pruned_neurons", None)
        config.pop("removed_layers", None)
    if case != "resaved":
        (path / PLAN_FILE).write_text(json.dumps(plan, indent=2))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def old_model(arch: str, case: str) -> torch.nn.Module:
    width = original_ffn_size(base(arch))
    if case == "heads only":
        return pruned_copy(base(arch), PLANS["empty layer"])
    if case in ("uniform ffn", "resaved"):  # every layer keeps the same number of neurons, different ones
        return pruned_copy(base(arch), {0: [1], 1: [0, 1, 2, 3]}, {i: list(range(i, width, 4)) for i in range(LAYERS)})
    heads, neurons = {0: [1, 3], 1: list(range(HEADS))}, {0: list(range(0, width, 2)), 1: list(range(5))}
    return remove_layers(pruned_copy(base(arch), heads, neurons), [2])


@pytest.mark.parametrize("case", ["uneven", "uniform ffn", "resaved", "heads only"])
@pytest.mark.parametrize("arch", ARCHS)
def test_old_format_directories_still_load(tmp_path: Path, arch: str, case: str) -> None:
    """4.57-era directories load through `load_pruned` with the same weights and logits, and re-saving one
    writes the new format (original config, layout, shipped code) that plain transformers loads."""
    pruned = old_model(arch, case)
    path = write_old_format(pruned, tmp_path / f"old-{arch}", case)
    assert LAYOUT_KEY not in config_json(path)
    loaded = load_pruned(path, attn_implementation="eager")
    assert_same_units(loaded, pruned)
    assert_same_weights(loaded, pruned)
    assert torch.equal(logits(loaded), logits(pruned))
    torch.testing.assert_close(logits(load_pruned(path)), logits(pruned), atol=1e-5, rtol=0)  # default SDPA
    assert not hasattr(loaded.config, "compressor_ffn_size")

    new = save_pruned(loaded, tmp_path / f"new-{arch}")
    saved = config_json(new)
    assert saved.get("intermediate_size", saved.get("hidden_dim")) == original_ffn_size(base(arch))
    assert "compressor_ffn_size" not in saved and LAYOUT_KEY in saved
    for again in (load_pruned(new, attn_implementation="eager"), remote(new)):
        assert_same_units(again, pruned)
        assert torch.equal(logits(again), logits(pruned))


@pytest.mark.parametrize("arch", ["bert", "deberta-v2"])
def test_layernorm_weights_under_legacy_names_load(tmp_path: Path, arch: str) -> None:
    """A directory whose LayerNorm weights carry the legacy names (`gamma`, `beta`: older checkpoints, and what
    transformers 5.5's `save_pretrained` writes) loads through `load_pruned` to the same weights and logits, as
    transformers loads such a file; every other name is read as it is."""
    from safetensors.torch import load_file

    pruned = combined(arch)
    path = save_pruned(pruned, tmp_path / arch)
    state = load_file(str(path / "model.safetensors"))
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in state.items()}  # fmt: skip
    assert sum(k.endswith(("LayerNorm.gamma", "LayerNorm.beta")) for k in legacy) >= 2
    save_file(legacy, str(path / "model.safetensors"), metadata={"format": "pt"})
    loaded = load_pruned(path, attn_implementation="eager")
    assert_same_weights(loaded, pruned)
    assert torch.equal(logits(loaded), logits(pruned.eval()))


def test_layout_disagreeing_with_the_plan_is_refused(tmp_path: Path) -> None:
    """`load_pruned` refuses a layout that contradicts the plan (either edited) or has another version."""
    path = save_pruned(combined("bert"), tmp_path / "tampered")
    config = config_json(path)
    config[LAYOUT_KEY]["blocks"][0]["heads"] = 3
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"config.json's {LAYOUT_KEY} does not match {PLAN_FILE}"):
        load_pruned(path)
    config[LAYOUT_KEY]["blocks"][0]["heads"] = 2
    config[LAYOUT_KEY]["version"] = 99
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"{LAYOUT_KEY} has version 99, not 1"):
        load_pruned(path)
    with pytest.raises(ValueError, match=f"{LAYOUT_KEY}: version 99 is not 1"):
        remote(path)  # the shipped code refuses it too
    config[LAYOUT_KEY]["version"] = 1
    (path / "config.json").write_text(json.dumps(config))
    assert torch.equal(logits(load_pruned(path, attn_implementation="eager")), logits(combined("bert")))
    plan = json.loads((path / PLAN_FILE).read_text())
    plan["pruned_heads"]["0"] = [1]  # the plan now says layer 0 kept 3 heads; the layout (and weights) say 2
    (path / PLAN_FILE).write_text(json.dumps(plan))
    with pytest.raises(ValueError, match=f"config.json's {LAYOUT_KEY} does not match {PLAN_FILE}"):
        load_pruned(path)


# --- the compressor loader on head plans; rounds; tokenizer; card; refusals ---------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(PLANS))
def test_own_loader_round_trip_is_bit_identical(tmp_path: Path, arch: str, case: str) -> None:
    pruned = pruned_copy(base(arch), PLANS[case])
    path = save_pruned(pruned, tmp_path / "model")
    loaded = load_pruned(path, attn_implementation="eager")
    assert present_heads(loaded) == present_heads(pruned)
    assert pruned_heads(loaded) == pruned_heads(pruned) == {k: sorted(v) for k, v in PLANS[case].items()}
    assert_same_weights(loaded, pruned)
    assert torch.equal(logits(loaded), logits(pruned))
    assert read_plan(path) == {k: sorted(v) for k, v in PLANS[case].items()}
    saved = json.loads((path / PLAN_FILE).read_text())
    assert saved["model_type"] == arch and saved["empty_layers"] == empty_layers(pruned)


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_multi_round_save_reload_prune_again(tmp_path: Path, arch: str) -> None:
    """Rounds separated by save/reload keep referring to original ids, through both loaders, also when the second
    round starts from the model plain transformers loaded with the shipped code."""
    first = save_pruned(pruned_copy(base(arch), {0: [0, 2]}), tmp_path / f"r1-{arch}")
    reference = pruned_copy(base(arch), {0: [0, 2, 3], 2: [1]})
    for start, name in ((load_pruned(first, attn_implementation="eager"), "ours"), (remote(first), "remote")):
        prune_heads(start, {0: [0, 3], 2: [1]})
        second = save_pruned(start, tmp_path / f"r2-{arch}-{name}")
        assert read_plan(second) == {0: [0, 2, 3], 2: [1]}
        assert (second / REMOTE_FILE).read_text().endswith(f'= pruned_class("{type(base(arch)).__name__}")\n')
        for loaded in (load_pruned(second, attn_implementation="eager"), remote(second)):
            assert_same_weights(loaded, reference)
            assert torch.equal(logits(loaded), logits(reference))


def test_replaying_the_plan_on_a_loaded_model_is_idempotent(tmp_path: Path) -> None:
    path = save_pruned(pruned_copy(base("roberta"), PLANS["empty layer"]), tmp_path / "model")
    loaded = load_pruned(path, attn_implementation="eager")
    before = logits(loaded)
    prune_heads(loaded, read_plan(path))
    assert isinstance(loaded.roberta.encoder.layer[1].attention, EmptyAttention)
    assert torch.equal(logits(loaded), before)


@pytest.mark.parametrize("arch", ARCHS)
def test_sdpa_load_matches_eager(tmp_path: Path, arch: str) -> None:
    """The default load is SDPA for every architecture that has it (ELECTRA included since transformers 5), eager
    for the others (DeBERTa-v2, MPNet)."""
    pruned = pruned_copy(base(arch), PLANS["empty layer"])
    path = save_pruned(pruned, tmp_path / "model")
    fast = compressor.load_pruned(path)
    assert fast.config._attn_implementation == ("sdpa" if arch in SDPA_ARCHS else "eager")
    torch.testing.assert_close(logits(fast), logits(pruned), atol=1e-5, rtol=0)


def test_tokenizer_is_saved_and_reloads(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    tokenizer = BertTokenizer(vocab=str(vocab))  # transformers 5 takes `vocab`; `vocab_file=` is silently ignored
    assert len(tokenizer) == len(VOCAB)
    path = save_pruned(pruned_copy(base("bert"), PLANS["uneven"]), tmp_path / "model", tokenizer=tokenizer)
    reloaded = AutoTokenizer.from_pretrained(path)
    text = ["the film was goods", "bad badly"]
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(reloaded("goodly")["input_ids"]) == ["[CLS]", "good", "##ly", "[SEP]"]


def test_model_card_and_stats(tmp_path: Path) -> None:
    original, pruned = base("bert"), pruned_copy(base("bert"), PLANS["empty layer"])
    path = save_pruned(pruned, tmp_path / "model", original=original, seq_len=32, metadata={"recipe": "tiny"})
    stats = model_stats(original, pruned, 32)
    assert json.loads((path / PLAN_FILE).read_text())["stats"] == json.loads(json.dumps(stats))
    assert stats["original"]["parameters"] == count_parameters(original)
    assert stats["pruned"]["parameters"] == count_parameters(pruned) < count_parameters(original)
    assert stats["pruned"]["encoder_flops_per_example"] == encoder_flops(pruned, 32)
    assert stats["flop_ratio"] == encoder_flops(original, 32) / encoder_flops(pruned, 32) > 1
    assert stats["pruned"]["heads_per_layer"] == [3, 0, 4] and stats["empty_layers"] == [1]
    card = (path / CARD_FILE).read_text()
    for number in (count_parameters(original), count_parameters(pruned), encoder_flops(pruned, 32)):
        assert f"{number:,}" in card
    assert "| 1 | 0 / 4 | 0, 1, 2, 3 |" in card and "| 0 | 3 / 4 | 2 |" in card
    assert "compressor.load_pruned" in card and "- recipe: tiny" in card
    assert "trust_remote_code=True" in card and REMOTE_FILE in card

    plain = save_pruned(original, tmp_path / "plain", original=original)
    card = (plain / CARD_FILE).read_text()
    assert "A plain transformers directory" in card and "trust_remote_code" not in card


def test_no_card_without_original(tmp_path: Path) -> None:
    path = save_pruned(pruned_copy(base("bert"), PLANS["uneven"]), tmp_path / "model")
    assert not (path / CARD_FILE).exists()
    assert "stats" not in json.loads((path / PLAN_FILE).read_text())


def test_save_refuses_unsupported_before_writing(tmp_path: Path) -> None:
    model = tiny_unsupported_model("albert")
    with pytest.raises(UnsupportedArchitectureError, match="architecture 'albert'"):
        save_pruned(model, tmp_path / "model")
    assert list(tmp_path.iterdir()) == []
    model.save_pretrained(tmp_path / "plain")
    with pytest.raises(UnsupportedArchitectureError, match="architecture 'albert'"):
        load_pruned(tmp_path / "plain")


def test_overwrite_is_atomic_and_complete(tmp_path: Path) -> None:
    first = save_pruned(pruned_copy(base("bert"), PLANS["uneven"]), tmp_path / "model")
    second = save_pruned(pruned_copy(base("bert"), PLANS["empty layer"]), tmp_path / "model")
    assert first == second and read_plan(second) == PLANS["empty layer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_unpruned_directory_and_missing_weights(tmp_path: Path) -> None:
    base("electra").save_pretrained(tmp_path / "plain")
    assert read_plan(tmp_path / "plain") == {}
    assert torch.equal(logits(load_pruned(tmp_path / "plain", attn_implementation="eager")), logits(base("electra")))
    torch.testing.assert_close(logits(load_pruned(tmp_path / "plain")), logits(base("electra")), atol=1e-5, rtol=0)
    (tmp_path / "plain" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_pruned(tmp_path / "plain")


@pytest.mark.parametrize("arch", ARCHS)
def test_layout_saved_before_attention_norm_was_declared_still_loads(tmp_path: Path, arch: str) -> None:
    """A layout without `attention_norm` (saved before architectures declared where their attention block normalises)
    loads to the same logits: the legacy reading of the block agrees with every architecture's declaration."""
    pruned = combined(arch)
    path = save_pruned(pruned, tmp_path / arch)
    config = config_json(path)
    assert config[LAYOUT_KEY]["family"]["attention_norm"] == arch_spec(arch).norms.attention_norm
    del config[LAYOUT_KEY]["family"]["attention_norm"]
    (path / "config.json").write_text(json.dumps(config))
    assert max_diff(logits(load_pruned(path, attn_implementation="eager")), logits(pruned)) < 1e-5
