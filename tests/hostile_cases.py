"""Hostile-recipe sweep: every case must end cleanly (exit 2, one line naming the field, no traceback, nothing
written anywhere under the sweep's directory).

Cases cover every recipe section and every data source kind (built-in, hub name, CSV/JSONL/JSON/parquet file,
CSV directory, `save_to_disk` directory) and the output-directory rules. `tests/test_hostile.py` runs this
table on a tiny model; run as a script it runs it on the built-in MiniLM (only its config and tokenizer are read).
Usage: python tests/hostile_cases.py → prints a table (exit 1 when a case is not clean)
"""

from __future__ import annotations

import csv
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("sports", "tech", "arts")
World = dict[str, str]


@dataclass(frozen=True)
class Case:
    """One hostile input: `field` is what the one-line error must name; `recipe` gives dotted-key overrides of the
    base recipe (or `raw` the recipe file's text); `args` are extra `compressor run` options."""

    name: str
    section: str
    field: str
    recipe: Callable[[World], dict] = lambda w: {}
    args: tuple[str, ...] = ()
    raw: Callable[[World], str] | None = None


def _rows(n: int, labels=CLASSES) -> list[dict]:
    return [{"text": f"{labels[i % len(labels)]} story number {i}", "label": labels[i % len(labels)]} for i in range(n)]


def _csv(path: Path, rows: list[dict], fields=("text", "label"), encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding=encoding) as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _split_dir(path: Path, train: list[dict], validation: list[dict]) -> Path:
    for split, rows in (("train", train), ("validation", validation), ("test", validation)):
        _csv(path / f"{split}.csv", rows)
    return path


def build_world(root: Path, model_source: str) -> World:
    """Good and broken inputs under `root` (the sweep checks that nothing under it changes)."""
    import datasets
    import pandas as pd

    data = root / "data"
    good = _split_dir(data / "good", _rows(30), _rows(9))
    _split_dir(data / "unseen", _rows(30), [{"text": "x", "label": "food"}])
    _split_dir(data / "single", _rows(30, labels=("tech",)), _rows(9))
    _csv(data / "missing_label.csv", [*_rows(20), {"text": "no label here", "label": ""}])
    _csv(data / "null_text.csv", [*_rows(20), {"text": "", "label": "tech"}])
    _csv(data / "latin1.csv", [{"text": "café crème", "label": "arts"}] * 20, encoding="latin-1")
    _csv(data / "header_only" / "train.csv", [])
    (data / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*_rows(20), *_rows(20, labels=(1, 2))]))
    (data / "broken.json").write_text('{"text": "a", "label": ')
    pd.DataFrame({"review": ["a", "b"] * 10, "label": [0, 1] * 10}).to_parquet(data / "no_text.parquet")
    datasets.DatasetDict(train=datasets.Dataset.from_list(_rows(20))).save_to_disk(str(data / "saved"))
    outs = root / "outs"
    (outs / "foreign" / "model").mkdir(parents=True)
    (outs / "foreign" / "model" / "notes.txt").write_text("mine")
    (outs / "state_only" / "state").mkdir(parents=True)
    (outs / "empty").mkdir()
    (outs / "link").symlink_to(outs / "empty", target_is_directory=True)
    (outs / "a_file").write_text("x")
    (root / "home").mkdir()
    _token_head_model(root / "models" / "token_head")
    world = {"root": str(root), "model": model_source, "good": str(good), "out": str(root / "runs" / "out")}
    world["token_head"] = str(root / "models" / "token_head")
    world |= {p.stem if p.is_file() else p.name: str(p) for p in [*data.iterdir(), *outs.iterdir()]}
    return world


def _token_head_model(path: Path) -> Path:
    """A tiny BERT saved as a token classifier with the world's label count: right labels, wrong head (its
    sequence classifier would load with a fresh pooler)."""
    from transformers import BertForTokenClassification

    from compressor.testing import tiny_config

    BertForTokenClassification(tiny_config("bert", num_labels=len(CLASSES))).save_pretrained(path)
    return path


def base_recipe(w: World) -> dict:
    """A valid small recipe on the world's good data (export, bench and analysis off unless a case turns them on)."""
    return {
        "name": "hostile",
        "output_dir": w["out"],
        "model": {"source": w["model"]},
        "data": {"source": w["good"], "max_length": 16, "max_train_examples": 16},
        "base_finetune": {"epochs": 1, "batch_size": 8},
        "prune": {"target": 0.5, "steps": 2, "score_examples": 8, "finetune": None},
        "export": {"enabled": False},
        "bench": {"enabled": False},
        "analysis": {"enabled": False},
    }


def with_overrides(recipe: dict, overrides: dict) -> dict:
    """`recipe` with each dotted key (`prune.criterion.params.x`) set, creating sections on the way."""
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = recipe
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return recipe


def _bomb(levels: int = 12) -> str:
    """'Billion laughs': 10**12 leaves from 110 aliases."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"name: *a{levels - 1}"]) + "\n"


def _duplicate_key(w: World) -> str:
    """The base recipe with `prune.target` given a second time (plain PyYAML would keep the last value)."""
    return yaml.safe_dump(base_recipe(w)).replace("prune:\n", "prune:\n  target: 0.25\n", 1)


D, P, INF, NAN = "data.source", "prune.criterion.params.", float("inf"), float("nan")
CASES: list[Case] = [
    # recipe file and top level
    Case("yaml alias bomb", "file", "YAML aliases", raw=lambda w: _bomb()),
    Case("huge value", "top", "name", raw=lambda w: f"name: {'x' * 900_000}\n"),
    Case("unknown key", "top", "modle", lambda w: {"modle": {}}),
    Case("seed huge", "top", "seed", lambda w: {"seed": 10**40}),
    Case("key given twice", "prune", "prune.target: given twice", raw=_duplicate_key),
    # output_dir
    Case("output ~", "output_dir", "output_dir", lambda w: {"output_dir": "~"}),
    Case("output cwd", "output_dir", "output_dir", lambda w: {"output_dir": "."}),
    Case("output symlink", "output_dir", "output_dir", lambda w: {"output_dir": w["link"]}, ("--force",)),
    Case("output foreign", "output_dir", "output_dir", lambda w: {"output_dir": w["foreign"]}),
    Case("output foreign --force", "output_dir", "output_dir", lambda w: {"output_dir": w["foreign"]}, ("--force",)),
    Case("output state/ only", "output_dir", "output_dir", lambda w: {"output_dir": w["state_only"]}, ("--force",)),
    Case("output is a file", "output_dir", "output_dir", lambda w: {"output_dir": w["a_file"]}),
    Case("output under a file", "output_dir", "output_dir", lambda w: {"output_dir": w["a_file"] + "/run"}),
    Case("output under /proc", "output_dir", "output_dir", lambda w: {"output_dir": "/proc/compressor-hostile/run"}),
    # model
    Case("model path missing", "model", "model.source", lambda w: {"model.source": w["root"] + "/nope"}),
    Case("model builtin unknown", "model", "model.source", lambda w: {"model.source": "builtin:gpt-17"}),
    Case("model revision list", "model", "model.revision", lambda w: {"model.revision": ["main"]}),
    Case("builtin with remote code", "model", "model.trust_remote_code",
         lambda w: {"model.source": "builtin:minilm-l6", "model.trust_remote_code": True}),
    Case("token-classification head", "model", "model.source",
         lambda w: {"model.source": w["token_head"], "model.task_tuned": True}),
    # data: schema and limits
    Case("max_length huge", "data", "data.max_length", lambda w: {"data.max_length": 10**6}),
    Case("max_length > positions", "data", "data.max_length", lambda w: {"data.max_length": 1024}),
    Case("three text fields", "data", "data.text_fields", lambda w: {"data.text_fields": ["a", "b", "c"]}),
    Case("splits incomplete", "data", "data.splits", lambda w: {"data.splits": {"train": "train"}}),
    Case("split seed negative", "data", "data.split_seed", lambda w: {"data.split_seed": -3}),
    # data: every source kind
    Case("builtin unknown", "data", D, lambda w: {D: "builtin:imdb"}),
    Case("hub name offline", "data", D, lambda w: {D: "nobody-h2/no-such-dataset"}),
    Case("csv dir unseen label", "data", "data.label_field", lambda w: {D: w["unseen"]}),
    Case("csv dir single class", "data", "data.label_field", lambda w: {D: w["single"]}),
    Case("csv dir header only", "data", "data.splits", lambda w: {D: w["header_only"]}),
    Case("csv missing label", "data", "data.label_field", lambda w: {D: w["missing_label"]}),
    Case("csv empty text", "data", "data.text_fields", lambda w: {D: w["null_text"]}),
    Case("csv not utf-8", "data", D, lambda w: {D: w["latin1"]}),
    Case("jsonl mixed labels", "data", "data.label_field", lambda w: {D: w["mixed"]}),
    Case("json malformed", "data", D, lambda w: {D: w["broken"]}),
    Case("parquet no text", "data", "data.text_fields", lambda w: {D: w["no_text"]}),
    Case("saved dir no validation", "data", "data.splits.validation", lambda w: {D: w["saved"]}),
    # training
    Case("epochs inf", "base_finetune", "base_finetune.epochs", lambda w: {"base_finetune.epochs": INF}),
    Case("epochs 1e9", "base_finetune", "base_finetune.epochs", lambda w: {"base_finetune.epochs": 1e9}),
    Case("lr nan", "base_finetune", "base_finetune.lr", lambda w: {"base_finetune.lr": NAN}),
    Case("batch size 0", "base_finetune", "base_finetune.batch_size", lambda w: {"base_finetune.batch_size": 0}),
    # prune
    Case("steps > heads", "prune", "prune.steps", lambda w: {"prune.steps": 100}),
    Case("target nan", "prune", "prune.target", lambda w: {"prune.target": NAN}),
    Case("target quoted", "prune", "prune.target", lambda w: {"prune.target": "0.5"}),
    Case("warmup 1.5", "prune", "prune.finetune.warmup_ratio", lambda w: {"prune.finetune": {"warmup_ratio": 1.5}}),
    Case("param huge", "prune", P + "normalize", lambda w: {P + "normalize": "y" * 10**5}),
    Case("param inf", "prune", P + "steps", lambda w: {"prune.criterion.name": "attribution", P + "steps": INF}),
    # export, bench, analysis
    Case("export atol inf", "export", "export.atol", lambda w: {"export.atol": INF}),
    Case("export opset 99", "export", "export.opset", lambda w: {"export.opset": 99}),
    Case("bench seq_lens huge", "bench", "bench.seq_lens", lambda w: {"bench.seq_lens": [100_000]}),
    Case("bench > positions", "bench", "bench.seq_lens", lambda w: {"bench": {"enabled": True, "seq_lens": [2048]}}),
    Case("bench min_time inf", "bench", "bench.min_time_s", lambda w: {"bench.min_time_s": INF}),
    Case("analysis examples", "analysis", "analysis.examples", lambda w: {"analysis.examples": 1}),
    Case("sieve alpha nan", "analysis", "analysis.roles.sieve_alpha", lambda w: {"analysis.roles.sieve_alpha": NAN}),
]  # fmt: skip


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root` with its kind, size and modification time (a symlink as its target)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            found[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, os.path.realpath(path))
    return found


@contextmanager
def _inside(world: World) -> Iterator[None]:
    """Run with the sweep root as working directory and its `home/` as HOME, so `~` and `.` stay inside it."""
    cwd, home = os.getcwd(), os.environ.get("HOME")
    os.chdir(world["root"])
    os.environ["HOME"] = str(Path(world["root"]) / "home")
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ["HOME"] = home or ""


def run_case(case: Case, world: World, recipe_file: Path) -> dict:
    """Run `compressor run` on the case in-process; returns what happened and whether it was clean."""
    from typer.testing import CliRunner

    from compressor.cli import app

    text = case.raw(world) if case.raw else yaml.safe_dump(with_overrides(base_recipe(world), case.recipe(world)))
    recipe_file.write_text(text)
    root = Path(world["root"])
    before = _snapshot(root)
    start = time.perf_counter()
    with _inside(world):
        result = CliRunner().invoke(app, ["run", str(recipe_file), *case.args])
    seconds = time.perf_counter() - start
    lines = result.stderr.strip().splitlines()
    row = {
        "case": case.name,
        "section": case.section,
        "exit": result.exit_code,
        "one_line": len(lines) == 1 and lines[0].startswith("compressor: error: "),
        "names_field": bool(lines) and case.field in lines[0],
        "no_traceback": "Traceback" not in result.output and not isinstance(result.exception, Exception),
        "nothing_written": _snapshot(root) == before,
        "message_chars": len(result.stderr),
        "seconds": round(seconds, 2),
        "message": " ".join(result.stderr.split()).replace(str(root.parent), "$TMP")[:160],
    }
    row["clean"] = row["exit"] == 2 and all(row[k] for k in ("one_line", "names_field", "no_traceback"))
    row["clean"] = row["clean"] and row["nothing_written"] and row["message_chars"] < 600
    return row


def sweep(model_source: str, work: Path) -> list[dict]:
    import compressor.cli  # noqa: F401  (imported once up front, so the first case's time is its own)
    import compressor.pipeline.runner  # noqa: F401

    world = build_world(work / "world", model_source)
    return [run_case(case, world, work / "recipe.yaml") for case in CASES]


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="compressor-hostile-"))
    os.environ["COMPRESSOR_CACHE"] = str(work / "cache")
    rows = sweep("builtin:minilm-l6", work)
    clean = sum(r["clean"] for r in rows)
    print("| case | section | exit | clean | s | message |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['section']} | {r['exit']} | {'yes' if r['clean'] else 'NO'} | {r['seconds']} "
              f"| {r['message'][19:110]} |")  # fmt: skip
    summary = {"cases": len(rows), "clean": clean, "clean_pct": round(100 * clean / len(rows), 1)}
    print(f"\n{clean}/{len(rows)} clean ({summary['clean_pct']}%); cache untouched: {not (work / 'cache').exists()}")
    sys.exit(0 if clean == len(rows) else 1)


if __name__ == "__main__":
    main()
