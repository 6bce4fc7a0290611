"""Save → reload round trips (our loader and plain transformers), tokenizer, model card and refusals."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertTokenizerFast

import compressor
from compressor.surgery.arch import UnsupportedArchitectureError, present_heads
from compressor.surgery.checkpoint import CARD_FILE, PLAN_FILE, load_pruned, read_plan, save_pruned
from compressor.surgery.cost import count_parameters, encoder_flops, model_stats
from compressor.surgery.slicing import EmptyAttention, empty_layers, prune_heads, pruned_copy
from compressor.testing import ARCHS, tiny_batch, tiny_model, tiny_unsupported_model

LAYERS, HEADS = 3, 4
INPUTS = {k: v for k, v in tiny_batch(batch=3, seq=9).items() if k != "labels"}
PLANS = {
    "uneven": {0: [1, 3], 2: [0]},
    "one head left": {0: [0, 1, 2], 1: [1, 2, 3], 2: [0, 2, 3]},
    "empty layer": {0: [2], 1: [0, 1, 2, 3]},
    "all empty": {layer: list(range(HEADS)) for layer in range(LAYERS)},
}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "good", "bad", "##s", "##ly"]


@cache
def base(arch: str) -> torch.nn.Module:
    return tiny_model(arch, layers=LAYERS, heads=HEADS, head_size=8)


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**INPUTS).logits


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].shape == sb[key].shape and torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(PLANS))
def test_own_loader_round_trip_is_bit_identical(tmp_path: Path, arch: str, case: str) -> None:
    pruned = pruned_copy(base(arch), PLANS[case])
    path = save_pruned(pruned, tmp_path / "model")
    loaded = load_pruned(path, attn_implementation="eager")
    assert present_heads(loaded) == present_heads(pruned)
    assert loaded.config.pruned_heads == pruned.config.pruned_heads
    assert_same_weights(loaded, pruned)
    assert torch.equal(logits(loaded), logits(pruned))
    assert read_plan(path) == {k: sorted(v) for k, v in PLANS[case].items()}
    saved = json.loads((path / PLAN_FILE).read_text())
    assert saved["model_type"] == arch and saved["empty_layers"] == empty_layers(pruned)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", ["uneven", "one head left"])
def test_plain_transformers_loads_when_no_layer_is_empty(tmp_path: Path, arch: str, case: str) -> None:
    pruned = pruned_copy(base(arch), PLANS[case])
    path = save_pruned(pruned, tmp_path / "model")
    vanilla = AutoModelForSequenceClassification.from_pretrained(path, attn_implementation="eager")
    assert_same_weights(vanilla, pruned)
    assert torch.equal(logits(vanilla), logits(pruned))


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_multi_round_save_reload_prune_again(tmp_path: Path, arch: str) -> None:
    """Rounds separated by save/reload keep referring to original ids, through both loaders."""
    first = save_pruned(pruned_copy(base(arch), {0: [0, 2]}), tmp_path / "r1")
    model = load_pruned(first, attn_implementation="eager")
    prune_heads(model, {0: [0, 3], 2: [1]})
    second = save_pruned(model, tmp_path / "r2")
    assert read_plan(second) == {0: [0, 2, 3], 2: [1]}
    reference = pruned_copy(base(arch), {0: [0, 2, 3], 2: [1]})
    for loaded in (
        load_pruned(second, attn_implementation="eager"),
        AutoModelForSequenceClassification.from_pretrained(second, attn_implementation="eager"),
    ):
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
    """The default (SDPA) load works for every architecture, falling back to eager where SDPA is missing."""
    pruned = pruned_copy(base(arch), PLANS["empty layer"])
    path = save_pruned(pruned, tmp_path / "model")
    fast = compressor.load_pruned(path)
    torch.testing.assert_close(logits(fast), logits(pruned), atol=1e-5, rtol=0)


def test_tokenizer_is_saved_and_reloads(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
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
    assert torch.equal(logits(load_pruned(tmp_path / "plain")), logits(base("electra")))
    (tmp_path / "plain" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_pruned(tmp_path / "plain")
