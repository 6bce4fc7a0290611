"""Real users' data and hostile recipes (issue 16): the sweep's table on a tiny model, text labels end to end, and
the output-directory rules (run identity, lock, --force setting the old run aside, `~`, symlinks)."""

from __future__ import annotations

import csv
import fcntl
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import make_rows, tiny_recipe
from typer.testing import CliRunner

from compressor.cli import app
from compressor.core import outdir
from compressor.core.errors import UserError
from compressor.recipe import DataSpec, dump_recipe, load_recipe
from compressor.sources.data import load_task_data

ROOT = Path(__file__).resolve().parents[1]


def _load_sweep():
    spec = importlib.util.spec_from_file_location("hostile_sweep", ROOT / "tests" / "hostile_cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostile_sweep"] = module
    spec.loader.exec_module(module)
    return module


sweep = _load_sweep()


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    return sweep.build_world(tmp_path_factory.mktemp("hostile") / "world", str(tiny_model_dir))


def test_the_table_covers_every_section_and_source_kind() -> None:
    assert len(sweep.CASES) >= 40
    sections = {c.section for c in sweep.CASES}
    assert {"model", "data", "base_finetune", "prune", "export", "bench", "analysis", "output_dir"} <= sections
    names = " ".join(c.name for c in sweep.CASES)
    for kind in ("builtin", "hub", "csv dir", "csv ", "jsonl", "json ", "parquet", "saved dir"):
        assert kind in names, kind


@pytest.mark.parametrize("case", sweep.CASES, ids=[c.name for c in sweep.CASES])
def test_hostile_input_is_one_line_exit_2_nothing_written(tmp_path, world, cache_dir, case) -> None:
    row = sweep.run_case(case, world, tmp_path / "recipe.yaml")
    assert row["exit"] == 2, row
    assert row["one_line"] and row["no_traceback"], row
    assert row["names_field"], f"expected '{case.field}' in: {row['message']}"
    assert row["nothing_written"], "the world directory changed"
    assert row["message_chars"] < 600 and row["clean"]
    assert not cache_dir.exists()


def _text_label_dir(root: Path) -> Path:
    """Three named classes in a local CSV directory; the positive/negative words of the fixture rows decide the
    class, and a third class has its own word."""
    root.mkdir()
    for split, n in (("train", 150), ("validation", 30), ("test", 30)):
        rows = make_rows(n, seed=len(split))
        for i, row in enumerate(rows):
            row["label"] = "neutral" if i % 3 == 0 else ("positive" if row["label"] else "negative")
            row["text"] = "the plot" if row["label"] == "neutral" else row["text"]
        with (root / f"{split}.csv").open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=["text", "label"])
            writer.writeheader()
            writer.writerows(rows)
    return root


def test_text_labels_run_end_to_end_and_keep_their_names(tmp_path, tiny_model_dir, cache_dir) -> None:
    data = _text_label_dir(tmp_path / "news")
    out = tmp_path / "out"
    recipe = tiny_recipe(tiny_model_dir, data, out, export={"enabled": True, "variants": ["fp32"]})
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    names = ["negative", "neutral", "positive"]  # sorted names of the training split
    report = json.loads((out / "report.json").read_text())
    assert report["labels"] == names
    assert "labels: negative, neutral, positive" in (out / "report.md").read_text()
    id2label = {str(i): n for i, n in enumerate(names)}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == id2label and config["label2id"] == {n: i for i, n in enumerate(names)}
    onnx_configs = sorted((out / "onnx").rglob("config.json"))
    assert onnx_configs, "the export writes a config beside its graph"
    for file in onnx_configs:
        assert json.loads(file.read_text())["id2label"] == id2label
    for name in ("report.json", "report.md", "recipe.resolved.yaml", outdir.IDENTITY_FILE):
        assert (out / name).stat().st_mode & 0o777 == (out / "run.log").stat().st_mode & 0o777, name
    assert outdir.is_run(out)


def test_bom_duplicates_and_long_documents_load(tmp_path) -> None:
    path = tmp_path / "messy.csv"
    rows = [f"{'word ' * 5000},b", "a short one,a", "a short one,a", "dup,b"] * 5
    path.write_bytes(b"\xef\xbb\xbf" + ("text,label\n" + "\n".join(rows) + "\n").encode())
    data = load_task_data(DataSpec(source=str(path)))
    assert data.label_names == ["a", "b"] and data.train.column_names == ["text", "label"]
    assert len(data.train) + len(data.validation) + len(data.test) == 20
    jsonl = tmp_path / "empty_texts.jsonl"
    jsonl.write_text("".join(json.dumps({"text": "" if i % 2 else "a b", "label": i % 2}) + "\n" for i in range(20)))
    assert "" in load_task_data(DataSpec(source=str(jsonl))).train["text"], "an empty document is kept"


def fake_finished_run(out: Path, resolved: str) -> None:
    outdir.claim(outdir.RunDir(out, "new"), resolved)
    (out / "report.json").write_text('{"status": "complete"}')
    outdir.finish(out)


def test_force_sets_the_old_run_aside_until_the_new_one_finishes(tmp_path, tiny_model_dir, tiny_csv, monkeypatch):
    out = tmp_path / "out"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, out)))
    fake_finished_run(out, dump_recipe(load_recipe(path)))
    from compressor.pipeline import runner

    def fail(*_args, **_kwargs):
        raise UserError("model.source: simulated failure after every input loaded")

    monkeypatch.setattr(runner, "base_model", fail)
    result = CliRunner().invoke(app, ["run", str(path), "--force"])
    assert result.exit_code == 2 and "simulated failure" in result.stderr
    previous = outdir.previous_path(out)
    assert (previous / "report.json").read_text() == '{"status": "complete"}', "the old run is kept aside"
    assert not (out / "report.json").exists() and outdir.is_run(out)
    outdir.finish(out)
    assert previous.exists(), "an unfinished new run never deletes the old one"
    (out / "report.json").write_text("{}")
    outdir.finish(out)
    assert not previous.exists()


def test_bad_data_with_force_leaves_the_old_run_in_place(tmp_path, tiny_model_dir, tiny_csv, world) -> None:
    out = tmp_path / "out"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, Path(world["unseen"]), out)))
    fake_finished_run(out, "name: old\n")
    before = sorted(p.name for p in out.iterdir())
    result = CliRunner().invoke(app, ["run", str(path), "--force"])
    assert result.exit_code == 2 and "data.label_field" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == before and not outdir.previous_path(out).exists()


def test_a_second_run_on_a_locked_directory_is_refused(tmp_path, tiny_model_dir, tiny_csv) -> None:
    out = tmp_path / "out"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe(tiny_model_dir, tiny_csv, out)))
    fake_finished_run(out, dump_recipe(load_recipe(path)))
    lock = tmp_path / ".out.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = CliRunner().invoke(app, ["run", str(path), "--force"])
        assert result.exit_code == 2 and "in use by another compressor run" in result.stderr
        with pytest.raises(UserError, match="in use"):
            outdir.claim(outdir.RunDir(tmp_path / "out", "resume"), "name: x\n")
        assert (out / "report.json").exists()
    finally:
        holder.communicate("")


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_claim_holds_the_lock_until_finish(tmp_path) -> None:
    out = tmp_path / "out"
    outdir.claim(outdir.RunDir(out, "new"), "name: a\n")
    fd = os.open(tmp_path / ".out.lock", os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    outdir.finish(out)
    assert not (tmp_path / ".out.lock").exists()


def test_a_marker_alone_is_not_a_run(tmp_path) -> None:
    out = tmp_path / "mine"
    (out / "state").mkdir(parents=True)
    (out / "recipe.resolved.yaml").write_text("name: x\n")
    (out / outdir.IDENTITY_FILE).write_text(json.dumps({"run_id": "abc", "recipe_sha256": "0" * 64}))
    assert not outdir.is_run(out)
    with pytest.raises(UserError, match="holds no compressor run"):
        outdir.check_run_dir(str(out), force=True, same_recipe=lambda _: True)


def test_tilde_expands_explicitly_and_home_itself_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    target = outdir.check_run_dir("~/runs/a", force=False, same_recipe=lambda _: True)
    assert target.path == tmp_path / "home" / "runs" / "a" and target.mode == "new"
    for bad in ("~", "~/", str(tmp_path), ".."):
        with pytest.raises(UserError, match="^output_dir: "):
            outdir.check_run_dir(bad, force=True, same_recipe=lambda _: True)
    assert not (tmp_path / "~").exists()


@pytest.mark.skipif(not Path("/proc/self/mountinfo").exists(), reason="needs Linux's /proc")
def test_a_system_directory_is_refused_up_front_and_at_claim(tmp_path) -> None:
    """/proc takes no files even from root (whom permission checks let through): `check_run_dir` refuses it by its
    filesystem type, and `claim` turns a failure to create the lock or the directory into one line as well."""
    with pytest.raises(UserError, match=r"^output_dir: '/proc/compressor-test/run' is on the system filesystem proc"):
        outdir.check_run_dir("/proc/compressor-test/run", force=False, same_recipe=lambda _: True)
    with pytest.raises(UserError, match=r"^output_dir: cannot create '/proc/compressor-test/\.run\.lock' \("):
        outdir.claim(outdir.RunDir(Path("/proc/compressor-test/run"), "new"), "name: x\n")
    assert outdir.check_run_dir(str(tmp_path / "run"), force=False, same_recipe=lambda _: True).mode == "new"
