"""Recipe validation: every bad input gives one line naming the field, exit code 2, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import cli

from compressor.pruning.selection import check_against_model
from compressor.recipe import Recipe, RecipeError, dump_recipe, load_recipe, parse_recipe, settings_of

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
    ({"export": {"int8": {"min_agreement": 99}}}, "export.int8.min_agreement: Input should be less than or equal to 1"),
    ({"export": {"int8": {"fallback_nodes": -1}}}, "export.int8.fallback_nodes: Input should be greater than or equal"),
    ({"export": {"int8": {"smooth_scope": "some"}}}, "export.int8.smooth_scope: Input should be 'all', 'cheap' or "),
    ({"export": {"int8": {"smooth_outlier_ratio": 8}}}, "export.int8.smooth_outlier_ratio: only applies with smooth_"),
    ({"export": {"int8": {"smooth_outlier_ratio": 1}}}, "export.int8.smooth_outlier_ratio: Input should be greater"),
    ({"prune": {"min_heads_per_layer": -1}}, "prune.min_heads_per_layer"),
    ({"base_finetune": {"epochs": float("inf")}}, "base_finetune.epochs: Input should be a finite number"),
    ({"prune": {"finetune": {"lr": float("nan")}}}, "prune.finetune.lr: Input should be a finite number"),
    ({"bench": {"min_time_s": float("-inf")}}, "bench.min_time_s: Input should be a finite number"),
    ({"base_finetune": {"epochs": 1e6}}, "base_finetune.epochs: Input should be less than or equal to 1000"),
    ({"prune": {"criterion": {"name": "l0", "params": {"lam": float("inf")}}}}, "params.lam: Input should be a finite"),
    ({"prune": {"target": "0.5"}}, "prune.target: Input should be a valid number, not text"),
    ({"prune": {"steps": "4"}}, "prune.steps: Input should be a valid integer, not text"),
    ({"base_finetune": {"lr": "5e-5"}}, "base_finetune.lr: Input should be a valid number, not text"),
    ({"prune": {"steps": 4.0}}, "prune.steps: Input should be a valid integer (got 4.0)"),
    ({"seed": True}, "seed: Input should be a valid integer (got True)"),
    ({"base_finetune": {"epochs": True}}, "base_finetune.epochs: Input should be a valid number (got True)"),
    ({"export": {"enabled": "yes"}}, "export.enabled: Input should be a valid boolean (got 'yes')"),
    (
        {"model": {"source": "builtin:minilm-l6", "trust_remote_code": True}},
        "model.trust_remote_code: built-in models ship no remote code",
    ),
    ({"model": {"trust_remote_code": True}}, "model.trust_remote_code: built-in models ship no remote code"),
]


@pytest.mark.parametrize(("data", "expected"), BAD, ids=[b[1] for b in BAD])
def test_bad_recipe_names_the_field(data: dict, expected: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(data)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_numbers_are_yaml_numbers_and_integers_serve_as_floats(tmp_path: Path) -> None:
    """Strict numbers: an integer where a float is expected is fine, and `5e-5` unquoted is a number (YAML 1.2;
    YAML 1.1 would read it as text), but the same value in quotes is text and refused."""
    recipe = parse_recipe({"base_finetune": {"epochs": 3, "lr": 0.001}, "export": {"atol": 1}})
    assert recipe.base_finetune.epochs == 3.0 and isinstance(recipe.export.atol, float)
    path = tmp_path / "r.yaml"
    path.write_text("base_finetune: {lr: 5e-5, epochs: 1e1}\nprune: {target: .5E-0}\n")
    recipe = load_recipe(path)
    assert (recipe.base_finetune.lr, recipe.base_finetune.epochs, recipe.prune.target) == (5e-5, 10.0, 0.5)
    path.write_text('base_finetune: {lr: "5e-5"}\n')
    with pytest.raises(RecipeError, match=r"base_finetune\.lr: .*not text: write the number without quotes"):
        load_recipe(path)


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_resolved_recipe_reparses_to_the_same_recipe(path: Path) -> None:
    """The runner compares an unfinished run's `recipe.resolved.yaml` with the new recipe (resume): the strict
    models must read back what `dump_recipe` wrote."""
    recipe = load_recipe(path)
    assert parse_recipe(yaml.safe_load(dump_recipe(recipe))) == recipe


DUPLICATES = [
    ("seed: 0\nname: a\nseed: 1\n", "seed: given twice (lines 1 and 3); a recipe key may appear once"),
    ("prune:\n  target: 0.5\n  steps: 2\n  target: 0.25\n", "prune.target: given twice (lines 2 and 4)"),
    ("prune: {criterion: {name: taylor, name: l0}}\n", "prune.criterion.name: given twice (lines 1 and 1)"),
    ("data:\n  text_fields: [a]\n  'text_fields': [b]\n", "data.text_fields: given twice (lines 2 and 3)"),
]


@pytest.mark.parametrize(("text", "expected"), DUPLICATES, ids=[d[1].split(":")[0] for d in DUPLICATES])
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_the_same_key_in_different_mappings_and_merge_overrides_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        "base_finetune: &ft {epochs: 1, lr: 1.0e-4}\n"
        "prune:\n  finetune:\n    <<: *ft\n    lr: 2.0e-4\n"  # a merge then an explicit key overrides it
    )
    recipe = load_recipe(path)
    assert (recipe.base_finetune.lr, recipe.prune.finetune.lr, recipe.prune.finetune.epochs) == (1e-4, 2e-4, 1.0)


def test_cli_validate_refuses_a_key_given_twice_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\nseed: 0\nseed: 1\n")
    expected = "compressor: error: seed: given twice (lines 2 and 3); a recipe key may appear once"
    for command in ("validate", "run"):
        result = cli(command, str(path), cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.strip() == expected, result.stderr
    assert not (tmp_path / "out").exists()


def test_top_level_must_be_mapping() -> None:
    with pytest.raises(RecipeError, match="expected a YAML mapping"):
        parse_recipe(["a", "b"])


def test_cli_malformed_yaml_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {source: [unclosed\n")
    result = cli("validate", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert "malformed YAML at line" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_unknown_key_exit_2_nothing_written(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "prune": {"targt": 0.5}}))
    result = cli("run", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert "prune.targt: unknown key" in result.stderr
    assert not (tmp_path / "out").exists()


def test_settings_give_the_recipe_an_edited_file_would(tmp_path: Path) -> None:
    """`--set` with dotted keys and YAML values: the same recipe as the file edited by hand, the file untouched."""
    data = {"output_dir": str(tmp_path / "out"), "prune": {"steps": 3, "criterion": {"name": "taylor"}}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    settings = [
        "prune.steps=5",
        "prune.budget={kind: flops, values: [0.5]}",
        "bench.seq_len=32",
        "prune.criterion.name=l0",
    ]
    budget = {"kind": "flops", "values": [0.5]}
    edited = {**data, "prune": {"steps": 5, "budget": budget, "criterion": {"name": "l0"}}}
    edited["bench"] = {"seq_len": 32}
    assert dump_recipe(load_recipe(path, settings_of(settings))) == dump_recipe(parse_recipe(edited))
    assert yaml.safe_load(path.read_text()) == data


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["steps"], "--set: expected KEY=VALUE such as prune.steps=4, got 'steps'"),
        (["prune..steps=3"], "--set: expected a dotted key of recipe fields"),
        (["prune.units=[heads"], "--set prune.units: malformed YAML value"),
        (["prune.steps=3", "prune.steps=4"], "--set prune.steps: given twice"),
        (["prune.steps.x=3"], "--set prune.steps.x: 'prune.steps' is 3, not a section"),
        (["prune.stepz=3"], "prune.stepz: unknown key"),
        (["prune.steps=0"], "prune.steps: Input should be greater than or equal to 1"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(tmp_path: Path, settings: list[str], message: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "prune": {"steps": 3}}))
    with pytest.raises(RecipeError) as err:
        load_recipe(path, settings_of(settings))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cli_bad_setting_exit_2_nothing_written(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out")}))
    result = cli("run", str(recipe), "--set", "prune.stepz=3", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "compressor: error: " + f"{recipe}: prune.stepz: unknown key (not allowed here)"
    ]
    assert not (tmp_path / "out").exists()


def test_cli_missing_recipe_file(tmp_path: Path) -> None:
    result = cli("validate", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert result.returncode == 2
    assert "not found" in result.stderr


def test_cli_validate_ok() -> None:
    result = cli("validate", str(ROOT / "recipes" / "bert_mnli_50pct.yaml"), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "criterion taylor" in result.stdout


@pytest.mark.parametrize(
    "data",
    [
        {"name": "x" * 10**6},
        {"x" * 10**6: 1},
        {"bench": {"batch_sizes": [0] * 10**5}},
        {"data": {"text_fields": [list(range(10**5))]}},
        {"prune": {"criterion": {"name": "taylor", "params": {"normalize": "y" * 10**6}}}},
        {"seed": 10**5000},
    ],
    ids=["long string", "long key", "long list", "nested list", "criterion param", "huge int"],
)
def test_messages_quote_a_short_prefix_of_the_value(data: dict) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(data)
    assert len(str(err.value)) < 300 and "\n" not in str(err.value)


def test_alias_bomb_and_oversized_files_are_refused_quickly(tmp_path: Path) -> None:
    import time

    lines = ["a0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 30)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join([*lines, "name: *a29"]))
    start = time.perf_counter()
    with pytest.raises(RecipeError, match="more than 100 YAML aliases"):
        load_recipe(bomb)
    assert time.perf_counter() - start < 2
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "# padding\n" * 200_000)
    with pytest.raises(RecipeError, match="expected a recipe under 1048576 bytes"):
        load_recipe(big)


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("base: &ft {epochs: 1, lr: 1.0e-4}\n")
    with pytest.raises(RecipeError, match="base: unknown key"):  # the alias works; the helper key is refused
        load_recipe(path)
    path.write_text("base_finetune: &ft {epochs: 1, lr: 1.0e-4}\nprune: {finetune: *ft}\n")
    assert load_recipe(path).prune.finetune.lr == 1e-4


@pytest.mark.parametrize(
    ("target", "steps", "heads", "shape", "ok"),
    [
        (0.5, 6, 12, "linear", True),
        (0.5, 7, 12, "linear", False),
        (0.25, 3, 12, "linear", True),
        (0.1, 2, 12, "linear", False),
        (0.5, 4, 12, "geometric", True),
        (0.5, 6, 12, "geometric", False),  # 1, 2, 4, 4, 5, 6: the fourth step would remove none
    ],
)
def test_steps_that_would_remove_no_head_are_refused(target, steps, heads, shape, ok) -> None:
    recipe = parse_recipe({"prune": {"target": target, "steps": steps, "schedule": shape}})
    if ok:
        check_against_model(recipe, heads, 512)
    else:
        with pytest.raises(RecipeError, match=r"^prune\.steps: .* expected at most"):
            check_against_model(recipe, heads, 512)


def test_lengths_are_checked_against_position_embeddings() -> None:
    recipe = parse_recipe({"data": {"max_length": 600}, "bench": {"enabled": False}})
    with pytest.raises(RecipeError, match=r"^data\.max_length: 600 tokens exceed the model's 512"):
        check_against_model(recipe, 12, 512)
    check_against_model(recipe, 12, None)  # no position limit (e.g. relative positions)
    bench = parse_recipe({"data": {"max_length": 64}, "bench": {"seq_lens": [64, 1024]}})
    with pytest.raises(RecipeError, match=r"^bench\.seq_lens: 1024"):
        check_against_model(bench, 12, 512)
    speed = {"kind": "speedup", "value": 2.0, "seq_len": 1024}  # the latency table would be measured at 1024 tokens
    budget = parse_recipe({"prune": {"budget": speed, "units": ["heads", "neurons"]}, "bench": {"enabled": False}})
    with pytest.raises(RecipeError, match=r"^prune\.budget\.seq_len: 1024 tokens exceed the model's 512"):
        check_against_model(budget, 12, 512)
