"""Recipe validation: every bad input gives one line naming the field, exit code 2, and nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compressor.recipe import Recipe, RecipeError, load_recipe, parse_recipe

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_validate(path: Path) -> None:
    recipe = load_recipe(path)
    assert isinstance(recipe, Recipe)


BAD = [
    # (recipe dict, substring the one-line error must contain)
    ({"modle": {}}, "modle: unknown key"),
    ({"model": {"sourc": "x"}}, "model.sourc: unknown key"),
    ({"prune": {"target": "half"}}, "prune.target"),
    ({"prune": {"target": 0}}, "prune.target: Input should be greater than 0"),
    ({"prune": {"target": 1.0}}, "prune.target: Input should be less than 1"),
    ({"prune": {"target": -0.2}}, "prune.target"),
    ({"prune": {"steps": 0}}, "prune.steps"),
    ({"prune": {"criterion": {"name": "nonsense"}}}, "unknown criterion 'nonsense'"),
    (
        {"prune": {"criterion": {"name": "taylor", "params": {"normalise": "layer"}}}},
        "params.normalise: unknown parameter",
    ),
    (
        {"prune": {"criterion": {"name": "taylor", "params": {"label_free": "yes"}}}},
        "params.label_free: Input should be a valid boolean (got 'yes')",
    ),
    ({"base_finetune": {"batch_size": 0}}, "base_finetune.batch_size"),
    ({"bench": {"batch_sizes": [8, 0]}}, "bench.batch_sizes"),
    ({"bench": {"batch_sizes": []}}, "bench.batch_sizes"),
    ({"data": {"text_fields": []}}, "data.text_fields"),
    ({"export": {"variants": ["fp16"]}}, "export.variants.0"),
    ({"prune": {"min_heads_per_layer": -1}}, "prune.min_heads_per_layer"),
]


@pytest.mark.parametrize(("data", "expected"), BAD, ids=[b[1] for b in BAD])
def test_bad_recipe_names_the_field(data: dict, expected: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(data)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_top_level_must_be_mapping() -> None:
    with pytest.raises(RecipeError, match="expected a YAML mapping"):
        parse_recipe(["a", "b"])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "compressor", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_cli_malformed_yaml_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {source: [unclosed\n")
    result = _cli("validate", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert "malformed YAML at line" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_unknown_key_exit_2_nothing_written(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "prune": {"targt": 0.5}}))
    result = _cli("run", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert "prune.targt: unknown key" in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_missing_recipe_file(tmp_path: Path) -> None:
    result = _cli("validate", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert result.returncode == 2
    assert "not found" in result.stderr


def test_cli_validate_ok() -> None:
    result = _cli("validate", str(ROOT / "recipes" / "bert_mnli_50pct.yaml"), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "criterion taylor" in result.stdout
