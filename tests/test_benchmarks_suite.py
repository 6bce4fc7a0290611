"""The benchmark suite (benchmarks/): docs/results.md is what the template and the results make, every figure on
it has its result file and its declared experiment (as many experiments as figures), every command on it parses
with the real parsers, and the runner resumes (a finished result kept, a finished step skipped, an interrupted step
run again without --force) and writes the one schema with its provenance."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import typer.main
from conftest import ROOT

from benchmarks import page, parts, runner, suite
from benchmarks.__main__ import main as suite_main
from benchmarks.__main__ import parser as suite_parser
from benchmarks.readers import at_least
from benchmarks.schema import read_result
from compressor.bench.quality import hits_string
from compressor.cli import app
from compressor.core.errors import UserError
from compressor.recipe import load_recipe, settings_of
from compressor.report.seeds import summarize_seeds

PAGE_TEXT = page.PAGE.read_text()
EXPERIMENTS = suite.load_experiments()
BLOCK = re.compile(r"<!-- experiment: ([a-z0-9_]+) -->\n(.*?)<!-- /experiment -->", re.DOTALL)
COMMAND = re.compile(r"`((?:python -m benchmarks|python benchmarks/|compressor |make )[^`]*)`")


def test_the_page_is_what_its_template_and_the_results_make() -> None:
    assert PAGE_TEXT == page.page_text(), "docs/results.md is stale: run `python -m benchmarks page`"


def test_as_many_experiments_as_figures_each_once() -> None:
    on_page = Counter(name for name, _ in BLOCK.findall(PAGE_TEXT))
    in_template = Counter(page.MARKER.findall(page.TEMPLATE.read_text()))
    assert on_page == in_template == Counter(list(EXPERIMENTS))


def test_every_figure_on_the_page_has_its_result_file_and_no_result_is_orphaned() -> None:
    for name, text in BLOCK.findall(PAGE_TEXT):
        has_table = "| figure | value |" in text
        assert has_table == (suite.RESULTS / f"{name}.json").exists(), name
    for named in re.findall(r"benchmarks/results/([\w.]+\.json)", PAGE_TEXT):
        assert (suite.RESULTS / named).exists(), f"docs/results.md names benchmarks/results/{named}"
    files = {p.stem for p in suite.RESULTS.glob("*.json")}
    assert files <= set(EXPERIMENTS), f"result files of no experiment: {sorted(files - set(EXPERIMENTS))}"
    stored = {p.name.removesuffix(".parts") for p in suite.RESULTS.glob("*.parts")}  # `python -m benchmarks parts`
    assert stored <= set(EXPERIMENTS), f"stored parts of no experiment: {sorted(stored - set(EXPERIMENTS))}"
    for name in files:
        result = read_result(suite.RESULTS / f"{name}.json")
        assert (result.experiment, result.figure, result.goal) == (
            name,
            EXPERIMENTS[name].figure,
            EXPERIMENTS[name].goal,
        )
        assert result.legacy or result.provenance.script is None
        assert not result.legacy or result.provenance.note, f"{name}: a legacy result says where it came from"


def _parse_compressor(args: list[str]) -> dict:
    """`compressor ARGS` parsed by the real command line (typer's click), as its subcommand's parameters."""
    group = typer.main.get_command(app)
    ctx = group.make_context("compressor", list(args))
    name, command, rest = group.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
    return command.make_context(name, rest, parent=ctx).params


def _commands() -> list[str]:
    return sorted(set(COMMAND.findall(PAGE_TEXT)))


def test_the_page_has_commands_of_every_kind() -> None:
    heads = {c.split()[0] + (" " + c.split()[1] if c.startswith("python") else "") for c in _commands()}
    assert {"python -m", "compressor", "python benchmarks/peers.py", "make"} <= heads


@pytest.mark.parametrize("command", _commands())
def test_every_command_on_the_page_runs_as_written(command) -> None:
    args = shlex.split(command.replace("TEXT", "nothing"))
    if args[:3] == ["python", "-m", "benchmarks"]:
        parsed = suite_parser().parse_args(args[3:])
        if parsed.command == "run":
            assert parsed.name in EXPERIMENTS, f"{command}: no experiment '{parsed.name}'"
    elif args[0] == "compressor":
        params = _parse_compressor(args[1:])
        recipe = params.get("recipe")
        assert recipe is None or (ROOT / recipe).is_file(), f"{command}: no recipe file"
    elif args[0] == "python":
        assert (ROOT / args[1]).is_file(), command
    else:
        target = args[1]
        assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), re.MULTILINE), command


def test_every_declaration_runs_existing_recipes_with_parsable_commands() -> None:
    for exp in EXPERIMENTS.values():
        assert exp.recipe is None or (ROOT / exp.recipe).is_file(), exp.name
        for args in exp.commands():
            if args[0] == "compressor":
                params = _parse_compressor(args[1:])  # parsing checks the options; a `run` must name a recipe
                if params.get("recipe") is None:  # `export`, `bench` without one
                    continue
                assert (ROOT / params["recipe"]).is_file(), exp.name
                if params.get("settings"):  # `--set` fields the recipe takes, values it validates
                    load_recipe(ROOT / params["recipe"], settings_of(params["settings"]))


def test_the_headline_says_how_many_runs_were_made_toward_it() -> None:
    (text,) = [t for name, t in BLOCK.findall(PAGE_TEXT) if name == "mpnet_vs_minilm"]
    assert "Runs made toward this figure: **11**" in text and "read on test" in text


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("reader", "nope", "reader"),
        ("reader_args", {"bogus": 1}, "reader_args: ['bogus'] are not parameters of reader 'seeds'"),
        ("steps", [], "steps"),
        ("figure", None, "figure"),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_field(tmp_path, field, value, message) -> None:
    declared = {"figure": "f", "goal": "g", "steps": [{"command": "python x.py"}], "reader": "seeds"}
    (tmp_path / "bad.yaml").write_text(json.dumps(declared | {field: value}))
    with pytest.raises(UserError, match=re.escape(message)) as err:
        suite.load_experiments(tmp_path)
    assert str(err.value).startswith("bad.yaml: ") and "\n" not in str(err.value)


def test_the_command_line_refuses_an_unknown_experiment_and_a_missing_else_running(capsys) -> None:
    with pytest.raises(SystemExit) as unknown:
        suite_main(["run", "nosuch", "--else-running", "x"])
    err = capsys.readouterr().err
    assert unknown.value.code == 2 and err.count("\n") == 1 and "'nosuch' is not declared" in err
    with pytest.raises(SystemExit) as silent:
        suite_main(["run", "demo"])
    assert silent.value.code == 2 and "--else-running" in capsys.readouterr().err


def test_a_goal_with_an_interval_is_met_only_when_the_whole_interval_is() -> None:
    assert at_least(-0.2, -0.5, -0.4, 0.1) is True
    assert at_least(-0.2, -0.5, -0.9, 0.3) is None
    assert at_least(-1.2, -0.5, -1.6, -0.7) is False
    assert at_least(-0.6, -0.5) is False and at_least(0.0, None) is None


STUB = '''
"""A stand-in for `compressor run --seeds 0,1` (plain Python, so it starts at once): one repeat per seed under
OUT/seed-K/ (a finished one kept), stopping before seed 1 while OUT/../interrupt exists; then seeds.json, the
product's summary of these repeats, made beforehand by the test."""
import shutil, sys
from pathlib import Path

out = Path(sys.argv[1])
made = out.parent / "made"
log = out.parent / "log.txt"
for k in (0, 1):
    done = out / f"seed-{k}" / "report.json"
    if done.exists():
        with log.open("a") as f: f.write(f"kept {k}\\n")
        continue
    if k == 1 and (out.parent / "interrupt").exists():
        sys.exit(3)
    done.parent.mkdir(parents=True)
    shutil.copy(made / f"report-{k}.json", done)
    with log.open("a") as f: f.write(f"ran {k}\\n")
shutil.copy(made / "seeds.json", out / "seeds.json")
'''


def _repeats(names: dict[str, str], seeds: tuple[int, ...], size: int) -> dict[int, dict]:
    """Minimal report.json of each repeat: frontier rows and bench hits of `names` {candidate: runtime}."""
    rng = np.random.default_rng(0)
    reports = {}
    for k in seeds:
        hits = {n: rng.random(size) < 0.8 for n in names}
        role = {n: "baseline" if n.endswith("layer-drop") else "member" if "/" in n else "original" for n in names}
        rows = [{"name": n, "role": role[n], "runtime": r} for n, r in names.items()]
        quality = {n: {"accuracy": float(h.mean()), "hits": hits_string(h)} for n, h in hits.items()}
        reports[k] = {"frontier": rows, "bench": {"quality": {"results": quality}}}
    return reports


def _stub_experiment(tmp_path: Path, parts: list[str] | None = None) -> suite.Experiment:
    (tmp_path / "stub.py").write_text(STUB)
    (tmp_path / "made").mkdir()
    reports = _repeats({"pytorch-original": "pytorch", "3x/pytorch": "pytorch"}, (0, 1), 200)
    for k, report in reports.items():
        (tmp_path / "made" / f"report-{k}.json").write_text(json.dumps(report))
    (tmp_path / "made" / "seeds.json").write_text(json.dumps(summarize_seeds(reports, resamples=200)))
    declared = {
        "figure": "stub family over seeds",
        "goal": "3x within 2 points",
        "seeds": [0, 1],
        "runtimes": ["pytorch"],
        "steps": [
            {
                "command": f"python {tmp_path / 'stub.py'} {{output}}",
                "output": str(tmp_path / "out"),
                "done": "seeds.json",
                "parts": parts or [],
            }
        ],  # fmt: skip
        "reader": "seeds",
        "reader_args": {"min_gap": {"3x": -2.0}},
    }
    (tmp_path / "decl").mkdir()
    (tmp_path / "decl" / "stub.yaml").write_text(json.dumps(declared))
    return suite.experiment("stub", tmp_path / "decl")


def test_the_runner_resumes_keeps_and_forces_and_writes_the_schema(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COMPRESSOR_CACHE", str(tmp_path / "empty-cache"))
    exp, results, log = _stub_experiment(tmp_path), tmp_path / "results", tmp_path / "log.txt"
    (tmp_path / "interrupt").touch()
    with pytest.raises(UserError, match="step failed \\(exit 3\\).*rerun to resume it"):
        runner.run_experiment(exp, "nothing else", results=results, log=lambda _: None)
    assert not (results / "stub.json").exists() and log.read_text() == "ran 0\n"

    (tmp_path / "interrupt").unlink()
    with pytest.raises(UserError, match="--else-running"):
        runner.run_experiment(exp, " ", results=results)
    first = runner.run_experiment(exp, "nothing else", results=results, log=lambda _: None)
    assert log.read_text() == "ran 0\nkept 0\nran 1\n"  # the interrupted seed list resumed, seed 0 kept
    stored = read_result(results / "stub.json")
    assert stored == first
    (row,) = stored.rows
    summary = json.loads((tmp_path / "out" / "seeds.json").read_text())
    (gap,) = summary["gaps"]
    assert (row.value, [row.low, row.high]) == (round(gap["mean"], 2), [round(x, 2) for x in gap["ci95"]])
    assert (row.seeds, row.n, row.unit, row.goal) == ([0, 1], 200, "points", ">= -2 points")
    assert row.met == at_least(row.value, -2.0, row.low, row.high)
    record = stored.provenance
    assert (record.else_running, record.cache, stored.legacy) == ("nothing else", "empty", False)
    assert record.cpu and record.int8_features and record.seconds is not None and record.commit
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", record.date)
    assert record.commands == [f"python {tmp_path / 'stub.py'} {tmp_path / 'out'}"]

    messages: list[str] = []
    kept = runner.run_experiment(exp, "other", results=results, log=messages.append)
    assert kept == first and log.read_text().count("\n") == 3 and "kept stub.json" in messages[0]

    (results / "stub.json").unlink()  # the result lost, the step's output finished: read again, nothing rerun
    again = runner.run_experiment(exp, "other", results=results, log=messages.append)
    assert again.rows == first.rows and log.read_text().count("\n") == 3
    assert any("kept finished step" in m for m in messages)

    forced = runner.run_experiment(exp, "forced", force=True, results=results, log=lambda _: None)
    assert log.read_text().endswith("kept 0\nkept 1\n") and forced.provenance.else_running == "forced"


def test_parts_stored_in_one_session_resume_the_step_in_the_next_and_say_where_they_ran(tmp_path, monkeypatch) -> None:
    """A repeat finished before the session ended, stored (`python -m benchmarks parts`), is restored into the
    next session's fresh output, so the step runs only the repeats left, and the result says where the part ran."""
    monkeypatch.setenv("COMPRESSOR_CACHE", str(tmp_path / "empty-cache"))
    exp, results, log = _stub_experiment(tmp_path, ["seed-*/report.json"]), tmp_path / "results", tmp_path / "log.txt"
    with pytest.raises(UserError, match="nothing in the steps' outputs matches their parts patterns; nothing stored"):
        parts.store_parts(exp, "nothing else", results)
    (tmp_path / "interrupt").touch()
    with pytest.raises(UserError, match="step failed"):
        runner.run_experiment(exp, "nothing else", results=results, log=lambda _: None)
    with pytest.raises(UserError, match="--else-running"):
        parts.store_parts(exp, " ", results)
    assert parts.store_parts(exp, "a test beside it", results) == ["step-0/seed-0/report.json"]
    shutil.rmtree(tmp_path / "out")  # the next session: a fresh machine, the parts committed
    (tmp_path / "interrupt").unlink()
    messages: list[str] = []
    result = runner.run_experiment(exp, "nothing else", results=results, log=messages.append)
    assert log.read_text() == "ran 0\nkept 0\nran 1\n" and "restored step-0/seed-0/report.json" in messages[0]
    (record,) = result.provenance.parts
    assert record["part"] == "step-0/seed-0/report.json" and record["else_running"] == "a test beside it"
    assert record["commit"] and record["cpu_identity"] and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", record["date"])
    assert read_result(results / "stub.json").provenance.parts == [record]
    parts.store_parts(exp, "a test beside it", results, commit="abc1234")  # stored later than they ran
    assert [(r["part"], r["commit"]) for r in parts.records(exp, results)] == [
        ("step-0/seed-0/report.json", "abc1234"),
        ("step-0/seed-1/report.json", "abc1234"),
    ]


def test_a_stored_part_the_experiment_no_longer_names_is_refused_before_anything_is_copied(tmp_path) -> None:
    """`parts.json` is edited by hand or outlives an edit of the experiment: a record naming a step the experiment
    lacks, a file the parts folder lacks, or a file none of the step's patterns matches is one line naming it, and
    no part is restored."""
    exp, results = _stub_experiment(tmp_path, ["seed-*/report.json"]), tmp_path / "results"
    folder = parts.parts_dir(exp, results)
    (folder / "step-0" / "seed-0").mkdir(parents=True)
    (folder / "step-0" / "seed-0" / "report.json").write_text("{}")
    (folder / "step-0" / "seed-0" / "run.log").write_text("")
    good = {"part": "step-0/seed-0/report.json", "commit": "abc1234"}
    for bad, message in (
        ("step-1/seed-0/report.json", "part 'step-1/seed-0/report.json' names no step of stub \\(it has 1\\)"),
        ("seed-0/report.json", "part 'seed-0/report.json' names no step of stub"),
        ("step-0/seed-1/report.json", "part 'step-0/seed-1/report.json' is not in stub.parts/"),
        ("step-0/seed-0/run.log", "part 'step-0/seed-0/run.log' matches none of step 0's parts patterns"),
    ):
        (folder / parts.PARTS_FILE).write_text(json.dumps([good, {**good, "part": bad}]))
        with pytest.raises(UserError, match=f"^stub.parts/parts.json: {message}"):
            parts.restore_parts(exp, results)
        assert not (tmp_path / "out").exists()
    (folder / parts.PARTS_FILE).write_text(json.dumps([good]))
    assert parts.restore_parts(exp, results) == ["step-0/seed-0/report.json"]
    assert (tmp_path / "out" / "seed-0" / "report.json").read_text() == "{}"


def test_a_stored_part_names_no_path_of_the_machine_it_was_made_on(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COMPRESSOR_CACHE", str(tmp_path / "cache"))
    text = json.dumps({"base_finetune": {"cached": str(tmp_path / "cache" / "finetuned" / "abc")},
                       "model_dir": str(ROOT / "runs" / "x" / "model")})  # fmt: skip
    assert json.loads(parts.without_machine_paths(text)) == {
        "base_finetune": {"cached": "$COMPRESSOR_CACHE/finetuned/abc"},
        "model_dir": "./runs/x/model",
    }


def test_the_page_says_where_an_unfinished_experiments_stored_parts_ran() -> None:
    exp = next(iter(EXPERIMENTS.values()))
    record = {"part": "step-0/seed-0/report.json", "commit": "abc1234", "cpu": "CPU X", "int8_features": "AVX2",
              "date": "2026-12-02 03:20", "else_running": "nothing"}  # fmt: skip
    stored = [record, {**record, "part": "step-0/seed-0/recipe.resolved.yaml"}]  # one repeat: one clause
    assert ("Not finished; parts stored for a later session: seed-0 at abc1234 on CPU X (AVX2), 2026-12-02 03:20, "
            "else running: nothing.") in page.block(exp, None, stored)  # fmt: skip
    assert "Not measured yet." in page.block(exp, None)


def test_every_step_runs_with_the_declared_environment_and_says_so(tmp_path) -> None:
    """`env` reaches each step's process (the math-library caps of an AVX2 figure) and is printed before the
    command, so the page and the provenance show how the figure was made."""
    (tmp_path / "env.py").write_text(
        "import os, pathlib, sys\nout = pathlib.Path(sys.argv[1]); out.mkdir()\n"
        "(out / 'report.json').write_text(os.environ['ONEDNN_MAX_CPU_ISA'] + '|' + os.environ['STUB_NOTE'])\n"
    )
    step = {"command": f"python {tmp_path / 'env.py'} {{output}}", "output": str(tmp_path / "out")}
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2", "STUB_NOTE": "a b"}
    declared = {"figure": "f", "goal": "g", "reader": "run", "env": env, "steps": [step]}
    (tmp_path / "decl").mkdir()
    (tmp_path / "decl" / "capped.yaml").write_text(json.dumps(declared))
    exp = suite.experiment("capped", tmp_path / "decl")
    runner.run_steps(exp, force=False, log=lambda _: None)
    assert (tmp_path / "out" / "report.json").read_text() == "AVX2|a b"
    assert exp.shown() == [f"ONEDNN_MAX_CPU_ISA=AVX2 STUB_NOTE='a b' python {tmp_path / 'env.py'} {tmp_path / 'out'}"]
    assert shlex.split(exp.shown()[0])[:2] == ["ONEDNN_MAX_CPU_ISA=AVX2", "STUB_NOTE=a b"]


def test_compressor_steps_run_this_interpreter_and_force_only_when_asked() -> None:
    run = ["compressor", "run", "recipes/minilm_rt_50pct.yaml", "--output-dir", "x"]
    assert runner.argv(run, force=False) == [sys.executable, "-m", "compressor", *run[1:]]
    assert runner.argv(run, force=True)[-1] == "--force"
    assert runner.argv(["compressor", "pick", "x"], force=True) == [sys.executable, "-m", "compressor", "pick", "x"]
    assert runner.argv(["python", "benchmarks/peers.py"], force=True) == [sys.executable, "benchmarks/peers.py"]


def test_cache_state_reads_the_directory(tmp_path) -> None:
    assert runner.cache_state(tmp_path / "absent") == "empty"
    (tmp_path / "c").mkdir()
    assert runner.cache_state(tmp_path / "c") == "empty"
    (tmp_path / "c" / "finetuned").mkdir()
    assert runner.cache_state(tmp_path / "c") == "warm"


def test_a_result_off_the_schema_is_one_line_naming_the_field(tmp_path) -> None:
    good = json.loads((suite.RESULTS / "demo.json").read_text())
    bad = good | {"rows": [good["rows"][0] | {"unit": "furlongs"}]}
    (tmp_path / "demo.json").write_text(json.dumps(bad))
    with pytest.raises(UserError, match=r"^demo.json: rows.0.unit: "):
        read_result(tmp_path / "demo.json")


def test_the_seeds_reader_keeps_the_experiments_runtimes(tmp_path) -> None:
    """A family's seeds.json has a gap for every frontier point; the figure keeps those on its runtimes."""
    names = {"pytorch-original": "pytorch", "3x/pytorch": "pytorch", "3x/onnx-int8": "onnx-int8",
             "3x/layer-drop": "pytorch"}  # fmt: skip
    reports = _repeats(names, (0, 1, 2), 100)
    (tmp_path / "seeds.json").write_text(json.dumps(summarize_seeds(reports, resamples=100)))
    exp = EXPERIMENTS["minilm_family_seeds"]
    rows = {r.label: r for r in suite.READERS["seeds"](exp, tmp_path, **exp.reader_args)}
    row, baseline = rows["3x/pytorch minus pytorch-original"], rows["3x/layer-drop minus pytorch-original"]
    assert len(rows) == 2 and row.seeds == [0, 1, 2] and row.n == 100
    assert row.goal == ">= -0.5 points" and row.low <= row.value <= row.high
    assert (baseline.goal, baseline.met) == (None, None), "the 3x goal is the member's, not its baseline's"


def test_the_seeds_reader_gives_each_repeats_wall_time_and_its_steps_landings(tmp_path) -> None:
    """With `max_seconds_per_seed` and `landings`: a wall row per repeat against the bound, and a row per timed step
    with its measured speed-up over the table's prediction (untimed steps left out)."""
    reports = _repeats({"pytorch-original": "pytorch", "3x/pytorch": "pytorch"}, (0, 1), 100)
    (tmp_path / "seeds.json").write_text(json.dumps(summarize_seeds(reports, resamples=100)))
    steps = [{"step": 1, "goal": 2.0, "hidden_size": 704, "predicted_speedup": 2.0, "measured_speedup": 2.2},
             {"step": 2, "goal": 3.0, "members": [3.0], "predicted_speedup": 3.0, "measured_speedup": 2.7},
             {"step": 3, "goal": 4.0}]  # fmt: skip
    for seed, seconds in ((0, 4000.0), (1, 6000.0)):
        report = {"seconds": seconds, "timings": {"pruning steps": 100.0, "bench": 50.0}, "steps": steps}
        (tmp_path / f"seed-{seed}").mkdir()
        (tmp_path / f"seed-{seed}" / "report.json").write_text(json.dumps(report))
    exp = EXPERIMENTS["mpnet_width_seeds"]
    assert exp.reader_args["landings"] is True and exp.reader_args["max_seconds_per_seed"] == 5400
    rows = {r.label: r for r in suite.READERS["seeds"](exp, tmp_path, max_seconds_per_seed=5000, landings=True)}
    assert (rows["seed 0: run, wall"].met, rows["seed 1: run, wall"].met) == (True, False)
    assert rows["seed 1: run, wall"].goal == "<= 5000 s" and "pruning steps" in rows["seed 1: run, wall"].detail
    first, second = rows["seed 0 step 1, width 704: measured / predicted speed-up"], rows[
        "seed 1 step 2: measured / predicted speed-up"]  # fmt: skip
    assert (first.value, second.value, second.unit) == (1.1, 0.9, "x") and "member [3.0]" in second.detail
    assert not any("step 3" in label for label in rows)


def _row(name: str, role: str, runtime: str, speedup: float, accuracy: float, val: float, **extra) -> dict:
    """A frontier row as the bench writes it (original accuracy 0.80 on both splits)."""
    return {"name": name, "model": name.split("/")[0], "role": role, "runtime": runtime, "rejected": False,
            "path": None if runtime == "pytorch" and role == "original" else name, "speedup": speedup,
            "speedup_by_batch": {"32": speedup}, "batch": 32, "accuracy": accuracy, "val_accuracy": val,
            "drop_points": 100 * (0.80 - accuracy), "val_drop_points": 100 * (0.80 - val), **extra}  # fmt: skip


def test_the_readers_read_what_the_product_writes(tmp_path) -> None:
    """`run`, `frontier` and `versus_reference` on a report whose recommendation and member-vs-reference sections
    the product's own functions made."""
    from compressor.bench.frontier import versus_references
    from compressor.report.recommendation import recommendation

    rows = [
        _row("pytorch-original", "original", "pytorch", 1.0, 0.80, 0.80),
        _row("pruned/pytorch", "member", "pytorch", 2.0, 0.79, 0.799),
        _row("pruned/onnx-int8", "member", "onnx-int8", 4.0, 0.75, 0.78),  # too far below on validation
        _row("reference/small/pytorch", "reference", "pytorch", 1.8, 0.77, 0.77),
    ]
    pairs = [{"candidate": "pruned/pytorch", "versus": "reference/small/pytorch", "mcnemar": {"p_value": 0.2}}]
    report = {"original": {"test": {"n": 1276}}, "frontier": rows, "bench": {"max_drop": 0.01},
              "seconds": 500.0,
              "timings": {"original: export": 20.0, "bench": 50.0, "pruning steps": 200.0}}  # fmt: skip
    report |= {"recommendation": recommendation(report), "versus_references": versus_references(rows, pairs)}
    (tmp_path / "report.json").write_text(json.dumps(report))
    demo = EXPERIMENTS["demo"]
    seconds, share, gap, speed = suite.READERS["run"](demo, tmp_path, **demo.reader_args)
    assert (seconds.value, seconds.met, share.value, share.met) == (500, True, 10.0, True)
    assert seconds.detail == "pruning steps 200 s, bench 50 s, original: export 20 s", "where the time went"
    assert share.detail == "bench 50 s; the original's export before it 20 s (4.0% of the run)", "shown, not counted"
    assert gap.label.startswith("recommended (pruned/pytorch)") and gap.value == -1.0 and gap.met is False
    assert (gap.n, speed.value, speed.unit) == (1276, 2.0, "x")
    mpnet = EXPERIMENTS["mpnet_family"]
    assert [r.label for r in suite.READERS["frontier"](mpnet, tmp_path)] == [r["name"] for r in rows]
    (versus,) = suite.READERS["versus_reference"](mpnet, tmp_path, reference="small", runtime="pytorch")
    assert (versus.value, versus.n) == (2.0, 1276) and "p 0.2, level" in versus.detail
    quantize = EXPERIMENTS["quantize_only"]  # int8 runtimes, and the PyTorch original the goal reads
    original, int8 = suite.READERS["frontier"](quantize, tmp_path, **quantize.reader_args)
    assert (original.label, original.met, int8.label, int8.met) == ("pytorch-original", None, "pruned/onnx-int8", False)
    assert int8.goal == "test within 1 points of the original" and int8.detail == "test 75.00"
    rescale = EXPERIMENTS["rescale"]
    assert suite.READERS["run"](rescale, tmp_path, **rescale.reader_args)[2].value == 25.0


def test_the_export_paths_reader_gives_medians_and_a_paired_ratio(tmp_path) -> None:
    """benchmarks/export_paths.py's output: per exporter the median seconds and peak memory over its runs, and the
    ratio of torch.export's seconds to TorchScript's paired by repeat (not a ratio of the medians)."""

    def entry(asked, repeat, seconds, peak):
        return {"asked": asked, "exporter": asked, "repeat": repeat, "seconds": seconds, "peak_mb": peak,
                "attention_fusion": "full"}  # fmt: skip

    runs = [entry("torch.export", 0, 30.0, 900.0), entry("torchscript", 0, 10.0, 600.0),
            entry("torch.export", 1, 60.0, 950.0), entry("torchscript", 1, 40.0, 650.0),
            entry("torch.export", 2, 40.0, 1000.0), entry("torchscript", 2, 10.0, 700.0)]  # fmt: skip
    (tmp_path / "export_paths.json").write_text(json.dumps({"runs": runs}))
    rows = suite.READERS["export_paths"](EXPERIMENTS["export_paths"], tmp_path)
    values = {r.label: (r.value, r.unit, r.n) for r in rows}
    assert values["torch.export: export, wall"] == (40.0, "s", 3)
    assert values["torchscript: export, peak memory"] == (650.0, "MB", 3)
    assert values["torch.export / TorchScript, export seconds"] == (3.0, "x", 3)  # ratios 3, 1.5, 4: median 3


def test_the_bench_pair_reader_gives_the_paired_speedup_with_its_interval(tmp_path) -> None:
    """`compressor bench --reference R --candidate C`'s report: the candidate's headline speed-up over the reference
    with a 95% interval from its per-round ratios; level (met null) while the interval straddles the goal, met
    once all of it clears it."""

    def report(per_round):
        summary = {"headline_seq_len": 64, "headline_batch": 32, "headline_speedup": float(np.median(per_round))}
        speedups = {"candidate": {"64": {"32": {"per_round": per_round}}}}
        return {"reference": "reference", "summary": {"reference": {}, "candidate": summary}, "speedups": speedups}

    exp = EXPERIMENTS["exporters_int8"]
    (tmp_path / "report.json").write_text(json.dumps(report([0.9, 1.1, 1.0, 1.05, 0.95])))
    (row,) = suite.READERS["bench_pair"](exp, tmp_path, **exp.reader_args)
    assert row.value == 1.0 and row.low < 1.0 < row.high and row.met is None and row.n == 5 and row.unit == "x"
    (tmp_path / "report.json").write_text(json.dumps(report([1.2, 1.21, 1.19, 1.2, 1.22])))
    (row,) = suite.READERS["bench_pair"](exp, tmp_path, **exp.reader_args)
    assert row.met is True and 1.18 < row.low < 1.2 < row.high < 1.23


def test_the_reference_speed_step_pairs_the_bench_rows_and_its_reader_judges_each_runtime(tmp_path) -> None:
    """The bench's reference speed-up over the original on a runtime is the ratio of the two rows' speed-ups (both
    over the PyTorch original); the reader divides the configs' timing by it, within 10% or not."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from reference_speed import bench_ratio

    rows = [{"model": "original", "role": "original", "runtime": "onnx-int8", "speedup": 3.0},
            {"model": "minilm-l6", "role": "reference", "runtime": "onnx-int8", "speedup": 15.0},
            {"model": "6x", "role": "member", "runtime": "onnx-int8", "speedup": 18.0}]  # fmt: skip
    assert bench_ratio(rows, "minilm-l6", "onnx-int8") == 5.0 and bench_ratio(rows, "minilm-l6", "pytorch") is None
    data = {"reference": "builtin:minilm-l6", "runtimes": {"onnx-int8": {"from_configs": 5.2, "bench": 5.0},
                                                           "pytorch": {"from_configs": 4.0, "bench": 5.0}}}  # fmt: skip
    (tmp_path / "reference_speed.json").write_text(json.dumps(data))
    exp = EXPERIMENTS["reference_speed"]
    rows = {r.label.split(", ")[1]: r for r in suite.READERS["reference_speed"](exp, tmp_path, **exp.reader_args)}
    assert (
        rows["onnx-int8: from configs / in the bench"].value,
        rows["onnx-int8: from configs / in the bench"].met,
    ) == (1.04, True)
    assert (rows["pytorch: from configs / in the bench"].value, rows["pytorch: from configs / in the bench"].met) == (
        0.8,
        False,
    )
    data["runtimes"]["pytorch"]["bench"] = None
    (tmp_path / "reference_speed.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="has no builtin:minilm-l6 and original on pytorch"):
        suite.READERS["reference_speed"](exp, tmp_path)


def test_the_reference_speed_step_refuses_a_bench_headline_at_another_shape_than_the_budget(tmp_path, capsys) -> None:
    """The bench's frontier speed-ups are at its headline batch and length: against a budget timed at another shape
    the step says so in one line and writes nothing, instead of comparing two shapes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import yaml
    from reference_speed import main as reference_speed

    recipe = yaml.safe_load((ROOT / "recipes" / "mpnet_rt_family_width.yaml").read_text())
    recipe["bench"]["batch_sizes"] = [8]  # the budget times batch 32
    (tmp_path / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe))
    (tmp_path / "report.json").write_text(json.dumps({"frontier": [], "labels": ["rotten", "fresh"]}))
    args = ["--report", str(tmp_path / "report.json"), "--reference", "builtin:minilm-l6", "--runtimes", "pytorch"]
    assert reference_speed([*args, "--out", str(tmp_path / "out")]) == 2
    assert "at batch 8, 64 tokens; expected the same shape" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
