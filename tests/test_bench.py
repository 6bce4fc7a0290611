"""Benchmark: statistics, interleaving, quality comparison, reports, shipped metrics and the `bench` command."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from scipy import stats
from typer.testing import CliRunner

from compressor import bench
from compressor.core import compat
from compressor.core.errors import UserError
from compressor.recipe import BenchSpec
from compressor.surgery.cost import encoder_flops
from compressor.surgery.slicing import pruned_copy
from compressor.testing import tiny_batch, tiny_model

PLAN = {0: [0, 1], 1: [2], 2: [0, 1, 3]}
FAST = {"rounds": 2, "warmup": 1, "min_time_s": 0.005}


@pytest.fixture(scope="module")
def models():
    original = tiny_model("bert", layers=3, heads=4, head_size=8)
    return original, pruned_copy(original, PLAN).eval()


@pytest.fixture(scope="module")
def batches():
    return [tiny_batch(8, 12, seed=i) for i in range(6)]


def fake(name: str, log: list[str] | None = None, logits: np.ndarray | None = None, **kwargs) -> bench.Candidate:
    """A candidate whose predict records its calls and returns fixed logits per example (row i → logits[i % n])."""
    table = np.array([[1.0, 0.0]]) if logits is None else logits

    def predict(batch):
        if log is not None:
            log.append(name)
        n = batch["input_ids"].shape[0]
        return table[np.arange(n) % len(table)]

    return bench.Candidate(name, predict, kwargs.pop("size_bytes", 100), kwargs.pop("flops", None), "pytorch", **kwargs)


# ------------------------------------------------------------------------------------------------ statistics


@pytest.mark.parametrize("k,n", [(0, 10), (7, 10), (850, 1000), (1000, 1000)])
def test_wilson_interval_matches_formula(k, n):
    z = stats.norm.ppf(0.975)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = bench.wilson_interval(k, n)
    assert low == pytest.approx(max(0.0, centre - half), abs=1e-9)
    assert high == pytest.approx(min(1.0, centre + half), abs=1e-9)


def test_wilson_interval_on_1000_rows_is_about_plus_minus_two_standard_errors():
    low, high = bench.wilson_interval(850, 1000)
    se = math.sqrt(0.85 * 0.15 / 1000)
    assert (high - low) / 2 == pytest.approx(1.96 * se, rel=0.03)


def test_mcnemar_exact_counts_discordant_pairs_only():
    cand = np.array([True] * 10 + [False] * 2 + [True] * 50 + [False] * 38)
    ref = np.array([False] * 10 + [True] * 2 + [True] * 50 + [False] * 38)
    out = bench.mcnemar_exact(cand, ref)
    assert (out["candidate_only_correct"], out["reference_only_correct"]) == (10, 2)
    assert out["p_value"] == pytest.approx(2 * stats.binom.cdf(2, 12, 0.5))
    assert out["p_value"] < 0.05
    assert bench.mcnemar_exact(ref, ref)["p_value"] == 1.0


def test_paired_difference_interval_is_centred_on_the_difference():
    low, high = bench.paired_difference_interval(better=30, worse=10, n=1000)
    assert (low + high) / 2 == pytest.approx(0.02)
    assert low > 0 and high < 0.04
    assert bench.paired_difference_interval(0, 0, 100) == (0.0, 0.0)


# ------------------------------------------------------------------------------------------------ throughput


def test_rounds_are_interleaved_and_rotated():
    log: list[str] = []
    cands = [fake(n, log) for n in ("a", "b", "c")]
    out = bench.measure_throughput(cands, [1, 2], seq_lens=8, rounds=3, warmup=1, min_time_s=0.0, min_calls=1)
    timed = log[len(cands) * 2 :]  # after one warm-up call per candidate per batch size
    # min_time_s=0, min_calls=1 → exactly one call per measurement: round r visits batch 1 then 2, each in rotated order
    expected = []
    for r in range(3):
        order = ["a", "b", "c"][r:] + ["a", "b", "c"][:r]
        expected += order + order
    assert timed == expected
    row = out["results"]["b"]["8"]["2"]
    assert len(row["seconds_per_round"]) == 3
    assert row["examples_per_s"]["median"] == pytest.approx(2 / np.median(row["seconds_per_round"]))
    assert out["setup"]["rounds"] == 3 and out["setup"]["batch_sizes"] == [1, 2] and out["setup"]["seq_lens"] == [8]


def test_synthetic_batches_have_exact_length_and_no_padding():
    seen = []
    cand = fake("a")
    original = cand.predict
    cand.predict = lambda b: (seen.append(b), original(b))[1]
    bench.measure_throughput([cand], [3], seq_lens=17, rounds=1, warmup=1, min_time_s=0.0)
    assert all(b["input_ids"].shape == (3, 17) and bool(b["attention_mask"].all()) for b in seen)


def test_paired_speedups_are_per_round_ratios():
    throughput = {
        "results": {
            "ref": {"64": {"4": {"seconds_per_round": [1.0, 2.0, 4.0]}}},
            "fast": {"64": {"4": {"seconds_per_round": [0.5, 1.0, 2.0]}}},
        }
    }
    out = bench.paired_speedups(throughput, "ref")
    # the machine slowed 4× over the rounds, but each round's ratio is exactly 2
    assert out["fast"]["64"]["4"]["per_round"] == [2.0, 2.0, 2.0]
    assert out["fast"]["64"]["4"]["median"] == 2.0 and out["ref"]["64"]["4"]["median"] == 1.0
    with pytest.raises(UserError, match="reference 'nope'"):
        bench.paired_speedups(throughput, "nope")


def test_paired_check_times_the_two_alone_at_one_shape():
    """A budget check: only the member and the original, at the one shape asked, one visit each per round in
    rotating order, the per-round ratios (original's seconds over the member's) and their spread, naming the
    original; it sleeps for its calls, so the ratio is what the sleeps make it."""
    import time

    calls: list[tuple[str, tuple]] = []

    def sleeper(name: str, seconds: float) -> bench.Candidate:
        def predict(batch):
            calls.append((name, tuple(batch["input_ids"].shape)))
            time.sleep(seconds)
            return np.zeros((batch["input_ids"].shape[0], 2))

        return bench.Candidate(name, predict, 1, None, "pytorch")

    check = bench.paired_check(sleeper("member", 0.01), sleeper("original", 0.03), 4, 16, rounds=3, min_time_s=0.05)
    assert check["vs"] == "original" and len(check["per_round"]) == 3
    assert {shape for _, shape in calls} == {(4, 16)} and {name for name, _ in calls} == {"member", "original"}
    assert check["q1"] <= check["median"] <= check["q3"]
    assert 2.0 < check["median"] < 3.6  # sleeps only ever overshoot: 30 ms (+ε) over 10 ms (+ε)
    with pytest.raises(UserError, match="must be unique"):
        bench.paired_check(sleeper("x", 0.0), sleeper("x", 0.0), 4, 16, rounds=1, min_time_s=0.0)


def test_threads_are_set_and_recorded(models):
    before = torch.get_num_threads()
    try:
        out = bench.measure_throughput(
            [bench.pytorch_candidate("o", models[0], 8)], [1], 8, rounds=1, warmup=0, min_time_s=0.0, threads=1
        )
        assert torch.get_num_threads() == 1
        assert out["setup"]["torch_threads"] == 1 and out["setup"]["candidate_threads"] == {"o": 1}
    finally:
        torch.set_num_threads(before)


def test_peak_rss_delta_sees_native_allocations():
    size = 64 * 2**20
    delta = bench.peak_rss_delta(lambda: np.ones(size // 8).sum())
    if delta is None:
        pytest.skip("no /proc/self/clear_refs on this platform")
    assert delta >= 0.8 * size


@pytest.mark.parametrize("bad", [[], [0, 8]])
def test_bad_batch_sizes_are_refused_by_the_spec(bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="batch_sizes"):  # the one place batch sizes are checked
        BenchSpec(batch_sizes=bad)


def test_duplicate_candidate_names_are_refused():
    with pytest.raises(UserError, match="unique"):
        bench.measure_throughput([fake("a"), fake("a")], [1], 8)


# ------------------------------------------------------------------------------------------------ candidates, quality


def test_pytorch_candidate_reports_flops_heads_and_size(models, tmp_path):
    from compressor.surgery.checkpoint import save_pruned

    original, pruned = models
    cand = bench.pytorch_candidate("p", pruned, 16)
    assert cand.flops_per_example == encoder_flops(pruned, 16) < encoder_flops(original, 16)
    assert cand.heads_per_layer == [2, 3, 1]
    assert cand.size_bytes == sum(p.numel() * 4 for p in pruned.parameters())
    saved = save_pruned(pruned, tmp_path / "m")
    on_disk = bench.pytorch_candidate("p", pruned, 16, saved)
    assert on_disk.size_bytes == (saved / "model.safetensors").stat().st_size


def test_pytorch_candidate_drops_inputs_the_model_does_not_take():
    model = tiny_model("distilbert", layers=2, heads=4)
    batch = bench.synthetic_batch(2, 9, vocab_size=100, seed=0)  # has token_type_ids, which DistilBERT refuses
    logits = bench.pytorch_candidate("d", model, 9).predict(batch)
    assert logits.shape == (2, 2)


def test_quality_pruned_equals_masked_original(models, batches):
    from compressor.pruning.masking import gated
    from compressor.pruning.selection import plan_to_mask

    original, pruned = models
    gates = plan_to_mask(PLAN, torch.ones(3, 4, dtype=torch.bool)).float()

    def masked(batch):
        with torch.inference_mode(), gated(original, gates):
            return original(**batch).logits.numpy()

    cands = [bench.Candidate("masked", masked, 1, None, "pytorch"), bench.pytorch_candidate("pruned", pruned, 12)]
    out = bench.measure_quality(cands, batches, reference="masked")
    row = out["results"]["pruned"]
    assert out["n"] == 48 and row["agreement"] == 1.0 and row["max_abs_logit_diff"] < 1e-4
    assert row["mcnemar"]["p_value"] == 1.0 and row["accuracy_delta"] == 0.0


def test_quality_statistics_match_hand_counts(batches):
    labels = np.concatenate([b["labels"].numpy() for b in batches])
    always0 = fake("zero", logits=np.array([[1.0, 0.0]]))
    always1 = fake("one", logits=np.array([[0.0, 1.0]]))
    out = bench.measure_quality([always0, always1], batches, reference="zero")
    ones = int(labels.sum())
    n = len(labels)
    row = out["results"]["one"]
    assert row["accuracy"] == pytest.approx(ones / n)
    assert row["accuracy_ci95"] == pytest.approx(list(bench.wilson_interval(ones, n)))
    assert row["agreement"] == 0.0
    assert row["mcnemar"]["candidate_only_correct"] == ones
    assert row["mcnemar"]["reference_only_correct"] == n - ones
    assert row["accuracy_delta"] == pytest.approx((2 * ones - n) / n)


def test_bench_phases_say_what_they_measure_in_the_log(batches, caplog):
    """A family's bench spends minutes predicting and timing: each phase writes a line first (how many
    candidates, examples, shapes, rounds), so a run's log never sits silent through it."""
    with caplog.at_level(logging.INFO, logger="compressor"):
        bench.measure_quality([fake("a"), fake("b")], batches, reference="a")
        bench.measure_throughput([fake("a")], [1, 2], seq_lens=8, rounds=2, warmup=1, min_time_s=0.0, min_calls=1)
    assert "bench: predictions of 2 candidates on 48 examples" in caplog.text
    assert "bench: timing 1 candidates at 2 shapes, 2 rounds" in caplog.text


def test_quality_without_labels_reports_agreement_only(batches):
    unlabeled = [{k: v for k, v in b.items() if k != "labels"} for b in batches]
    out = bench.measure_quality([fake("a"), fake("b")], unlabeled, reference="a")
    assert out["has_labels"] is False
    assert out["results"]["b"] == {"n": 48, "agreement": 1.0, "max_abs_logit_diff": 0.0}


def test_quality_reference_must_exist(batches):
    with pytest.raises(UserError, match="reference 'x' is not among"):
        bench.measure_quality([fake("a")], batches, reference="x")


def _ort_candidate(model, path) -> bench.Candidate:
    """A hand-exported ONNX model (legacy exporter) as a candidate, independent of compressor.deploy.export."""
    import onnxruntime as ort

    args = (torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    axes = {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}, "logits": {0: "b"}}
    with pytest.warns(DeprecationWarning), compat.traceable(model):  # the tracer, as at any supported version
        torch.onnx.export(
            model, args, str(path), input_names=["input_ids", "attention_mask"], output_names=["logits"],
            dynamic_axes=axes, dynamo=False,
        )  # fmt: skip
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def predict(batch):
        feed = {k: batch[k].numpy() for k in ("input_ids", "attention_mask")}
        return session.run(["logits"], feed)[0]

    return bench.Candidate("onnx-fp32", predict, path.stat().st_size, None, "onnx", threads=1)


def test_onnx_candidate_agrees_with_pytorch(models, batches, tmp_path):
    _, pruned = models
    cands = [bench.pytorch_candidate("pytorch", pruned, 12), _ort_candidate(pruned, tmp_path / "m.onnx")]
    row = bench.measure_quality(cands, batches, reference="pytorch")["results"]["onnx-fp32"]
    assert row["agreement"] == 1.0 and row["max_abs_logit_diff"] < 1e-4


def test_onnx_candidate_through_export_module(models, tmp_path):
    from compressor.deploy import export
    from compressor.surgery.checkpoint import save_pruned

    _, pruned = models
    model_dir = save_pruned(pruned, tmp_path / "model")
    batch = tiny_batch(4, 12)
    exported = export.export_onnx(model_dir, tmp_path / "onnx", ["fp32"], [batch])
    cand = bench.onnx_candidate("onnx-fp32", exported["fp32"]["dir"], threads=1)
    with torch.inference_mode():
        expected = pruned(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.numpy()
    assert np.abs(cand.predict(batch) - expected).max() < 1e-4
    assert cand.kind == "onnx" and cand.size_bytes > 0
    default = bench.onnx_candidate("onnx-default", exported["fp32"]["dir"], flops_per_example={12: 10, 24: 30})
    assert default.threads == bench.ort_default_threads() and "default" in default.extra["threads_note"]
    assert default.flops_by_seq_len == {12: 10, 24: 30} and default.flops_per_example == 10


def test_onnx_candidate_missing_dir(tmp_path):
    with pytest.raises((FileNotFoundError, UserError)):
        bench.onnx_candidate("x", tmp_path / "absent", 1)


# ------------------------------------------------------------------------------------------------ bench + report


def test_bench_writes_report_json_md_and_plots(models, batches, tmp_path):
    original, pruned = models
    cands = [bench.pytorch_candidate("pytorch-original", original, 12), bench.pytorch_candidate("pruned", pruned, 12)]
    spec = BenchSpec(batch_sizes=[1, 4], seq_len=12, threads=1, **FAST)
    result = bench.bench(cands, batches, spec, tmp_path / "out")
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"report.json", "report.md", "throughput_vs_batch.png", "accuracy_vs_speedup.png"} <= files
    assert "heads_per_layer.png" in files
    for png in (tmp_path / "out").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["schema_version"] == bench.SCHEMA_VERSION
    s = saved["summary"]["pruned"]
    assert s["flop_ideal_speedup"] == pytest.approx(encoder_flops(original, 12) / encoder_flops(pruned, 12))
    assert s["heads_per_layer"] == [2, 3, 1] and s["headline_batch"] == 4 and s["headline_seq_len"] == 12
    assert s["headline_speedup"] == result["speedups"]["pruned"]["12"]["4"]["median"]
    with torch.inference_mode():
        preds = [
            [m(**{k: v for k, v in b.items() if k != "labels"}).logits.argmax(-1) for b in batches]
            for m in (original, pruned)
        ]
    agreement = float((torch.cat(preds[0]) == torch.cat(preds[1])).float().mean())
    assert 0 < agreement < 1  # pruning these heads changes some predictions, so agreement is a real measurement
    assert saved["quality"]["results"]["pruned"]["agreement"] == pytest.approx(agreement)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| pruned |" in md and "### Sequence length 12, batch 4" in md and "McNemar" in md and "FLOP-ideal" in md
    assert bench.render_bench_md(saved) == md  # the markdown is a pure function of the saved JSON


def test_bench_without_quality_data(models, tmp_path):
    original, _ = models
    spec = BenchSpec(batch_sizes=[2], seq_len=8, **FAST)
    result = bench.bench([bench.pytorch_candidate("pytorch-original", original, 8)], None, spec, tmp_path)
    assert result["quality"] is None
    assert "quality was not measured" in (tmp_path / "report.md").read_text()


# ------------------------------------------------------------------------------------------------ shipped metrics


def test_shipped_metrics_load_offline():
    from compressor.sources.metrics import load_metric

    assert os.environ["HF_HUB_OFFLINE"] == "1"  # set by conftest: any hub access would raise
    acc = load_metric("accuracy").compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])["accuracy"]
    f1 = load_metric("f1").compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])["f1"]
    assert acc == 0.75 and f1 == pytest.approx(2 / 3)


@pytest.mark.slow
def test_shipped_metrics_load_offline_in_a_fresh_process(tmp_path):
    """A new process with an empty HF cache: nothing can come from an earlier download."""
    code = (
        "from compressor.sources.metrics import load_metric;"
        "print(load_metric('accuracy').compute(predictions=[0,1,1,0], references=[0,1,0,0])['accuracy'],"
        "load_metric('f1').compute(predictions=[0,1,1,0], references=[0,1,0,0])['f1'],"
        "load_metric('f1').compute(predictions=[0,1,2,2], references=[0,1,2,1], average='macro')['f1'])"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    acc, f1_binary, f1_macro = map(float, out.stdout.split())
    assert acc == 0.75
    assert f1_binary == pytest.approx(2 / 3)
    assert f1_macro == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)  # per class: P/R = 1/1, 1/.5, .5/1


def test_unknown_metric_is_named():
    from compressor.sources.metrics import load_metric

    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        load_metric("bleu")


# ------------------------------------------------------------------------------------------------ command line


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory, tiny_model_dir):
    from transformers import AutoTokenizer

    from compressor.surgery.checkpoint import load_pruned, save_pruned

    original = load_pruned(tiny_model_dir, attn_implementation="eager")
    pruned_dir = tmp_path_factory.mktemp("pair") / "pruned"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    save_pruned(pruned_copy(original, {0: [0, 1], 2: [3]}), pruned_dir, tokenizer, original=original, seq_len=16)
    return tiny_model_dir, pruned_dir


def _cli(*args: str):
    from compressor.cli import app

    return CliRunner().invoke(app, ["bench", *args])


def test_cli_bench_end_to_end(saved_pair, tiny_csv, tmp_path):
    original, pruned = saved_pair
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"source": str(tiny_csv), "max_length": 16}, "bench": FAST}))
    out = tmp_path / "bench"
    res = _cli(
        "--original", str(original), "--pruned", str(pruned), "--recipe", str(recipe), "--out", str(out),
        "--batch-sizes", "1,4", "--seq-lens", "16,8", "--threads", "1",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "pytorch-pruned: accuracy" in res.output and "FLOP-ideal" in res.output
    assert "at batch 4, 16 tokens" in res.output
    report = json.loads((out / "report.json").read_text())
    assert report["setup"]["batch_sizes"] == [1, 4] and report["setup"]["torch_threads"] == 1
    assert report["setup"]["seq_lens"] == [16, 8] and set(report["throughput"]["pytorch-pruned"]) == {"16", "8"}
    assert report["summary"]["pytorch-pruned"]["heads_per_layer"] == [2, 4, 3]
    assert report["quality"]["n"] > 0 and report["quality"]["has_labels"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--batch-sizes", "1,x"], "--batch-sizes: expected comma-separated positive integers"),
        (["--batch-sizes", "0,4"], "--batch-sizes"),
        (["--seq-len", "4"], "bench.seq_lens: expected sequence lengths from 8 to 4096"),
        (["--seq-lens", "64,x"], "--seq-lens: expected comma-separated positive integers"),
        (["--seq-lens", "64,64"], "bench.seq_lens: expected distinct sequence lengths"),
        (["--threads", "0"], "bench.threads"),
    ],
)
def test_cli_bad_options_are_one_line_errors(saved_pair, tmp_path, args, message):
    original, pruned = saved_pair
    res = _cli("--original", str(original), "--pruned", str(pruned), "--out", str(tmp_path), "--no-quality", *args)
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1


def test_cli_missing_model_dir(saved_pair, tmp_path):
    _, pruned = saved_pair
    res = _cli("--original", str(tmp_path / "nope"), "--pruned", str(pruned), "--out", str(tmp_path))
    assert res.exit_code == 2 and "--original: directory" in res.output


# ------------------------------------------------------------------------------------------------ sequence lengths


def test_bench_spec_takes_several_sequence_lengths_and_the_old_single_key():
    from pydantic import ValidationError

    assert BenchSpec().seq_lens == [64] and BenchSpec().seq_len == 64
    assert BenchSpec.model_validate({"seq_len": 128}).seq_lens == [128]  # recipes written before seq_lens
    spec = BenchSpec.model_validate({"seq_lens": [128, 32]})
    assert spec.seq_lens == [128, 32] and spec.seq_len == 128  # the first length is the headline one
    assert "seq_lens" in spec.model_dump() and "seq_len" not in spec.model_dump()
    for bad in ({"seq_len": 64, "seq_lens": [64]}, {"seq_lens": [64, 64]}, {"seq_lens": [4]}, {"seq_lenz": 64}):
        with pytest.raises(ValidationError):
            BenchSpec.model_validate(bad)


def test_every_sequence_length_is_timed_at_every_batch_size_interleaved():
    log: list[str] = []
    shapes: list[tuple[int, int]] = []
    cands = [fake(n, log) for n in ("a", "b")]
    original = cands[0].predict
    cands[0].predict = lambda batch: (shapes.append(tuple(batch["input_ids"].shape)), original(batch))[1]
    out = bench.measure_throughput(cands, [1, 2], seq_lens=[16, 8], rounds=2, warmup=0, min_time_s=0.0, min_calls=1)
    # per round: length 16 (batch 1, 2) then length 8 (batch 1, 2), each visiting the candidates in rotated order
    assert log == ["a", "b"] * 4 + ["b", "a"] * 4
    assert shapes == [(1, 16), (2, 16), (1, 8), (2, 8)] * 2
    assert set(out["results"]["a"]) == {"16", "8"} and set(out["results"]["a"]["8"]) == {"1", "2"}
    assert out["setup"]["seq_lens"] == [16, 8] and out["setup"]["headline_seq_len"] == 16
    assert len(out["results"]["b"]["8"]["2"]["seconds_per_round"]) == 2
    speedups = bench.paired_speedups(out, "a")
    assert speedups["a"]["8"]["2"]["per_round"] == [1.0, 1.0]
    with pytest.raises(ValueError, match="expected distinct sequence lengths"):
        BenchSpec(seq_lens=[8, 8])


@pytest.mark.parametrize("sizes,head", [([1, 8, 32, 64], 32), ([1, 8, 64], 8), ([1, 4], 4), ([64, 128], 64)])
def test_headline_batch_is_32_or_the_largest_below(sizes, head):
    assert bench.headline_batch(sizes) == head


def test_bench_reports_flop_ideal_per_sequence_length(models, tmp_path):
    original, pruned = models
    lengths = [12, 48]
    cands = [
        bench.pytorch_candidate("pytorch-original", original, lengths),
        bench.pytorch_candidate("pruned", pruned, lengths),
    ]
    onnx_like = bench.Candidate("copy", cands[1].predict, 1, None, "pytorch")
    onnx_like.flops_by_seq_len = dict(cands[1].flops_by_seq_len)
    spec = BenchSpec(batch_sizes=[1, 2], seq_lens=lengths, threads=1, **FAST)
    result = bench.bench([*cands, onnx_like], None, spec, tmp_path / "out")
    assert result["schema_version"] == bench.SCHEMA_VERSION == 2
    ideal = {str(t): encoder_flops(original, t) / encoder_flops(pruned, t) for t in lengths}
    assert ideal["12"] != pytest.approx(ideal["48"], rel=1e-3)  # the ratio really depends on the length
    for name in ("pruned", "copy"):
        s = result["summary"][name]
        assert s["flop_ideal_speedup_by_seq_len"] == pytest.approx(ideal)
        assert s["flop_ideal_speedup"] == pytest.approx(ideal["12"]) and s["headline_seq_len"] == 12
        assert s["flops_per_example_by_seq_len"] == {str(t): encoder_flops(pruned, t) for t in lengths}
        assert s["headline_speedup"] == result["speedups"][name]["12"]["2"]["median"]
        assert set(s["speedup"]) == {"12", "48"} and set(s["speedup"]["48"]) == {"1", "2"}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "### Sequence length 12, batch 2" in md and "### Sequence length 48, batch 1" in md
    assert "## Summary (batch 2, sequence length 12)" in md and "at 48 tokens" in md
    assert bench.render_bench_md(json.loads((tmp_path / "out" / "report.json").read_text())) == md


def test_run_report_names_the_headline_shape():
    from compressor.report.summary import _bench_table

    row = {"headline_speedup": 1.5, "headline_batch": 32, "headline_seq_len": 128, "flop_ideal_speedup": 1.7}
    assert "1.50× (32, 128)" in "\n".join(_bench_table({"summary": {"p": row}}))


# ------------------------------------------------------------------------------------------------ peak memory


def test_peak_memory_is_measured_every_round_in_rotating_order_and_summarised_by_median(monkeypatch):
    log: list[str] = []
    measured: list[str] = []
    values = iter([10, 1, 7, 3, 2, 5, 9, 4, 6])  # three rounds × three candidates, in the order they are measured

    def fake_peak(fn):
        start = len(log)
        fn()
        measured.append(log[start])
        return next(values)

    monkeypatch.setattr(bench.timing, "peak_rss_delta", fake_peak)
    cands = [fake(n, log) for n in ("a", "b", "c")]
    out = bench.measure_throughput(cands, [2], 8, rounds=3, warmup=1, min_time_s=0.0, min_calls=1)
    assert measured == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # not a fixed order
    per_round = {name: out["results"][name]["8"]["2"]["peak_rss_delta_bytes_per_round"] for name in "abc"}
    assert per_round == {"a": [10, 5, 4], "b": [1, 3, 6], "c": [7, 2, 9]}
    medians = {name: out["results"][name]["8"]["2"]["peak_rss_delta_bytes"] for name in "abc"}
    assert medians == {"a": 5, "b": 3, "c": 7}
    assert "lower bound" in out["setup"]["memory"]


def test_peak_rss_delta_still_runs_where_the_peak_cannot_be_read(monkeypatch):
    monkeypatch.setattr(bench.timing, "_reset_peak", lambda: False)
    ran = []
    assert bench.peak_rss_delta(lambda: ran.append(1)) is None and ran == [1]


def test_report_md_states_the_memory_caveat(tmp_path):
    spec = BenchSpec(batch_sizes=[2], seq_len=8, **FAST)
    bench.bench([fake("pytorch-original")], None, spec, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Peak RSS growth: " in md and "median over the rounds" in md and "lower bound" in md


# ------------------------------------------------------------------------------------------------ atomic output


def test_killed_report_write_leaves_the_previous_output(monkeypatch, tmp_path):
    out = tmp_path / "bench"
    spec = BenchSpec(batch_sizes=[2], seq_len=8, **FAST)
    bench.bench([fake("pytorch-original")], None, spec, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"report.json", "report.md", "throughput_vs_batch.png", "accuracy_vs_speedup.png"} | {
        "heads_per_layer.png"
    }

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as if the process died while writing the last plot

    monkeypatch.setattr(bench.render, "plot_heads", killed)
    with pytest.raises(KeyboardInterrupt):
        bench.bench([fake("pytorch-original")], None, spec, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old report, complete and untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench"]  # no temp directory left beside it
    with pytest.raises(KeyboardInterrupt):
        bench.bench([fake("pytorch-original")], None, spec, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()  # a first run killed half-way leaves nothing


def test_bench_replaces_an_earlier_report_and_regression_check(tmp_path):
    """A directory holding only an earlier bench report and regression check is the bench's own: replaced whole,
    so a stale regression verdict does not survive a new report."""
    from compressor.guard.report import REGRESSION_FILES

    spec = BenchSpec(batch_sizes=[2], seq_len=8, **FAST)
    bench.bench([fake("pytorch-original")], None, spec, tmp_path)
    for name in REGRESSION_FILES:
        (tmp_path / name).write_text("stale")
    bench.bench([fake("pytorch-original")], None, spec, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(bench.BENCH_FILES)


def test_bench_refuses_an_output_directory_with_other_files_before_measuring(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    log: list[str] = []
    with pytest.raises(UserError, match="holds other files"):
        bench.bench([fake("pytorch-original", log)], None, BenchSpec(**FAST), tmp_path)
    assert log == [] and (tmp_path / "notes.txt").read_text() == "keep me"


# ------------------------------------------------------------------------------------------------ ONNX Runtime threads


def test_onnx_threads_left_to_onnxruntime_are_recorded_as_a_count():
    cand = bench.Candidate("onnx-x", fake("x").predict, 1, None, "onnx", threads=None)
    out = bench.measure_throughput([cand], [1], 8, rounds=1, warmup=0, min_time_s=0.0, min_calls=1)
    count = out["setup"]["candidate_threads"]["onnx-x"]
    assert isinstance(count, int) and count == bench.ort_default_threads() >= 1
    assert "default" in out["setup"]["candidate_threads_notes"]["onnx-x"]


def test_ort_default_threads_matches_the_threads_a_default_session_starts(tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counting threads needs /proc")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "relu.onnx")
    before = len(os.listdir("/proc/self/task"))
    session = ort.InferenceSession(str(tmp_path / "relu.onnx"), providers=["CPUExecutionProvider"])
    started = len(os.listdir("/proc/self/task")) - before
    assert session.get_session_options().intra_op_num_threads == 0  # ORT itself does not say how many it uses
    assert bench.ort_default_threads() == started + 1  # its pool plus the calling thread


# ------------------------------------------------------------------------------------------------ stopping rule


def synthetic_timer(monkeypatch, seconds: dict[str, list[float]]) -> list[str]:
    """Replace the clock of the timing protocol: a visit of candidate `name` takes `seconds[name][i]` on its i-th
    timed visit (warm-up visits are not timed). Returns the log of timed visits."""
    from compressor.core import timing

    visits: list[str] = []
    times = {name: iter(values) for name, values in seconds.items()}

    class SyntheticVisit(timing.Visit):
        def __iter__(self):
            yield  # the candidate's predict, called once
            if self.timed:
                name = self.key[0]
                visits.append(name)
                self.seconds, self.calls = next(times[name]), self.min_calls

    monkeypatch.setattr(timing, "Visit", SyntheticVisit)
    return visits


def named(name: str) -> bench.Candidate:
    def predict(batch):
        return np.zeros((batch["input_ids"].shape[0], 2))

    predict.__name__ = name
    return bench.Candidate(name, predict, 1, None, "pytorch")


def test_a_settled_candidate_leaves_the_rounds_and_its_ratio_keeps_its_pairing(monkeypatch):
    """On a synthetic timer: a steady 2x candidate settles after the 3 rounds every candidate gets; a clearly slower
    one (0.5x) settles too; a noisy one is timed every round; the original is timed while any is. Each ratio pairs a
    candidate's i-th time with the original's i-th."""
    rounds = 8
    noisy = [0.5, 0.9, 0.4, 1.0, 0.45, 0.8, 0.5, 0.95]
    visits = synthetic_timer(
        monkeypatch,
        {"original": [1.0] * rounds, "steady": [0.5, 0.5, 0.505] + [9.0] * 5, "slow": [2.0, 2.1, 2.0] + [9.0] * 5,
         "noisy": noisy},
    )  # fmt: skip
    cands = [named(n) for n in ("original", "steady", "slow", "noisy")]
    out = bench.measure_throughput(
        cands, [4], [8], rounds=rounds, warmup=0, min_time_s=0.0, precision=0.03, reference="original"
    )
    assert visits.count("steady") == visits.count("slow") == 3, "settled after the minimum rounds"
    assert visits.count("noisy") == visits.count("original") == rounds
    speedups = bench.paired_speedups(out, "original")
    assert speedups["steady"]["8"]["4"]["per_round"] == pytest.approx([2.0, 2.0, 1 / 0.505])
    assert speedups["noisy"]["8"]["4"]["per_round"] == pytest.approx([1 / t for t in noisy])
    assert "95% interval" in out["setup"]["stopping"] and out["setup"]["precision"] == 0.03


def test_without_precision_every_candidate_gets_every_round(monkeypatch):
    visits = synthetic_timer(monkeypatch, {"original": [1.0] * 4, "steady": [0.5] * 4})
    bench.measure_throughput([named("original"), named("steady")], [4], [8], rounds=4, warmup=0, min_time_s=0.0)
    assert visits.count("steady") == visits.count("original") == 4


@pytest.mark.parametrize(
    ("ratios", "settled"),
    [
        ([2.0, 2.0], False),  # fewer than the minimum rounds
        ([2.0, 2.01, 1.99], True),  # tight
        ([2.0, 1.6, 2.4], False),  # wide, and above 1
        ([0.5, 0.52, 0.48], True),  # tight
        ([0.5, 0.7, 0.4, 0.6], True),  # wide but wholly below 1: never a speed-up
        ([0.9, 1.3, 0.8], False),  # straddles 1
    ],
)
def test_settled_ratio(ratios, settled):
    from compressor.core.timing import settled_ratio

    assert settled_ratio(ratios, 0.03) is settled
