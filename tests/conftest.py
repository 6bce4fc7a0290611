"""Shared fixtures: a tiny BERT with a real tokenizer on disk, and a small learnable CSV dataset."""

from __future__ import annotations

import csv
import importlib.util
import os
import random
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite's timings check behaviour, not speed: a busy CI neighbour must not make them wait for the CPU (they
# still log it); tests/test_contention.py checks the waiting itself.
os.environ.setdefault("COMPRESSOR_TIMING_WAIT_S", "0")
# "auto" starts from torch.export (the product's default); the suite's whole runs start it from the TorchScript tracer,
# which writes a tiny model's graph in a fraction of the time, and set here so that a machine's own setting cannot
# change what the suite runs. The default's parity is tested by name on every architecture and unit kind
# (tests/test_export.py), on the demo model with its int8 (tests/test_exporters.py), to OpenVINO, and with its
# fallback (tests/test_exporters.py: "auto" with the variable unset).
os.environ["COMPRESSOR_EXPORTER"] = "torchscript"

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the benchmark suite (benchmarks/) is not installed with the package: appended, so
    sys.path.append(str(ROOT))  # `make test-compat` still imports compressor from its wheel, benchmarks from here


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`compressor ARGS` run in this process (typer's `CliRunner`), given back as a subprocess gives it: the exit code
    and both streams, without a fresh interpreter importing torch and transformers for every refused recipe. The
    console script itself is run as a process by tests/test_compat.py."""
    from typer.testing import CliRunner

    from compressor.cli import app

    here = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["compressor", *args], result.exit_code, result.stdout, result.stderr)


def every_arch() -> list:
    """ARCHS as test parameters for the costliest per-architecture tests: those outside DISTINCT_ARCHS (BERT's parts
    under other names) marked `e2e`, so `make test` runs one architecture per declaration module and CI all."""
    from compressor.testing import ARCHS, DISTINCT_ARCHS

    return [pytest.param(arch, marks=() if arch in DISTINCT_ARCHS else pytest.mark.e2e) for arch in ARCHS]


@cache
def bench_script(name: str):
    """benchmarks/NAME.py imported as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_bench_script_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


POSITIVE = ["good", "great", "fine", "superb", "lovely", "fun"]
NEGATIVE = ["bad", "awful", "dull", "poor", "boring", "weak"]
FILLER = ["the", "movie", "film", "was", "plot", "acting", "a", "really", "quite", "story", "and", "but", ".", ","]


def make_tokenizer_dir(path: Path) -> Path:
    """A BERT word-piece tokenizer over the fixture vocabulary, saved like any hub tokenizer."""
    from transformers import BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *POSITIVE, *NEGATIVE, *FILLER, "##s", "##ly"]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab=str(path / "vocab.txt")).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised 3-layer × 4-head BERT classifier with tokenizer, as a local model directory (the
    runner tests fine-tune it, so it keeps transformers' own init)."""
    from compressor.testing import tiny_model

    path = make_tokenizer_dir(tmp_path_factory.mktemp("tiny_bert"))
    tiny_model("bert", layers=3, heads=4, head_size=8, randomized=False).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def mpnet_reference(tmp_path_factory):
    """A tiny MPNet classifier with its own tokenizer: other special tokens, another id for every word, no
    `token_type_ids`, so evaluating it on the base model's tokenisation would give other predictions."""
    from transformers import MPNetTokenizerFast

    from compressor.testing import tiny_model

    path = tmp_path_factory.mktemp("tiny_mpnet")
    vocab = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>", *reversed(FILLER), *NEGATIVE, *POSITIVE, "##s", "##ly"]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    MPNetTokenizerFast(vocab=str(path / "vocab.txt")).save_pretrained(path)
    tiny_model("mpnet", layers=2, heads=2, head_size=8, randomized=False).save_pretrained(path)
    return path


def make_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = rng.sample(FILLER, 5) + [rng.choice(POSITIVE if label else NEGATIVE)]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


@pytest.fixture(scope="session")
def tiny_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "reviews.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(make_rows(300))
    return path


def tiny_recipe(model_dir: Path, data: Path, out: Path, **overrides) -> dict:
    """A complete recipe dict for the tiny model; every stage runs in seconds."""
    recipe = {
        "name": "tiny",
        "seed": 0,
        "output_dir": str(out),
        "model": {"source": str(model_dir), "task_tuned": False},
        "data": {"source": str(data), "max_length": 16},
        "base_finetune": {"epochs": 10, "lr": 3e-3, "batch_size": 16},
        "prune": {
            "criterion": {"name": "taylor"},
            "target": 0.5,
            "steps": 2,
            "score_examples": 64,
            "finetune": {"epochs": 1, "lr": 5e-4, "batch_size": 16, "max_examples": 96},
        },
        "export": {"enabled": False},
        "bench": {"enabled": False},
        "analysis": {"enabled": False},
    }
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if field:
            recipe[section] = {**recipe.get(section, {}), field: value}
        else:
            recipe[section] = value
    return recipe


def pytest_report_header(config) -> list[str]:
    """The CPU the suite ran on, in the log: int8 kernels (VNNI or not) and core counts differ between machines."""
    from compressor.core.machine import ISA_CAP_ENV, cpu_summary, isa_cap
    from compressor.deploy.quantize import REDUCE_RANGE_ENV

    cpu = cpu_summary()
    forced = os.environ.get(REDUCE_RANGE_ENV)
    weights = f", int8 weight range forced by {REDUCE_RANGE_ENV}={forced}" if forced else ""
    capped = f", capped by {ISA_CAP_ENV}={isa_cap()}" if isa_cap() else ""
    line = f"cpu: {cpu['model']} ({cpu['vendor']}), flags {cpu['flags']}{capped}, {cpu['cores']} usable cores{weights}"
    return [line]


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models run far faster on one thread than with oversubscribed intra-op threads on a 2-core CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """Isolate the fine-tune cache per test."""
    path = tmp_path / "cache"
    monkeypatch.setenv("COMPRESSOR_CACHE", str(path))
    return path


@pytest.fixture
def task(tiny_model_dir):
    """A tiny in-memory task for API tests: (model, tokenizer, tokenised train, tokenised validation)."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from compressor.sources.batches import tokenize

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, attn_implementation="eager")
    train = tokenize(Dataset.from_list(make_rows(96, seed=1)), tok, ["text"], 16)
    val = tokenize(Dataset.from_list(make_rows(32, seed=2)), tok, ["text"], 16)
    return model, tok, train, val


def family_report(rows: list[dict], steps: list[dict] | None = None, **family) -> dict:
    """The smallest report.json `compressor pick` accepts for a family run with frontier `rows`
    (`compressor.report.schema.RunReport`); `steps` is its step log, `family` adds to its `family` section."""
    return {
        "schema_version": 1, "status": "complete", "name": "r", "model_source": "m", "data_source": "d",
        "labels": ["0", "1"], "steps": steps or [], "original": {"test": {"accuracy": None}},
        "family": {"targets": [2.0], "kind": "speedup", "runtime": "pytorch", "members": [], "frontier": rows,
                   **family},
    }  # fmt: skip


def one_target_report(steps: list[dict], pruned: dict, budget: dict) -> dict:
    """The smallest report.json of a one-target run: its member's `pruned` and `budget` at the top."""
    report = family_report([], steps)
    del report["family"]
    return report | {"pruned": pruned, "budget": budget}


def pruned_section(heads_left: int, ffn_neurons: int | None, model_dir: str) -> dict:
    """A member's `pruned` section (`compressor.report.schema.Pruned`) with the counts and directory readers use."""
    return {
        "test": {"accuracy": 0.8}, "heads_left": heads_left, "heads_total": 96, "heads_per_layer": [],
        "model_dir": model_dir, "plan": {}, "parameters": 1, "encoder_flops_per_example": 1, "flop_ratio": 1.0,
        "ffn_neurons": ffn_neurons,
    }  # fmt: skip


@pytest.fixture
def uncapped(monkeypatch):
    """No `ONEDNN_MAX_CPU_ISA`: for tests that read a CPU description of their own (a written cpuinfo), which
    `make test-avx2`'s cap would otherwise trim as it trims this machine's."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
