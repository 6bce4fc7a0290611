"""A run repeated over seeds: the summary's statistics, the `--seeds` option, and a tiny two-seed run whose base
fine-tune is made once while everything after it is redrawn."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import tiny_recipe
from safetensors.torch import load_file
from typer.testing import CliRunner

from compressor.bench.quality import hits_string, read_hits
from compressor.cli import app
from compressor.core import outdir
from compressor.core.candidates import ORIGINAL_NAME
from compressor.core.errors import UserError
from compressor.pipeline import finetune, seeds
from compressor.recipe import RecipeError, parse_recipe
from compressor.report.seeds import render_seeds, summarize_seeds, verdict


def _report(hits: dict[str, np.ndarray], pairs: list[tuple[str, str]] = ()) -> dict:
    """A minimal report.json of one repeat: frontier rows and bench hits for `hits`, versus_references for
    `pairs` (member, reference)."""
    rows = [{"name": n, "role": "member" if "/" in n else "original", "runtime": "pytorch"} for n in hits]
    results = {n: {"accuracy": float(h.mean()), "hits": hits_string(h)} for n, h in hits.items()}
    versus = [{"name": r, "best": {"name": m}} for m, r in pairs]
    return {"frontier": rows, "bench": {"quality": {"results": results}}, "versus_references": versus}


def test_hits_round_trip() -> None:
    correct = np.array([True, False, False, True, True])
    assert hits_string(correct) == "10011"
    assert np.array_equal(read_hits("10011"), correct)


def test_summary_calls_a_clear_gap_ahead_and_a_noisy_one_level() -> None:
    rng = np.random.default_rng(0)
    n, reports = 400, {}
    for k in range(3):
        original = rng.random(n) < 0.80
        clear = original | (rng.random(n) < 0.5)  # right wherever the original is, and on half the rest: +~10 points
        noisy = rng.random(n) < 0.80  # as accurate as the original, right and wrong on other examples
        reports[k] = _report({ORIGINAL_NAME: original, "2x/pytorch": clear, "3x/pytorch": noisy})
    summary = summarize_seeds(reports, resamples=2000)
    gaps = {g["candidate"]: g for g in summary["gaps"]}
    assert set(gaps) == {"2x/pytorch", "3x/pytorch"} and summary["test_examples"] == n
    clear, noisy = gaps["2x/pytorch"], gaps["3x/pytorch"]
    assert clear["verdict"] == "ahead" and clear["ci95"][0] > 0 and clear["mean"] > 5
    assert noisy["verdict"] == "level" and noisy["ci95"][0] < 0 < noisy["ci95"][1]
    assert len(clear["per_seed"]) == 3 and clear["sd"] is not None
    assert clear["mean"] == pytest.approx(np.mean(list(clear["per_seed"].values())))
    assert "bootstrap" in summary["interval"]
    md = render_seeds(summary)
    assert "| vs original | 2x/pytorch | pytorch-original |" in md and "ahead" in md and "level" in md


def test_summary_pairs_members_with_references_and_leaves_out_partial_points() -> None:
    rng = np.random.default_rng(1)
    reports = {}
    for k in (0, 1):
        hits = {name: rng.random(200) < 0.8 for name in (ORIGINAL_NAME, "2x/pytorch", "reference/small/pytorch")}
        if k == 1:
            hits["4x/pytorch"] = rng.random(200) < 0.7  # in one repeat only
        reports[k] = _report(hits, [("2x/pytorch", "reference/small/pytorch")])
    summary = summarize_seeds(reports, resamples=500)
    kinds = {(g["comparison"], g["candidate"], g["versus"]) for g in summary["gaps"]}
    assert ("member vs reference", "2x/pytorch", "reference/small/pytorch") in kinds
    assert not any(g["candidate"] == "4x/pytorch" for g in summary["gaps"])
    assert any("4x/pytorch" in why and "[0]" in why for why in summary["left_out"])


def test_the_member_each_seed_chose_is_compared_with_the_reference_even_when_it_differs() -> None:
    """Seed 0 chose the 2x member against the reference, seed 1 the 4x: one 'chosen on validation' gap pairs each
    seed's own choice with the reference (exactly its per-seed accuracy difference), beside the fixed-name pairs of
    each member with the reference."""
    rng = np.random.default_rng(2)
    reports, chosen = {}, {0: "2x/onnx-int8", 1: "4x/onnx-int8"}
    for k in (0, 1):
        names = (ORIGINAL_NAME, "2x/onnx-int8", "4x/onnx-int8", "reference/small/onnx-int8")
        hits = {name: rng.random(300) < 0.8 for name in names}
        reports[k] = _report(hits, [(chosen[k], "reference/small/onnx-int8")])
    summary = summarize_seeds(reports, resamples=500)
    (gap,) = [g for g in summary["gaps"] if g["role"] == "chosen"]
    assert gap["chosen"] == {"0": "2x/onnx-int8", "1": "4x/onnx-int8"} and gap["versus"] == "reference/small/onnx-int8"
    for k in (0, 1):
        results = reports[k]["bench"]["quality"]["results"]
        expected = 100 * (results[chosen[k]]["accuracy"] - results["reference/small/onnx-int8"]["accuracy"])
        assert gap["per_seed"][str(k)] == pytest.approx(expected)
    fixed = {g["candidate"] for g in summary["gaps"] if g["comparison"] == "member vs reference"}
    assert fixed == {"2x/onnx-int8", "4x/onnx-int8"}
    assert "chosen on validation (best) vs reference" in render_seeds(summary)


def test_the_summary_names_the_cpu_of_each_repeat_and_says_when_they_differ() -> None:
    """Repeats resumed on another machine (a finished one kept from its report) chose their members on their own
    CPUs: seeds.md says so and names each; repeats on one CPU name it once."""
    rng = np.random.default_rng(3)
    reports = {k: _report({ORIGINAL_NAME: rng.random(50) < 0.8, "2x/pytorch": rng.random(50) < 0.8}) for k in (0, 1)}
    for k, model in ((0, "CPU A"), (1, "CPU B")):
        reports[k]["bench"]["cpu"] = {"model": model, "int8_features": "AVX2, VNNI"}
    summary = summarize_seeds(reports, resamples=100)
    assert summary["cpus"] == {"0": "CPU A (AVX2, VNNI)", "1": "CPU B (AVX2, VNNI)"}
    assert ("- timed on 2 CPUs (seed 0: CPU A (AVX2, VNNI); seed 1: CPU B (AVX2, VNNI)): each repeat chose its "
            "members on its own CPU") in render_seeds(summary)  # fmt: skip
    reports[1]["bench"]["cpu"]["model"] = "CPU A"
    assert "- timed on: CPU A (AVX2, VNNI)\n" in render_seeds(summarize_seeds(reports, resamples=100))


@pytest.mark.parametrize("low, high, words", [(0.1, 2.0, "ahead"), (-2.0, -0.1, "behind"), (-0.5, 1.0, "level")])
def test_verdict_reads_the_interval(low, high, words) -> None:
    assert verdict((low, high)) == words


@pytest.mark.parametrize("value", ["a,b", "", "1,1", "0,,1", "-1", "5000"])
def test_bad_seeds_option_is_one_line_exit_2(tmp_path, value) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: x\n")
    result = CliRunner().invoke(app, ["run", str(recipe), "--seeds", value])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "--seeds" in result.stderr and "Traceback" not in result.stderr


def test_seeds_parse_and_recipe_field() -> None:
    assert seeds.parse_seeds("0, 1,2") == [0, 1, 2]
    with pytest.raises(UserError, match="--seeds"):
        seeds.parse_seeds("1,x")
    assert parse_recipe({"seeds": [0, 2]}).seeds == [0, 2]
    with pytest.raises(RecipeError, match="seeds"):
        parse_recipe({"seeds": [1, 1]})


def test_repeat_recipe_holds_the_base_seed_and_moves_the_rest() -> None:
    recipe = parse_recipe({"seed": 7, "output_dir": "runs/x", "seeds": [0, 1]})
    zero, one = seeds.seed_recipe(recipe, 0), seeds.seed_recipe(recipe, 1)
    assert zero.seed == 7 and zero.base_finetune_seed == 7 and zero.output_dir == "runs/x/seed-0"
    assert one.seed == 7 + seeds.SEED_STRIDE and one.base_finetune_seed == 7 and one.seeds is None
    labels = ["neg", "pos"]
    key = finetune.finetune_key(recipe, recipe.model, labels)  # a plain run's base fine-tune ...
    assert finetune.finetune_key(one, one.model, labels, seed=one.base_finetune_seed) == key  # ... is every repeat's
    assert finetune.finetune_key(one, one.model, labels) != key  # while a reference's fine-tune is redrawn


BENCH = {"batch_sizes": [1], "seq_len": 16, "rounds": 2, "warmup": 1, "min_time_s": 0.01, "quantize_only": []}


@pytest.mark.e2e
def test_two_seeds_share_the_base_finetune_and_redraw_the_rest(tmp_path, tiny_model_dir, tiny_csv, cache_dir,
                                                               monkeypatch) -> None:  # fmt: skip
    """`run_seeds` over 0,1 on the tiny recipe: one base fine-tune (trained once, cached), two complete runs with
    different pruned weights, seeds.json / seeds.md over both; a rerun keeps both repeats."""
    calls = []
    real_train = finetune.train
    monkeypatch.setattr(finetune, "train", lambda *a, **k: calls.append(k["seed"]) or real_train(*a, **k))
    prune = {"criterion": {"name": "taylor"}, "target": 0.25, "steps": 1, "score_examples": 32,
             "finetune": {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 48}}  # fmt: skip
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "out", prune=prune, bench=BENCH))
    summary = seeds.run_seeds(recipe, [0, 1])
    assert calls == [0]  # the base fine-tune ran once, with the recipe's seed; the second repeat read the cache
    out = tmp_path / "out"
    reports = [json.loads((out / f"seed-{k}" / "report.json").read_text()) for k in (0, 1)]
    assert reports[1]["base_finetune"] == {"cached": reports[0]["base_finetune"]["cached"]}
    assert reports[0]["original"]["test"] == reports[1]["original"]["test"]  # the same task-tuned original
    weights = [load_file(out / f"seed-{k}" / "model" / "model.safetensors") for k in (0, 1)]
    assert any(not np.array_equal(weights[0][n].numpy(), weights[1][n].numpy()) for n in weights[0])
    assert (out / "seeds.md").exists() and json.loads((out / "seeds.json").read_text()) == summary
    assert summary["seed_of_repeat"] == {"0": 0, "1": seeds.SEED_STRIDE} and summary["base_seed"] == 0
    gaps = {g["candidate"]: g for g in summary["gaps"]}
    assert "pytorch-pruned" in gaps and set(gaps["pytorch-pruned"]["per_seed"]) == {"0", "1"}
    monkeypatch.setattr(seeds, "run_recipe", lambda *a, **k: pytest.fail("a finished repeat ran again"))
    assert seeds.run_seeds(recipe, [0, 1]) == summary
    for path in (out / "seed-0").iterdir():  # what another session restores: the report and the recipe alone
        if path.name not in (outdir.DONE_FILE, outdir.RESOLVED_FILE):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert seeds.run_seeds(recipe, [0, 1]) == summary


def test_seeds_refuse_a_directory_holding_a_single_run(tmp_path) -> None:
    out = tmp_path / "single"
    outdir.claim(outdir.RunDir(out, "new"), "name: x\n")  # what a plain run writes first
    outdir.finish(out)
    with pytest.raises(UserError, match="holds a single run"):
        seeds.run_seeds(parse_recipe({"output_dir": str(out)}), [0, 1])
