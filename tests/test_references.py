"""Reference models (`bench.references`): refused in one line when they bring another task head or label set,
fine-tuned once on their own tokenizer and cached like the base, benchmarked on the same frontier as the members,
never called a member, and picked (said as such) when one wins."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_tokenizer_dir, tiny_recipe
from test_budget_run import BENCH, FINETUNE
from typer.testing import CliRunner

from compressor.bench import measure_quality, pytorch_candidate
from compressor.bench.frontier import pick, verdict, versus_references
from compressor.cli import app
from compressor.core.errors import UserError
from compressor.pipeline.finetune import finetune_key
from compressor.pipeline.references import prepare_reference, references
from compressor.pipeline.runner import prepare, run_recipe
from compressor.recipe import ModelSpec, parse_recipe
from compressor.report.family import render_family
from compressor.report.references import references_lines, training_lines
from compressor.report.schema import RunReport
from compressor.sources.models import foreign_head
from compressor.testing import tiny_config, tiny_model

LABELS = ["0", "1"]


def _save_with_head(path, head: str, num_labels: int = 2, **config):
    """A tiny BERT checkpoint with the given transformers head class, and a tokenizer."""
    import transformers

    make_tokenizer_dir(path)
    cls = getattr(transformers, head)
    cls(tiny_config("bert", layers=1, heads=2, num_labels=num_labels)).save_pretrained(path)
    return path


def test_the_head_check_reads_the_config_alone():
    """Bare and pretraining checkpoints, and classifiers of the task's labels, are fine; any other head or a label
    set of other names or size is named."""
    config = tiny_config("bert")
    assert foreign_head(config, LABELS) is None  # no `architectures`, placeholder labels
    for heads in (["BertModel"], ["BertForMaskedLM"], ["BertForPreTraining"], ["BertForSequenceClassification"]):
        config.architectures = heads
        assert foreign_head(config, LABELS) is None, heads
        assert foreign_head(config, ["neg", "pos"]) is None, heads  # LABEL_0/1 are placeholders
    config.architectures = ["BertForTokenClassification"]
    assert foreign_head(config, LABELS) == "is a BertForTokenClassification (another task head)"
    config = tiny_config("bert", num_labels=3)
    config.architectures = ["BertForSequenceClassification"]
    assert foreign_head(config, LABELS).startswith("has 3 labels ['LABEL_0', 'LABEL_1', 'LABEL_2']")
    config = tiny_config("bert")
    config.id2label, config.label2id = {0: "sports", 1: "politics"}, {"sports": 0, "politics": 1}
    assert "has 2 labels ['sports', 'politics'] where the task has ['negative', 'positive']" in foreign_head(
        config, ["negative", "positive"]
    )  # a bare encoder whose config keeps another task's label map
    assert foreign_head(config, ["Sports", "Politics"]) is None


@pytest.mark.parametrize(
    ("head", "num_labels", "message"),
    [
        ("BertForTokenClassification", 2, "is a BertForTokenClassification (another task head)"),
        ("BertForQuestionAnswering", 2, "is a BertForQuestionAnswering (another task head)"),
        ("BertForSequenceClassification", 3, "has 3 labels"),
    ],
)
def test_a_reference_with_another_head_or_label_set_is_refused_in_one_line(
    tmp_path, tiny_model_dir, tiny_csv, cache_dir, head, num_labels, message
):
    """Refused when the run starts, before the output directory is claimed or anything is trained."""
    bad = _save_with_head(tmp_path / "bad", head, num_labels)
    out = tmp_path / "run"
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, out, bench={**BENCH, "references": [str(bad)]}))
    with pytest.raises(UserError) as err:
        run_recipe(recipe)
    text = str(err.value)
    assert text.startswith(f"bench.references: reference '{bad}' {message}") and "\n" not in text
    assert "expected a pretrained encoder or a sequence classifier of the task's labels" in text
    assert not out.exists() and not cache_dir.exists()


def test_a_reference_that_cannot_load_is_named(tmp_path, tiny_model_dir, tiny_csv, cache_dir):
    out = tmp_path / "run"
    missing = str(tmp_path / "nowhere")
    recipe = parse_recipe(tiny_recipe(tiny_model_dir, tiny_csv, out, bench={**BENCH, "references": [missing]}))
    with pytest.raises(UserError, match=rf"^bench.references: reference '{missing}': path .* does not exist"):
        run_recipe(recipe)
    assert not out.exists()


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        (
            {"bench": {"references": ["builtin:minilm-l6", "builtin:minilm-l6"]}},
            "references: .*expected distinct references",
        ),
        (
            {"bench": {"enabled": False, "references": ["builtin:minilm-l6"]}},
            "references: .*expected bench.enabled: true",
        ),
        (
            {"bench": {"references": ["builtin:minilm-l6"], "reference_distill": True}},
            "reference_distill: a reference learns from the run's teacher targets; expected prune.finetune.distill",
        ),
        (
            {
                "bench": {"references": ["builtin:minilm-l6"], "reference_distill": True},
                "prune": {"recovery": "rescale", "finetune": {"distill": {"alpha": 0.5}}},
                "model": {"task_tuned": True},
            },
            "reference_distill: .*expected prune.finetune.distill",
        ),  # a recovery that trains nothing has no teacher
    ],
)
def test_references_are_checked_with_the_recipe(recipe, message):
    with pytest.raises(UserError, match=f"bench.{message}") as err:
        parse_recipe(recipe)
    assert "\n" not in str(err.value)


def test_a_distilled_reference_has_its_own_cache_key():
    """Distillation is part of what a fine-tune is: keyed apart from the plain fine-tune of the same settings, by
    teacher and settings; a plain key is the one it always was."""
    recipe = parse_recipe({})
    spec = ModelSpec(source="builtin:minilm-l6")
    plain = finetune_key(recipe, spec, LABELS, recipe.base_finetune, "bf16")
    assert plain == finetune_key(recipe, spec, LABELS, recipe.base_finetune, "bf16", None)
    taught = {"teacher": "abc", "alpha": 0.7, "temperature": 2.0}
    keys = {plain, finetune_key(recipe, spec, LABELS, recipe.base_finetune, "bf16", taught),
            finetune_key(recipe, spec, LABELS, recipe.base_finetune, "bf16", {**taught, "teacher": "abd"}),
            finetune_key(recipe, spec, LABELS, recipe.base_finetune, "bf16", {**taught, "alpha": 0.5})}  # fmt: skip
    assert len(keys) == 4


def _family(tmp_path, model_dir, data, reference, name, distill=False):
    finetune = {**FINETUNE, "distill": {"alpha": 0.7, "temperature": 2.0}} if distill else FINETUNE
    prune = {"criterion": {"name": "taylor"}, "budget": {"kind": "heads", "values": [0.25, 0.5], "seq_len": 32},
             "steps": 2, "score_examples": 64, "finetune": finetune, "baseline": None}  # fmt: skip
    overrides = {
        "prune": prune,
        "export": {"variants": ["fp32", "int8"], "int8": {"max_drop": None, "min_agreement": None}},
        "bench": {**BENCH, "max_drop": None, "references": [str(reference)], "reference_distill": distill,
                  "reference_finetune": {"epochs": 8, "lr": 3e-3, "batch_size": 16}},  # its own, not the base's
    }  # fmt: skip
    return parse_recipe(tiny_recipe(model_dir, data, tmp_path / name, **overrides))


@pytest.mark.e2e
def test_a_distilled_reference_learns_from_the_run_teacher(tmp_path, tiny_model_dir, tiny_csv, cache_dir,
                                                           mpnet_reference):  # fmt: skip
    """With `bench.reference_distill` the reference (another tokenizer) trains on the run's teacher targets, which
    cover every example it draws, and is cached under its own key beside the base's; the report says so."""
    report = run_recipe(_family(tmp_path, tiny_model_dir, tiny_csv, mpnet_reference, "taught", distill=True))
    (ref,) = report["references"]
    assert ref["distilled"] is True
    assert {k: ref["finetune"]["distill"][k] for k in ("alpha", "temperature")} == {"alpha": 0.7, "temperature": 2.0}
    log = (tmp_path / "taught" / "run.log").read_text()
    assert f"reference {mpnet_reference.name}: fine-tune: 8.0 epochs of" in log
    assert "distilled from the run's teacher targets" in log
    md = (tmp_path / "taught" / "report.md").read_text()
    assert f"as the members are (`bench.reference_distill`): {mpnet_reference.name}." in md
    run = prepare(_family(tmp_path, tiny_model_dir, tiny_csv, mpnet_reference, "plain"))
    plain = finetune_key(run.recipe, references(run.recipe)[0].spec, LABELS, run.recipe.bench.reference_finetune,
                         str(run.accelerator.mixed_precision))  # fmt: skip
    cached = {p.name for p in (cache_dir / "finetuned").iterdir()}
    assert len(cached) == 2 and plain not in cached  # the base's and the distilled reference's


@pytest.mark.e2e
def test_a_reference_joins_the_frontier_on_its_own_tokenizer_and_is_cached(
    tmp_path, tiny_model_dir, tiny_csv, cache_dir, mpnet_reference
):
    """A family run with an MPNet reference (another tokenizer): the reference is fine-tuned, saved and exported
    under `references/`, benchmarked on its own tokenisation (the bench's accuracy is its own evaluation's), marked
    as a reference on the frontier and in the report, compared with every member; another run reuses its cached
    fine-tune."""
    report = run_recipe(_family(tmp_path, tiny_model_dir, tiny_csv, mpnet_reference, "first"))
    out = tmp_path / "first"
    (ref,) = report["references"]
    label = mpnet_reference.name
    assert ref["label"] == label and ref["source"] == str(mpnet_reference)
    assert (out / "references" / label / "reference.json").exists()
    assert set(ref["export"]) == {"fp32", "int8"} and (out / "references" / label / "onnx" / "int8").is_dir()
    summary = report["bench"]["summary"]
    assert summary[f"reference/{label}/pytorch"]["accuracy"] == pytest.approx(ref["test"]["accuracy"], abs=1e-9)
    assert report["bench"]["quality"]["results"][f"reference/{label}/pytorch"]["max_abs_logit_diff"] is None
    family = report["family"]
    rows = {r["name"]: r for r in family["frontier"]}
    for runtime in ("pytorch", "onnx-fp32", "onnx-int8"):
        row = rows[f"reference/{label}/{runtime}"]
        assert row["role"] == "reference" and row["model"] == label and row["runtime"] == runtime
    assert label not in {m["label"] for m in family["members"]}
    versus = family["versus_references"]
    assert {e["name"] for e in versus} == {f"reference/{label}/{r}" for r in ("pytorch", "onnx-fp32", "onnx-int8")}
    pairs = {(p["candidate"], p["versus"]) for p in report["bench"]["quality"]["pairs"]}
    for entry in versus:
        for best in (entry["best"], entry["best_same_runtime"]):
            if best is not None:
                assert (best["name"], entry["name"]) in pairs and best["speedup"] >= entry["speedup"]
                assert best["mcnemar_p"] is not None and best["verdict"] == verdict(best["points"], best["mcnemar_p"])
                assert best["beats"] == (best["verdict"] == "ahead")
    md = (out / "report.md").read_text()
    assert f"| reference {label} | pytorch |" in md and "## Against the references" in md
    assert "bench.reference_distill" not in md and ref["distilled"] is False  # fine-tuned only
    assert f"| {label} |" not in md.split("## Members")[1]  # the members table lists members only
    passes = {m["label"]: sum(s["finetune"]["examples"] for s in report["steps"] if s["step"] <= m["step"])
              for m in family["members"]}  # fmt: skip
    assert all(n > 0 for n in passes.values()) and ref["finetune"]["examples"] > 0
    trained = md.split("Training after the base model, in example passes")[1].split("\n")[0]
    assert all(f"member {label}: {n:,}" in trained for label, n in passes.items())
    assert f"{label} {ref['finetune']['examples']:,} (the members had" in trained
    assert f"reference {label}: fine-tune: 8.0 epochs of" in (out / "run.log").read_text()  # reference_finetune
    cached = sorted(p.name for p in (cache_dir / "finetuned").iterdir())
    assert len(cached) == 2  # the base's fine-tune and the reference's

    run = prepare(_family(tmp_path, tiny_model_dir, tiny_csv, mpnet_reference, "second"))
    (reference,) = references(run.recipe)
    again = prepare_reference(run, reference)
    log = (tmp_path / "second" / "run.log").read_text()
    assert f"reference {label}: fine-tune: cached at" in log and f"reference {label}: fine-tune: 10" not in log
    assert sorted(p.name for p in (cache_dir / "finetuned").iterdir()) == cached
    assert again["test"] == ref["test"]  # the same fine-tuned weights
    kept = prepare_reference(run, reference)  # a resumed run keeps a finished reference
    assert kept == json.loads(json.dumps(again, default=str))
    assert f"reference {label}: kept from an earlier try" in (tmp_path / "second" / "run.log").read_text()


def _row(name, model, role, runtime, speed, acc, rejected=False, val=None):
    """A frontier row; its validation accuracy is `val`, else the same as its test accuracy `acc`."""
    val = acc if val is None else val
    return {"name": name, "model": model, "role": role, "runtime": runtime, "path": f"{model}/{runtime}",
            "rejected": rejected, "speedup": speed, "speedup_by_batch": {"32": speed}, "batch": 32, "seq_len": 64,
            "accuracy": acc, "drop_points": 100 * (0.86 - acc), "val_accuracy": val,
            "val_drop_points": 100 * (0.86 - val), "mcnemar_p": 0.5, "size_bytes": 1, "pareto": True}  # fmt: skip


ROWS = [
    _row("pytorch-original", "original", "original", "pytorch", 1.0, 0.86),
    _row("2x/pytorch", "2x", "member", "pytorch", 2.0, 0.855),
    _row("2x/onnx-int8", "2x", "member", "onnx-int8", 3.9, 0.85),
    _row("4x/pytorch", "4x", "member", "pytorch", 4.1, 0.84),
    _row("4x/onnx-int8", "4x", "member", "onnx-int8", 7.5, 0.83, rejected=True),
    _row("reference/minilm-l6/pytorch", "minilm-l6", "reference", "pytorch", 6.9, 0.82),
    _row("reference/minilm-l6/onnx-int8", "minilm-l6", "reference", "onnx-int8", 3.8, 0.818),
]
PAIRS = [
    {"candidate": "2x/onnx-int8", "versus": "reference/minilm-l6/onnx-int8", "mcnemar": {"p_value": 0.01}},
    {"candidate": "2x/onnx-int8", "versus": "reference/minilm-l6/pytorch", "mcnemar": {"p_value": 0.02}},
]


def test_versus_references_names_the_best_member_as_fast_or_none():
    """Per reference point: the most accurate shippable member at ≥ its speed (a rejected int8 never counts), on
    any runtime and on its own, with McNemar's p of that pair; none when no member is as fast."""
    by_name = {e["name"]: e for e in versus_references(ROWS, PAIRS)}
    int8 = by_name["reference/minilm-l6/onnx-int8"]
    assert int8["best"]["name"] == "2x/onnx-int8" and int8["best"]["beats"]
    assert int8["best"]["points"] == pytest.approx(3.2) and int8["best"]["mcnemar_p"] == 0.01
    assert int8["best_same_runtime"]["name"] == "2x/onnx-int8"
    assert int8["nearest_same_runtime"] is None  # a member is as fast there
    fast = by_name["reference/minilm-l6/pytorch"]
    assert fast["best"] is None and fast["best_same_runtime"] is None  # 4x/onnx-int8 is faster but rejected
    near = fast["nearest_same_runtime"]  # the fastest PyTorch member, short of the reference's speed
    assert near["name"] == "4x/pytorch" and near["speed_ratio"] == pytest.approx(4.1 / 6.9)
    assert near["points"] == pytest.approx(2.0) and near["mcnemar_p"] is None
    assert near["verdict"] == "level" and not near["beats"], "a gap without a paired test is level"


def test_choices_read_validation_and_report_test():
    """Where validation and test disagree, `pick` and `versus_references` follow validation: the member that is
    worse on test but within the drop on validation is picked, and its test figure is what the row reports."""
    rows = [
        _row("pytorch-original", "original", "original", "pytorch", 1.0, 0.86),
        _row("2x/pytorch", "2x", "member", "pytorch", 2.0, 0.80, val=0.855),  # bad on test, fine on validation
        _row("3x/pytorch", "3x", "member", "pytorch", 3.0, 0.859, val=0.83),  # fine on test, bad on validation
        _row("reference/r/pytorch", "r", "reference", "pytorch", 1.5, 0.85),
    ]
    chosen = pick(rows, 1.0)
    assert chosen["name"] == "2x/pytorch" and chosen["chosen_on"] == "validation"
    assert chosen["drop_points"] == pytest.approx(6.0), "test is reported for what was chosen"
    assert pick([{**r, "val_drop_points": None} for r in rows], 1.0) is None, "no validation, no choice"
    (entry,) = versus_references(rows, [{"candidate": "2x/pytorch", "versus": "reference/r/pytorch",
                                         "mcnemar": {"p_value": 0.001}}])  # fmt: skip
    assert entry["best"]["name"] == "2x/pytorch", "the most accurate member on validation"
    assert entry["best"]["verdict"] == "behind" and not entry["best"]["beats"]


@pytest.mark.parametrize(("points", "p", "expected"), [(1.5, 0.15, "level"), (1.5, 0.01, "ahead"),
                                                        (-2.0, 0.01, "behind"), (-2.0, 0.3, "level"),
                                                        (1.0, None, "level")])  # fmt: skip
def test_ahead_needs_a_significant_paired_test(points, p, expected):
    assert verdict(points, p) == expected


def test_an_optimised_graph_slower_than_its_source_is_never_picked(tmp_path):
    rows = [
        _row("pytorch-original", "original", "original", "pytorch", 1.0, 0.86),
        _row("2x/onnx-fp32", "2x", "member", "onnx-fp32", 2.0, 0.86),
        _row("2x/onnx-optimized", "2x", "member", "onnx-optimized", 1.9, 0.86),
    ]
    assert pick(rows, 1.0)["name"] == "2x/onnx-fp32"
    assert pick(rows, None, runtime="onnx-optimized") is None, "not even when its runtime is asked for"
    run = _family_run(tmp_path, rows)
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "none", "--runtime", "onnx-optimized"])
    assert result.exit_code == 1 and result.output.strip() == (
        "no member, reference or exported original on onnx-optimized qualifies at any accuracy (2x/onnx-optimized: "
        "1.90x, slower than 2x/onnx-fp32 (2.00x) it was built from: never picked)"
    )
    rows[2] = _row("2x/onnx-optimized", "2x", "member", "onnx-optimized", 2.2, 0.86)
    assert pick(rows, 1.0)["name"] == "2x/onnx-optimized"


def test_pick_follows_validation_where_test_disagrees_and_says_so(tmp_path):
    """`compressor pick` on a frontier whose test and validation disagree: the member within the drop on validation
    is picked though it is 6 points down on test (the figure it prints), the one within it on test only is not."""
    rows = [
        _row("pytorch-original", "original", "original", "pytorch", 1.0, 0.86),
        _row("2x/pytorch", "2x", "member", "pytorch", 2.0, 0.80, val=0.855),
        _row("3x/pytorch", "3x", "member", "pytorch", 3.0, 0.859, val=0.83),
    ]
    run = _family_run(tmp_path, rows)
    (run / "2x" / "pytorch").mkdir(parents=True)
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "1"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("2x/pytorch: 2.00x")
    assert "chosen on validation (-0.50 points); test accuracy 80.00% (-6.00 points" in result.output
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "none"])
    assert result.output.startswith("3x/pytorch: 3.00x") and "the fastest at any accuracy" in result.output


def test_pick_refuses_a_report_without_validation_figures_in_one_line(tmp_path):
    """A report.json benchmarked before the bench scored validation: a drop limit cannot be judged on validation,
    so `compressor pick` says so in one line (exit 2) rather than choosing on test; without a limit it picks."""
    rows = [{k: v for k, v in row.items() if not k.startswith("val_")} for row in ROWS]
    run = _family_run(tmp_path, rows)
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "1"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "report.json has no validation accuracy" in result.output and "rerun" in result.output
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "none", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["name"] == "reference/minilm-l6/pytorch"


def _family_run(tmp_path, rows: list[dict]):
    """A finished family run's directory whose report.json has the frontier `rows` (no pick stored)."""
    run = tmp_path / "run"
    run.mkdir()
    report = {"schema_version": 1, "status": "complete", "name": "r", "model_source": "m", "data_source": "d",
              "labels": LABELS, "steps": [], "original": {"test": {"accuracy": 0.86}}, "bench": {"max_drop": 0.01},
              "family": {"targets": [2.0], "kind": "speedup", "runtime": "pytorch", "members": [],
                         "frontier": rows}}  # fmt: skip
    (run / "report.json").write_text(json.dumps(report))
    return run


def test_report_says_how_far_short_the_nearest_member_falls():
    """Where no member is as fast on a reference's runtime, the report's same-runtime cells name the fastest
    member there, its fraction of the reference's speed and its accuracy difference; elsewhere "none as fast"."""
    lines = references_lines(versus_references(ROWS, PAIRS))
    (row,) = [line for line in lines if line.startswith("| minilm-l6 | pytorch |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4:6] == ["none as fast", "–"]
    assert cells[6:] == ["none as fast; nearest `4x/pytorch` at 0.59× its speed", "+2.00 (–)"]


def test_pick_returns_a_reference_when_it_wins_and_says_so(tmp_path):
    """Within 4.5 points the fastest choice is the reference: the pick, the report's recommendation and `compressor
    pick` return it, each saying it is a reference and not a pruned member; within 2 points a member wins."""
    chosen = pick(ROWS, 4.5)
    assert chosen["name"] == "reference/minilm-l6/pytorch" and chosen["role"] == "reference"
    assert pick(ROWS, 2.0)["name"] == "4x/pytorch"
    run = tmp_path / "run"
    (run / "minilm-l6" / "pytorch").mkdir(parents=True)
    report = {"schema_version": 1, "status": "complete", "name": "r", "model_source": "m", "data_source": "d",
              "labels": LABELS, "steps": [], "original": {"test": {"accuracy": 0.86}}, "bench": {"max_drop": 0.045},
              "family": {"targets": [2.0, 4.0], "kind": "speedup", "runtime": "pytorch", "members": [],
                         "frontier": ROWS, "pick": chosen,
                         "versus_references": versus_references(ROWS, PAIRS)}}  # fmt: skip
    (run / "report.json").write_text(json.dumps(report))
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "4.5"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("reference/minilm-l6/pytorch (reference, not a pruned member): 6.90x")
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "4.5", "--json"])
    assert json.loads(result.output)["role"] == "reference"
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "2"])
    assert result.output.startswith("4x/pytorch: 4.10x")
    assert "chosen on validation (-2.00 points); test accuracy 84.00% (-2.00 points" in result.output
    md = render_family(RunReport.of(report))
    assert "**Recommendation: `reference/minilm-l6/pytorch`**" in md and "not a pruned member" in md
    assert "| reference minilm-l6 | pytorch | 6.90× |" in md and "none as fast" in md


def test_pick_returns_the_quantized_original_when_it_wins_and_says_so(tmp_path):
    """Quantize-only is a choice: within 1.2 points the original's int8 (an exported variant with a path, its gate
    passed) is faster than every member and is picked, the report and `compressor pick` saying it is the original,
    not pruned; a rejected int8 of the original and the PyTorch original itself (no path) are never picked."""
    original = {**_row("pytorch-original", "original", "original", "pytorch", 1.0, 0.86), "path": None}
    int8 = _row("onnx-int8-original", "original", "original", "onnx-int8", 4.8, 0.85)
    rows = [original, *ROWS[1:], int8]
    chosen = pick(rows, 1.2)
    assert chosen["name"] == "onnx-int8-original" and chosen["role"] == "original"
    assert pick(rows, 0.6)["name"] == "2x/pytorch"
    assert pick([original, {**int8, "rejected": True}, *ROWS[1:3]], 1.2)["name"] == "2x/onnx-int8"
    assert pick([original], None) is None
    run = tmp_path / "run"
    report = {"schema_version": 1, "status": "complete", "name": "r", "model_source": "m", "data_source": "d",
              "labels": LABELS, "steps": [], "original": {"test": {"accuracy": 0.86}}, "bench": {"max_drop": 0.012},
              "family": {"targets": [2.0, 4.0], "kind": "speedup", "runtime": "pytorch", "members": [],
                         "frontier": rows, "pick": chosen}}  # fmt: skip
    (run / "original" / "onnx-int8").mkdir(parents=True)
    (run / "report.json").write_text(json.dumps(report))
    result = CliRunner().invoke(app, ["pick", str(run), "--max-drop", "1.2", "--out", str(tmp_path / "mine")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("onnx-int8-original (the original on onnx-int8, not pruned): 4.80x")
    assert (tmp_path / "mine").is_dir()
    md = render_family(RunReport.of(report))
    assert "**Recommendation: `onnx-int8-original`**" in md and "the original on onnx-int8, not pruned" in md


def test_own_evaluation_batches_must_hold_the_same_examples(tiny_model_dir):
    """A candidate with its own tokenisation is evaluated on it; batches of other examples are refused."""
    model = tiny_model("bert", layers=1, heads=2)
    ids = torch.randint(5, 100, (4, 6))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 1, 0])}
    a, b = pytorch_candidate("a", model, 6), pytorch_candidate("b", model, 6)
    b.eval_batches = [{**batch, "input_ids": ids.flip(0)}]
    result = measure_quality([a, b], [batch], "a", compare=[("b", "a")])
    assert result["results"]["b"]["max_abs_logit_diff"] is None
    assert result["pairs"][0]["candidate"] == "b" and "p_value" in result["pairs"][0]["mcnemar"]
    flipped = np.asarray(a.predict({k: v.flip(0) for k, v in batch.items()}))
    assert result["results"]["b"]["agreement"] == pytest.approx(
        float(np.mean(flipped.argmax(-1) == np.asarray(a.predict(batch)).argmax(-1)))
    )
    b.eval_batches = [{**batch, "labels": batch["labels"].flip(0).roll(1)}]
    with pytest.raises(UserError, match="bench: candidate 'b' brings evaluation batches of other examples"):
        measure_quality([a, b], [batch], "a")


def test_a_one_target_run_compares_with_a_reference_that_shares_the_base_fine_tune(
    tmp_path, tiny_model_dir, tiny_csv, cache_dir
):
    """The run's own base model as a reference is the same fine-tune (one cache entry, not trained twice): on the
    one-target frontier it is exactly as accurate as the original and agrees with it everywhere."""
    out = tmp_path / "one"
    recipe = parse_recipe(
        tiny_recipe(tiny_model_dir, tiny_csv, out, bench={**BENCH, "references": [str(tiny_model_dir)]})
    )
    report = run_recipe(recipe)
    label = tiny_model_dir.name
    assert f"reference {label}: fine-tune: cached at" in (out / "run.log").read_text()
    assert len(list((cache_dir / "finetuned").iterdir())) == 1
    summary = report["bench"]["summary"]
    name = f"reference/{label}/pytorch"
    assert summary[name]["accuracy"] == summary["pytorch-original"]["accuracy"] and summary[name]["agreement"] == 1.0
    (row,) = [r for r in report["frontier"] if r["role"] == "reference"]
    assert row["name"] == name and row["model"] == label
    assert [e["name"] for e in report["versus_references"]] == [name]
    assert "## Against the references" in (out / "report.md").read_text()


def test_training_lines_add_each_members_steps_and_last_fine_tune():
    """Passes of the steps up to the member plus its last fine-tune, beside each reference's; nothing is said when
    a fine-tune did not record its passes (an older cache)."""
    steps = [{"step": 1, "finetune": {"examples": 100}}, {"step": 2, "finetune": {"examples": 100}}]
    members = [("2x", 1, {"examples": 300}), ("4x", 2, None)]
    (_, line) = training_lines(members, steps, [{"label": "minilm-l6", "finetune": {"examples": 200}}])
    assert "member 2x: 400; member 4x: 200" in line and "minilm-l6 200 (the members had 1.00–2.00× its passes)" in line
    assert training_lines(members, steps, [{"label": "old", "finetune": {"steps": 3}}]) == []
    assert training_lines(members, steps, None) == []
