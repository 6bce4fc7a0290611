"""Bad input: one clear line naming the problem and the expected value, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from conftest import make_rows, tiny_recipe
from typer.testing import CliRunner

from compressor.cli import app
from compressor.core import outdir
from compressor.recipe import dump_recipe, load_recipe
from compressor.testing import tiny_model


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir, tiny_csv) -> dict[str, Path]:
    """Broken inputs next to good ones."""
    root = tmp_path_factory.mktemp("faults")
    not_model = root / "not_a_model"
    not_model.mkdir()
    (not_model / "weights.txt").write_text("hello")
    albert = root / "albert"
    from transformers import AlbertConfig

    AlbertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=37, num_hidden_layers=2).save_pretrained(
        albert
    )
    tuned = root / "tuned_2_labels"
    model = tiny_model("bert", num_labels=2)
    model.config.id2label = {0: "negative", 1: "positive"}
    model.config.label2id = {"negative": 0, "positive": 1}
    model.save_pretrained(tuned)
    for path in tiny_model_dir.iterdir():
        if path.name.startswith(("vocab", "tokenizer", "special_tokens")):
            (tuned / path.name).write_bytes(path.read_bytes())
    three = root / "three_labels.csv"
    with three.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows({**r, "label": i % 3} for i, r in enumerate(make_rows(60)))
    empty_split = root / "splits"
    empty_split.mkdir()
    for split, n in (("train", 40), ("validation", 0), ("test", 10)):
        with (empty_split / f"{split}.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=["text", "label"])
            writer.writeheader()
            writer.writerows(make_rows(n) if n else [])
    a_file = root / "a_file"
    a_file.write_text("x")
    return {
        "model": tiny_model_dir,
        "data": tiny_csv,
        "not_model": not_model,
        "albert": albert,
        "tuned": tuned,
        "three": three,
        "empty_split": empty_split,
        "a_file": a_file,
    }


CASES = [
    # id, recipe overrides (callable on world), expected substring
    ("wrong type", lambda w: {"prune.steps": "four"}, "prune.steps: Input should be a valid integer"),
    ("target zero", lambda w: {"prune.target": 0.0}, "prune.target: Input should be greater than 0"),
    ("target one", lambda w: {"prune.target": 1.0}, "prune.target: Input should be less than 1"),
    ("target removes all", lambda w: {"prune.target": 0.97}, "prune.target: 0.97 would remove all 12 heads"),
    ("min above heads", lambda w: {"prune.min_heads_per_layer": 5}, "min_heads_per_layer: 5 exceeds the 4 heads"),
    ("min vs target", lambda w: {"prune.min_heads_per_layer": 3}, "expected ≤ 2"),
    ("unknown criterion", lambda w: {"prune.criterion": {"name": "magic"}}, "unknown criterion 'magic'"),
    ("unknown param", lambda w: {"prune.criterion": {"name": "taylor", "params": {"steps": 3}}}, "params.steps"),
    ("model missing", lambda w: {"model.source": str(w["model"]) + "_nope"}, "does not exist"),
    ("not a model", lambda w: {"model.source": str(w["not_model"])}, "is not a model directory (no config.json)"),
    ("unsupported arch", lambda w: {"model.source": str(w["albert"])}, "architecture 'albert' is not supported"),
    ("text field", lambda w: {"data.text_fields": ["review"]}, "data.text_fields: field 'review' not in dataset"),
    ("label field", lambda w: {"data.label_field": "stars"}, "data.label_field: field 'stars' not in dataset"),
    (
        "labels outside model",
        lambda w: {"model": {"source": str(w["tuned"]), "task_tuned": True}, "data.source": str(w["three"])},
        "do not match the task-tuned model's 2 labels",
    ),
    (
        "empty split",
        lambda w: {"data.source": str(w["empty_split"])},
        "data.splits: split 'validation' (validation.csv) is empty",
    ),
    ("data missing", lambda w: {"data.source": str(w["a_file"]) + ".csv"}, "data.source: path"),
    ("batch size", lambda w: {"base_finetune": {"batch_size": 0}}, "base_finetune.batch_size"),
    ("bench batch", lambda w: {"bench": {"batch_sizes": [-1]}}, "bench.batch_sizes"),
    ("output not writable", lambda w: {"output_dir": str(w["a_file"] / "out")}, "output_dir: "),
    ("output dir empty", lambda w: {"output_dir": ""}, "output_dir: String should have at least 1 character"),
    (
        "criterion value",
        lambda w: {"prune.criterion": {"name": "taylor", "params": {"normalize": "lyer"}}},
        "prune.criterion.params.normalize: expected one of ['layer', 'none'], got 'lyer'",
    ),
    (
        "criterion range",
        lambda w: {"prune.criterion": {"name": "attribution", "params": {"steps": 0}}},
        "params.steps: Input should be greater than or equal to 1",
    ),
    ("splits incomplete", lambda w: {"data.splits": {"train": "train"}}, "data.splits: missing ['validation']"),
    ("seed negative", lambda w: {"seed": -1}, "seed: Input should be greater than or equal to 0"),
]


@pytest.mark.parametrize(("overrides", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2(tmp_path, world, cache_dir, overrides, expected) -> None:
    out = tmp_path / "out"
    recipe = tiny_recipe(world["model"], world["data"], out, **overrides(world))
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compressor: error: "), result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists(), "nothing may be written on bad input"
    assert not cache_dir.exists()


def fake_run(out: Path, resolved: str) -> None:
    """An unfinished compressor run in `out` (identity, resolved recipe, an empty checkpoint folder)."""
    (out / "state").mkdir(parents=True)
    outdir.claim(outdir.RunDir(out, "new"), resolved)
    outdir.finish(out)


def test_unfinished_run_is_not_finished(tmp_path, tiny_model_dir, tiny_csv, cache_dir) -> None:
    """A run directory with no report.json is resumed, never treated as done (no --force needed)."""
    out = tmp_path / "out"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, out)))
    fake_run(out, dump_recipe(load_recipe(recipe)))
    result = CliRunner().invoke(app, ["run", str(recipe)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["status"] == "complete"
    again = CliRunner().invoke(app, ["run", str(recipe)])
    assert again.exit_code == 2 and "pass --force" in again.stderr


def test_unfinished_run_of_another_recipe_is_refused(tmp_path, tiny_model_dir, tiny_csv, cache_dir) -> None:
    """Checkpoints are never resumed under a changed recipe; --force starts over."""
    out = tmp_path / "out"
    fake_run(out, "name: something else\n")
    (out / "state" / "step_000").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, out)))
    result = CliRunner().invoke(app, ["run", str(recipe)])
    assert result.exit_code == 2
    assert "holds an unfinished run of a different recipe" in result.stderr
    assert (out / "state" / "step_000").exists() and not (out / "report.json").exists()
    forced = CliRunner().invoke(app, ["run", str(recipe), "--force"])
    assert forced.exit_code == 0, forced.output
    assert json.loads((out / "report.json").read_text())["status"] == "complete"


def test_recipe_not_utf8_is_one_line(tmp_path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "not a UTF-8 text file" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("where", ["foreign", "cwd"])
def test_force_never_deletes_a_directory_that_is_not_a_run(tmp_path, tiny_model_dir, tiny_csv, monkeypatch, where):
    """--force replaces an earlier run; a typo'd output_dir pointing at someone's files is refused, intact."""
    target = tmp_path / "precious"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work")
    monkeypatch.chdir(target if where == "cwd" else tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, "." if where == "cwd" else target)))
    result = CliRunner().invoke(app, ["run", str(recipe), "--force"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "output_dir: " in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in target.iterdir()) == ["thesis.tex"]


def test_unfinished_run_resumes_when_only_the_spelling_changed(tmp_path, tiny_model_dir, tiny_csv, cache_dir) -> None:
    """An unfinished run whose resolved recipe uses an older spelling (`bench.seq_len: 16` for `seq_lens: [16]`)
    is the same recipe: it resumes without --force."""
    out = tmp_path / "out"
    recipe = tiny_recipe(tiny_model_dir, tiny_csv, out, bench={"enabled": False, "seq_lens": [16]})
    old = {**recipe, "bench": {"enabled": False, "seq_len": 16}}
    fake_run(out, yaml.safe_dump(old))
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["status"] == "complete"
