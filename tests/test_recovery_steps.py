"""Recovery as a list of registered steps (`prune.recovery: [rescale, finetune]`): the old names read as their
lists and run the same steps, an unknown step is refused in one line, and a step registered here (one class, as
a new module of `compressor.recovery.steps` would be) is run by the loop in the recipe's order."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch
import yaml
from conftest import cli

import compressor
from compressor.recipe import PruneSpec, RecipeError, TrainSpec, dump_recipe, parse_recipe
from compressor.recipe.template import starter_recipe
from compressor.recovery.steps import available, register, unregister

OLD_NAMES = [("finetune", ["finetune"]), ("rescale", ["rescale"]), ("rescale_finetune", ["rescale", "finetune"]),
             ("none", [])]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]  # this checkout's compressor, not an installed one
TUNED = {"model": {"task_tuned": True}}
SPEC = {"target": 0.5, "steps": 2, "score_examples": 32, "score_batch_size": 16, "sample_size": 48,
        "finetune": TrainSpec(epochs=1, lr=5e-4, batch_size=16, max_examples=48)}  # fmt: skip


@pytest.mark.parametrize(("name", "steps"), OLD_NAMES)
def test_an_old_name_is_the_list_of_its_steps(name, steps):
    """Each old name parses to the same recipe as its list, keeps what it meant (post-training for rescale and
    none, a fine-tune for finetune and rescale_finetune) and is still what the report calls it."""
    old = parse_recipe({**TUNED, "prune": {"recovery": name}})
    listed = parse_recipe({**TUNED, "prune": {"recovery": steps}})
    assert old == listed and listed.prune.recovery_steps == steps
    assert listed.prune.resolved_recovery == name
    assert listed.prune.post_training == (name in ("rescale", "none"))
    assert (listed.prune.recovery_finetune is not None) == (name in ("finetune", "rescale_finetune"))
    assert parse_recipe(yaml.safe_load(dump_recipe(old))) == old  # the resolved recipe writes the list
    assert yaml.safe_load(dump_recipe(old))["prune"]["recovery"] == steps


def test_without_recovery_the_steps_follow_finetune():
    """`recovery: null` keeps its meaning: [finetune], or [] with `finetune: null` (not post-training)."""
    assert PruneSpec().recovery_steps == ["finetune"]
    bare = PruneSpec(finetune=None)
    assert bare.recovery_steps == [] and bare.resolved_recovery == "none" and not bare.post_training
    assert PruneSpec(recovery=["finetune", "rescale"]).resolved_recovery == "finetune+rescale"
    with pytest.raises(
        RecipeError, match=r"prune\.recovery: 'rescale_finetune' fine-tunes; expected finetune settings"
    ):
        parse_recipe({"prune": {"recovery": ["rescale", "finetune"], "finetune": None}})


@pytest.mark.parametrize(("value", "got"), [("rescal", "'rescal'"), (["rescale", "distil"], "['rescale', 'distil']")])
def test_an_unknown_step_is_refused_in_one_line_naming_the_field_and_the_steps(value, got):
    with pytest.raises(RecipeError) as err:
        parse_recipe({**TUNED, "prune": {"recovery": value}})
    bad = value if isinstance(value, str) else value[1]
    assert str(err.value) == (
        f"recipe: prune.recovery: unknown recovery step '{bad}'; expected a list of steps from "
        f"['finetune', 'rescale'] (or one of the names ['finetune', 'rescale', 'rescale_finetune', 'none']) "
        f"(got {got})"
    )
    with pytest.raises(RecipeError, match=r"^recipe: prune\.recovery: expected each step once, got \['rescale', "):
        parse_recipe({**TUNED, "prune": {"recovery": ["rescale", "rescale"]}})


def test_cli_refuses_an_unknown_step_exit_2_nothing_written(tmp_path: Path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "prune": {"recovery": ["rescale", "x"]}}))
    for command in ("validate", "run"):
        result = cli(command, str(path), cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert "prune.recovery: unknown recovery step 'x'; expected a list of steps from ['finetune', 'rescale']" in (
            result.stderr
        )
    assert not (tmp_path / "out").exists()


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_list_runs_the_same_steps_as_the_old_name(task):
    """`recovery: rescale_finetune` and `[rescale, finetune]` prune to the same masks and the same weights, their
    step logs with the same entries in the same order (rescale, then the fine-tune)."""
    model, tok, train, val = task
    runs = {}
    for recovery in ("rescale_finetune", ["rescale", "finetune"]):
        spec = PruneSpec(**SPEC, recovery=recovery)
        result = compressor.prune(copy.deepcopy(model), tok, train, spec, validation=val, seed=0)
        runs[str(recovery)] = result
    old, listed = runs.values()
    assert [list(e) for e in old.steps] == [list(e) for e in listed.steps]
    keys = list(listed.steps[0])
    assert (
        keys.index("rescale")
        < keys.index("val_after_rescale")
        < keys.index("finetune")
        < keys.index("val_after_finetune")
    )
    assert torch.equal(old.masks.heads, listed.masks.heads)
    for name, weight in _state(old.model).items():
        assert torch.allclose(weight, _state(listed.model)[name], atol=1e-6), name
    assert [e["val_after_finetune"] for e in old.steps] == [e["val_after_finetune"] for e in listed.steps]


@pytest.fixture
def counting_steps():
    """Two no-op steps registered for one test, each counting when it is made and called; unregistered after."""
    calls: list[tuple] = []

    def step_class(name: str):
        class Counting:
            def __init__(self, loop) -> None:
                calls.append(("made", name))
                self.loop = loop

            def __call__(self, masks, step: int) -> dict:
                calls.append((name, step, int(masks.heads.sum())))
                return {"heads_alive": int(masks.heads.sum())}

        return Counting

    for name in ("count_a", "count_b"):
        register(name)(step_class(name))
    yield calls
    for name in ("count_a", "count_b"):
        unregister(name)


def test_a_registered_step_is_run_by_the_loop_in_order(task, counting_steps, caplog):
    """A step class registered under a new name is a recipe's recovery step at once (the schema, `compressor init`'s
    template): the loop makes each listed step once, calls them after every selection in the listed order, logs each
    one's entry and validation under its name, and a list of steps that trains nothing is post-training."""
    model, tok, train, val = task
    assert {"count_a", "count_b"} <= set(available())
    assert "registered: count_a, count_b, finetune, rescale" in starter_recipe()
    spec = PruneSpec(**SPEC, recovery=["count_b", "finetune", "count_a"])
    with caplog.at_level(logging.INFO, logger="compressor"):
        result = compressor.prune(model, tok, train, spec, validation=val, seed=0)
    assert counting_steps == [("made", "count_b"), ("made", "count_a"),
                              ("count_b", 0, 9), ("count_a", 0, 9), ("count_b", 1, 6), ("count_a", 1, 6)]  # fmt: skip
    for entry in result.steps:
        keys = [k for k in entry if k.removeprefix("val_after_") in ("count_a", "count_b", "finetune")]
        assert keys == ["count_b", "val_after_count_b", "finetune", "val_after_finetune", "count_a",
                        "val_after_count_a"]  # fmt: skip
        assert entry["count_a"] == {"heads_alive": entry["heads_left"]}
    step_line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1/2:"))
    assert step_line.index("after count_b") < step_line.index("after fine-tune") < step_line.index("after count_a")
    post = PruneSpec(**SPEC, recovery=["count_a"])
    assert post.post_training and post.recovery_finetune is None and post.resolved_recovery == "count_a"
    unregister("count_a")
    with pytest.raises(
        RecipeError, match=r"unknown recovery step 'count_a'; expected a list of steps from \['count_b'"
    ):
        parse_recipe({**TUNED, "prune": {"recovery": ["count_a"]}})
