"""benchmarks/peers.py and its worker: the logic that brings a peer's pruned model into our process (units read off
its weights, exact layer-count targets), reads our members from a family run, and steers the speed-matched search.
The peers themselves run in their own environments (the benchmark builds them); these tests need neither."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from conftest import bench_script, family_report, one_target_report, pruned_section

from compressor.pruning.units import masks_to_plan, pruned_units_copy
from compressor.testing import randomize, tiny_batch, tiny_model

worker = bench_script("peers_worker")
peers = bench_script("peers")


def _alive(model, heads: dict, neurons: dict) -> dict:
    layers, n_heads, ffn = 3, model.config.num_attention_heads, model.config.intermediate_size
    alive = {"heads": torch.ones(layers, n_heads, dtype=torch.bool), "neurons": torch.ones(layers, ffn).bool()}
    for layer, ids in heads.items():
        alive["heads"][layer, ids] = False
    for layer, ids in neurons.items():
        alive["neurons"][layer, ids] = False
    return alive


@pytest.mark.parametrize("arch", ["bert", "mpnet"])
def test_units_read_off_a_sliced_model_are_the_ones_kept(arch):
    """A model sliced elsewhere (here by our own surgery) gives back exactly the heads and neurons it kept, and
    replaying them on the original reproduces its logits."""
    original = randomize(tiny_model(arch, layers=3, heads=4)).eval()
    alive = _alive(original, {0: [1], 1: [0, 3], 2: [0, 1, 2]}, {0: [0, 5, 6], 2: list(range(10))})
    sliced = pruned_units_copy(original, masks_to_plan(alive)).eval()
    state = {k: v.clone() for k, v in original.state_dict().items()}
    attn = worker._attention_modules(sliced)
    size = original.config.hidden_size // original.config.num_attention_heads
    found = worker._torch_pruning_masks(sliced, state, attn, size)
    assert torch.equal(found["heads"], alive["heads"])
    assert torch.equal(found["neurons"], alive["neurons"])
    replay = pruned_units_copy(original, masks_to_plan(found)).eval()
    batch = {k: v for k, v in tiny_batch().items() if k in ("input_ids", "attention_mask")}
    with torch.inference_mode():
        assert torch.allclose(replay(**batch).logits, sliced(**batch).logits, atol=1e-6)


def test_kept_rows_refuses_weights_that_are_not_the_originals():
    original = torch.arange(12.0).reshape(6, 2)
    assert worker._kept_rows(original, original[[1, 4]]) == [1, 4]
    assert worker._kept_rows(original, original[[2, 3, 4, 5]], group=2) == [1, 2]
    with pytest.raises(ValueError, match="row 0 of the pruned weight is no row"):
        worker._kept_rows(original, original[[1]] + 0.5)


def test_per_layer_target_multiplies_back_to_the_exact_total():
    """TextPruner multiplies its per-layer average by the layer count: 55 heads over 6 layers must stay 55."""
    target = worker._Total(55, 6)
    assert target * 6 == 55 and 6 * target == 55 and isinstance(target * 6, int)
    assert float(target) == pytest.approx(55 / 6)


def _member(label: str, step: int, heads: int, model_dir: str, speedup: float | None = 2.0) -> dict:
    budget = {"target": 2.0, "flop_ratio": 1.0, "measured_speedup": speedup}
    return {"target": 2.0, "label": label, "step": step, "pruned": pruned_section(heads, 3072, model_dir),
            "budget": budget}  # fmt: skip


def test_members_are_read_from_a_family_report(tmp_path):
    """Label, measured speed-up, units, steps, the step log's prune and recovery seconds, and the member's model
    found inside the run directory though the report names it where the run was made."""
    steps = [{"seconds": 10.0, "finetune": {"seconds": 6.0}}, {"seconds": 12.0, "finetune": {"seconds": 7.0}}]
    member = _member("2x", 2, 50, "runs/x/members/2x/model", speedup=2.01)
    (tmp_path / "members" / "2x" / "model").mkdir(parents=True)
    (tmp_path / "report.json").write_text(json.dumps(family_report([], steps, members=[member])))
    (target,) = peers.targets_from_run(tmp_path)
    assert (target.label, target.speedup, target.heads, target.ffn, target.steps) == ("2x", 2.01, 50, 3072, 2)
    assert target.prune_seconds == 9.0 and target.recovery_seconds == 13.0
    assert target.model_dir == str(tmp_path / "members" / "2x" / "model")
    with pytest.raises(SystemExit, match="report.json not found"):
        peers.targets_from_run(tmp_path / "missing")


def test_a_one_target_run_is_one_member(tmp_path):
    """A one-target run's model is read as one member, "pruned", from where that run saves it."""
    steps = [{"seconds": 10.0, "finetune": {"seconds": 6.0}}, {"seconds": 12.0, "finetune": {"seconds": 7.0}}]
    pruned = pruned_section(80, 20000, "elsewhere/model")
    budget = {"target": 2.0, "flop_ratio": 1.9, "measured_speedup": 1.98}
    (tmp_path / "model").mkdir()
    (tmp_path / "report.json").write_text(json.dumps(one_target_report(steps, pruned, budget)))
    (target,) = peers.targets_from_run(tmp_path)
    assert (target.label, target.speedup, target.heads, target.ffn, target.steps) == ("pruned", 1.98, 80, 20000, 2)
    assert target.model_dir == str(tmp_path / "model") and target.recovery_seconds == 13.0


def test_members_option_keeps_only_the_named_members(tmp_path):
    steps = [{"seconds": 10.0}, {"seconds": 12.0}]
    members = [_member(label, i + 1, 60 - i, "m", 1.5 + i) for i, label in enumerate(("1.5x", "2x"))]
    (tmp_path / "report.json").write_text(json.dumps(family_report([], steps, members=members)))
    ours = ["--models", "minilm", "--ours", f"minilm={tmp_path}"]
    assert [t.label for t in peers.targets_for(peers.parse_args([*ours, "--members", "2x"]))["minilm"]] == ["2x"]
    assert [t.label for t in peers.targets_for(peers.parse_args(ours))["minilm"]] == ["1.5x", "2x"]


def test_member_speedup_falls_back_to_the_frontier(tmp_path):
    """A FLOP or head budget has no speed-up check: the member's PyTorch row of the frontier gives its speed-up."""
    member = _member("50pct", 1, 36, "m", speedup=None)
    rows = [{"name": f"50pct/{runtime}", "model": "50pct", "role": "member", "runtime": runtime, "speedup": speedup}
            for runtime, speedup in (("onnx-int8", 3.9), ("pytorch", 1.7))]  # fmt: skip
    report = family_report(rows, [{"seconds": 5.0}], members=[member])
    (tmp_path / "report.json").write_text(json.dumps(report))
    (target,) = peers.targets_from_run(tmp_path)
    assert target.speedup == 1.7 and target.recovery_seconds == 0.0
    report["family"]["frontier"] = rows[:1]
    (tmp_path / "report.json").write_text(json.dumps(report))
    with pytest.raises(SystemExit, match="member 50pct has no measured PyTorch speed-up"):
        peers.targets_from_run(tmp_path)


def test_a_member_without_an_ffn_count_is_refused(tmp_path):
    member = _member("2x", 1, 50, "m")
    member["pruned"]["ffn_neurons"] = None
    (tmp_path / "report.json").write_text(json.dumps(family_report([], [{"seconds": 1.0}], members=[member])))
    with pytest.raises(SystemExit, match="member 2x has no FFN neuron count"):
        peers.targets_from_run(tmp_path)


def test_target_from_the_command_line():
    model, target = peers.parse_target("minilm:2x:2.01:50:3072:4")
    assert model == "minilm" and (target.heads, target.ffn, target.steps, target.speedup) == (50, 3072, 4, 2.01)
    with pytest.raises(SystemExit, match="MODEL:LABEL:SPEEDUP:HEADS:FFN:STEPS"):
        peers.parse_target("minilm:2x:2.01")


def test_speed_search_steps_along_the_secant():
    """Time linear in FLOPs (1/speed-up = 0.2 + 0.8 x share): one secant step from the original and a first point
    lands on the share that gives the wanted speed-up."""

    def inv(share: float) -> float:
        return 0.2 + 0.8 * share

    points = [(1.0, 1.0), (0.5, inv(0.5))]
    share = peers.next_share(points, 2.5)
    assert inv(share) == pytest.approx(1 / 2.5)
    assert peers.next_share([(1.0, 1.0), (1.0, 1.0)], 2.0) == 1.0  # no slope: stay
    assert peers.next_share(points, 100.0) == 0.01  # never a share below 1%


def test_results_name_no_local_path(tmp_path):
    """A committed result names no path of the machine it ran on: work and venv folders by placeholder, the
    repository relative, anything else absolute by its file name."""
    args = argparse.Namespace(work_dir=tmp_path / "work", venv_dir=tmp_path / "venvs")
    result = {
        "dir": str(tmp_path / "work" / "minilm" / "textpruner" / "2x" / "units"),
        "error": f"textpruner failed: boom (log: {tmp_path / 'work' / 'x' / 'worker.log'})",
        "python": tmp_path / "venvs" / "textpruner" / "bin" / "python",
        "recipe": [str(peers.ROOT / "recipes" / "minilm_rt_family.yaml"), "/elsewhere/my_recipe.yaml"],
        "ours": ["minilm=runs/minilm_rt_family", "mpnet=/data/runs/mpnet_rt_family"],
        "count": 3,
    }
    out = peers.portable(result, args)
    assert out["dir"] == "<work-dir>/minilm/textpruner/2x/units"
    assert out["error"] == "textpruner failed: boom (log: <work-dir>/x/worker.log)"
    assert out["python"] == "<venv-dir>/textpruner/bin/python"
    assert out["recipe"] == ["./recipes/minilm_rt_family.yaml", "my_recipe.yaml"]
    assert out["ours"] == ["minilm=runs/minilm_rt_family", "mpnet=mpnet_rt_family"]
    assert out["count"] == 3


def test_recovered_points_are_compared_with_their_member(tmp_path):
    """Each recovered peer point gets exact McNemar against the member it is matched to (from the cached per-example
    correctness), and the table prints its p; a failed point is left alone."""
    point = tmp_path / "point"
    point.mkdir()
    (point / "recovered.test.json").write_text(json.dumps({"accuracy": 0.5, "correct": [True, True, False, False]}))
    row = {"peer": "textpruner", "member": "2x", "match": "units", "dir": str(point), "heads_left": 50,
           "ffn_left": 9, "speedup": 2.1, "accuracy": 0.25, "prune_seconds": 3.0,
           "recovered": {"test": 0.5, "seconds": 4.0}}  # fmt: skip
    failed = {"peer": "torch-pruning", "member": "2x", "match": "units", "error": "no model"}
    peers.versus_member(None, [row, failed], {"2x": [True, False, True, True]})
    vs = row["recovered"]["vs_member"]
    assert (vs["candidate_only_correct"], vs["reference_only_correct"], vs["p_value"]) == (1, 2, 1.0)
    assert "vs_member" not in failed
    ours = {"member": "2x", "heads_left": 50, "ffn_left": 9, "speedup": 2.0, "accuracy": 0.75, "prune_seconds": 1,
            "recovery_seconds": 2}  # fmt: skip
    section = {"original_test_accuracy": 0.8, "test_examples": 4, "ours": [ours], "peers": [row, failed]}
    lines = peers.table(section)
    assert lines[-2].split("|")[9].strip() == "1" and "failed: no model" in lines[-1]
