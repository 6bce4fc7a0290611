"""Issue 38 point 3: TextPruner 1.1 and Torch-Pruning 1.6.1 against our family members, same model, data and recovery.

For each model (the task-tuned MiniLM-L6 and MPNet-base: the base fine-tune compressor caches for
recipes/minilm_rt_family.yaml and recipes/mpnet_rt_family.yaml, loaded through compressor's own `base_model`), each
peer prunes the same base with the same number of scoring examples (`prune.score_examples`, drawn as our loop draws
them), in a pinned virtual environment this script builds (`benchmarks/peers_worker.py` runs there):
- at each member's units: the member's number of attention heads and FFN neurons left (the peer chooses which);
- at each member's measured PyTorch speed-up: the peer's head and FFN counts scaled until its model, timed against
  the original, is within `--speed-tolerance` of the member's speed-up (a few peer runs; each is cached).
Every point is measured without recovery and after OUR recovery fine-tune (`compressor.recovery.train.train`, the
recipe's `prune.finetune` once per step the member took, then the member's final fine-tune when the recipe has
`prune.member_finetune`, same seeds and distillation targets), so the comparison
isolates the choice of units from the recovery. The peer's kept units come back as masks and are replayed with
compressor's own slicing on the same base (logits checked against the peer's own pruned model); test accuracy comes
from our evaluator (each recovered point against its member by exact McNemar on the same examples), speed-ups
from one interleaved bench per model (`compressor.bench.timing`: the original, our members and every distinct peer
model, paired with the same original in one process). Prune wall time of every point.

Each point is cached under the work directory (default `$COMPRESSOR_CACHE/peers/work/<recipe name>`) with the
settings it was made with: a rerun skips finished points and redoes those whose settings changed. A peer that fails
(or whose masks do not reproduce its own model) is reported as a failed point; the others go on. The peers' pinned
environments are built once under `--venv-dir` (default `$COMPRESSOR_CACHE/peers/venvs`). Results: a printed table,
OUT_DIR/peers.json (peers_quick.json with --quick; `--name` another stem) and peers.png, OUT_DIR `--out-dir` (default
runs/peers). The figure on docs/results.md is the suite's experiment: `python -m benchmarks run peers_mpnet`.

Usage (the lead's machine, machine to itself, after the family runs; one model at a time is fine, points are kept):
    .venv/bin/python benchmarks/peers.py --models minilm --ours minilm=runs/minilm_rt_family --else-running "nothing"
    .venv/bin/python benchmarks/peers.py --ours minilm=runs/minilm_rt_family mpnet=runs/mpnet_rt_family \
        --else-running "nothing"                                        # both models in one JSON (MiniLM cached)
    .venv/bin/python benchmarks/peers.py --models minilm --quick --ours minilm=runs/minilm_rt_family
        # a check of the whole pipeline: first member only, one peer iteration, no speed matching, a short recovery
`--members 1.5x 2x` keeps only those members of the `--ours` runs (the settings in the JSON say which).
Without `--ours`, targets come from `--target MODEL:LABEL:SPEEDUP:HEADS:FFN:STEPS` (repeatable; no member is timed);
`--recipe MODEL=PATH` swaps a model's recipe (its base fine-tune, data, scoring and recovery settings).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from compressor.bench.candidates import as_sdpa, pytorch_candidate  # noqa: E402
from compressor.bench.quality import mcnemar_exact  # noqa: E402
from compressor.bench.timing import measure_throughput, paired_speedups  # noqa: E402
from compressor.core.machine import cache_root, cpu_summary, machine_info  # noqa: E402
from compressor.pipeline.runner import base_model  # noqa: E402
from compressor.pipeline.stages import RunState  # noqa: E402
from compressor.pruning.latency.check import measured_speedup  # noqa: E402
from compressor.pruning.units import masks_to_plan, pruned_units_copy  # noqa: E402
from compressor.recipe import load_recipe  # noqa: E402
from compressor.recovery.distill import load_or_compute, step_examples  # noqa: E402
from compressor.recovery.draws import member_examples, member_seed  # noqa: E402
from compressor.recovery.evaluate import evaluate, predict  # noqa: E402
from compressor.recovery.train import train  # noqa: E402
from compressor.report.schema import MemberSection, RunReport  # noqa: E402
from compressor.sources import load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import model_inputs, sample_batches, tokenize  # noqa: E402
from compressor.surgery.arch import num_layers, original_ffn_size, original_num_heads  # noqa: E402
from compressor.surgery.checkpoint import load_pruned, save_pruned  # noqa: E402
from compressor.surgery.cost import encoder_flops  # noqa: E402

log = logging.getLogger("peers")
RECIPES = {"minilm": "recipes/minilm_rt_family.yaml", "mpnet": "recipes/mpnet_rt_family.yaml"}
PEERS = ("textpruner", "torch-pruning")
TORCH = "torch==2.13.0"  # never unpinned: an unpinned torch is a multi-GB CUDA build
VENVS = {  # each peer's pinned stack; TextPruner's declared numpy pin fails to build, so it goes in without deps
    "textpruner": ([TORCH, "transformers==4.57.*"], ["textpruner==1.1"]),
    "torch-pruning": ([TORCH, "transformers==5.24.0", "torch-pruning==1.6.1"], []),
}
PARITY_ATOL = 1e-4  # max |Δlogit| between the peer's own pruned model and our replay of its masks
OUT_DIR = ROOT / "runs" / "peers"  # the suite's experiment `peers_mpnet` passes its own --out-dir


class PeerError(RuntimeError):
    """A peer's run failed, or its masks do not reproduce its own model: the point is reported as failed."""


@dataclass
class Target:
    """One of our members: what the peers are matched to."""

    label: str
    speedup: float  # our member's measured PyTorch speed-up (its run's bench)
    heads: int
    ffn: int
    steps: int  # pruning steps the member took: our recovery gives a peer point as many fine-tunes
    model_dir: str | None = None
    prune_seconds: float | None = None  # our steps' scoring + selection time
    recovery_seconds: float | None = None
    aim: float | None = None  # the speed-up the peer's speed-matched point aims at (the member's, timed here)
    index: int = 0  # the member's place in its family: the seed of its final fine-tune (`prune.member_finetune`)


@dataclass
class Setup:
    """One model's shared inputs: recipe, data, base model, scoring batches, teacher targets, work directory."""

    name: str
    recipe: object
    run: RunState
    base: torch.nn.Module
    base_dir: Path
    work: Path
    finetune: object  # the recovery fine-tune of one step (the recipe's `prune.finetune`; shorter with --quick)
    member_finetune: object = None  # the recipe's `prune.member_finetune` (None with --quick)
    teacher: object = None
    timings: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- environments
def venv_python(venv_dir: Path, peer: str) -> Path:
    """The peer's pinned environment (built once, marked complete by a stamp file); returns its python."""
    venv = venv_dir / peer
    python, stamp = venv / "bin" / "python", venv / ".complete"
    first, no_deps = VENVS[peer]
    wanted = json.dumps([first, no_deps])
    if stamp.exists() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    log.info("building the %s environment in %s (pip, a few minutes)", peer, venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *first], check=True)
    if no_deps:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *no_deps], check=True)
    stamp.write_text(wanted)
    return python


# ------------------------------------------------------------------------------------------------------------ setup
def prepare(name: str, recipe_path: Path, work_root: Path, quick: bool) -> Setup:
    """The recipe's data and the cached task-tuned base (compressor's own `base_model`: loaded, or fine-tuned and
    cached as a `compressor run` of the recipe would) and its scoring batches; the work directory is the recipe's
    name under `work_root`."""
    recipe = load_recipe(recipe_path)
    if recipe.prune.finetune is None:
        raise SystemExit(f"peers: {recipe_path} has no prune.finetune; the comparison needs our recovery")
    finetune = recipe.prune.finetune
    if quick:
        finetune = finetune.model_copy(update={"max_examples": min(256, finetune.max_examples or 256)})
    work = work_root / recipe.name
    work.mkdir(parents=True, exist_ok=True)
    data, tokenizer = load_task_data(recipe.data), load_tokenizer(recipe.model)
    run = RunState(recipe, work, Accelerator(), data, tokenizer)
    for split in ("train", "validation", "test"):
        run.splits[split] = tokenize(getattr(data, split), tokenizer, data.text_fields, recipe.data.max_length)
    started = time.perf_counter()
    base, info = base_model(run)
    base_dir = Path(info["cached"]) if info.get("cached") else Path(recipe.model.source)
    final = None if quick else recipe.prune.member_finetune
    setup = Setup(name, recipe, run, base.cpu().eval(), base_dir, work, finetune, final)
    setup.timings["base model"] = round(time.perf_counter() - started, 1)
    _write_batches(setup)
    return setup


def _write_batches(setup: Setup) -> None:
    """The scoring batches our loop draws (same seed, count, batch size, length order) and a probe batch (the
    surgery check's), saved for the workers."""
    p, run = setup.recipe.prune, setup.run
    batches = sample_batches(
        run.splits["train"], run.tokenizer, p.score_examples, p.score_batch_size, setup.recipe.seed, by_length=True
    )
    keep = [{**model_inputs(b), "labels": b["labels"]} for b in batches]
    probe = model_inputs(next(iter(sample_batches(run.splits["validation"], run.tokenizer, 64, 64, seed=0))))
    torch.save(keep, setup.work / "score_batches.pt")
    torch.save(probe, setup.work / "probe.pt")


def teacher_targets(setup: Setup, steps: int, members: int):
    """Distillation targets of the base for every example `steps` recovery fine-tunes and the final fine-tunes of
    `members` members draw (as our run's)."""
    finetune, final = setup.finetune, setup.member_finetune
    if finetune.distill is None:
        return None
    run, n, seed = setup.run, len(setup.run.splits["train"]), setup.recipe.seed
    draws = [step_examples(n, finetune, seed, steps)]
    if final is not None:
        draws.append(member_examples(n, final.max_examples, seed, members))
    examples = None if None in draws else sorted(set().union(*draws))
    cache = setup.work / (f"teacher-{finetune.max_examples}x{steps}" + (f"-final{members}" if final else ""))
    train_ds, accelerator = run.splits["train"], run.accelerator
    return load_or_compute(cache, setup.base, train_ds, run.tokenizer, accelerator, finetune.distill, examples)


# ---------------------------------------------------------------------------------------------------------- targets
def targets_from_run(run_dir: Path) -> list[Target]:
    """Our members from a finished run's report (a family's, or a one-target run's model): label, measured
    speed-up, units left, steps, prune and recovery seconds (from the step log)."""
    if not (run_dir / "report.json").exists():
        raise SystemExit(f"peers: {run_dir / 'report.json'} not found; run the family recipe first or give --target")
    report = RunReport.read(run_dir / "report.json")
    out = []
    for index, (m, model_dir) in enumerate(report.member_models(run_dir)):
        if m.pruned.ffn_neurons is None:
            raise SystemExit(f"peers: member {m.label} has no FFN neuron count; the peers prune heads and FFN neurons")
        done = report.steps[: m.step]
        recovery = sum((s.get("finetune") or {}).get("seconds", 0.0) for s in done)
        out.append(
            Target(
                label=m.label, speedup=_member_speedup(report, m), heads=m.pruned.heads_left,
                ffn=m.pruned.ffn_neurons, steps=m.step, model_dir=str(model_dir),
                prune_seconds=round(sum(s["seconds"] for s in done) - recovery, 1), recovery_seconds=round(recovery, 1),
                index=index,
            )
        )  # fmt: skip
    return out


def _member_speedup(report: RunReport, member: MemberSection) -> float:
    """The member's measured PyTorch speed-up: its speed-up budget's check, else its frontier row (FLOP and head
    budgets have no check)."""
    rows = {r.name: r for r in report.frontier_rows()}
    row = rows.get(f"{member.label}/pytorch")
    measured = (member.budget and member.budget.measured_speedup) or (row and row.speedup)
    if measured is None:
        raise SystemExit(f"peers: member {member.label} has no measured PyTorch speed-up in its report")
    return float(measured)


def parse_target(text: str) -> tuple[str, Target]:
    """`MODEL:LABEL:SPEEDUP:HEADS:FFN:STEPS` (e.g. `minilm:2x:2.01:40:4700:4`)."""
    parts = text.split(":")
    if len(parts) != 6:
        raise SystemExit(f"--target: '{text}' is not MODEL:LABEL:SPEEDUP:HEADS:FFN:STEPS")
    model, label, speedup, heads, ffn, steps = parts
    return model, Target(label, float(speedup), int(heads), int(ffn), int(steps))


# ------------------------------------------------------------------------------------------------------ peer points
def run_peer(setup: Setup, python: Path, peer: str, heads: int, ffn: int, iters: int, point: Path) -> dict:
    """The peer's pruning to `heads` heads and `ffn` FFN neurons (cached in `point`), replayed on our base with
    compressor's slicing and checked against the peer's own logits; saved with `save_pruned` as `point/model`."""
    files = {"batches": str(setup.work / "score_batches.pt"), "probe": str(setup.work / "probe.pt")}
    job = {"peer": peer, "model_dir": str(setup.base_dir), **files, "heads": heads, "ffn": ffn, "iters": iters,
           "out": str(point)}  # fmt: skip
    done = point / "point.json"
    if done.exists() and _same_json(point / "job.json", job):
        return json.loads(done.read_text())
    shutil.rmtree(point, ignore_errors=True)  # unfinished, or made for other settings: redone whole
    point.mkdir(parents=True)
    (point / "job.json").write_text(json.dumps(job))
    log.info("%s: pruning to %d heads, %d FFN neurons (%d iterations)", peer, heads, ffn, iters)
    worker = ROOT / "benchmarks" / "peers_worker.py"
    with open(point / "worker.log", "w") as out:
        code = subprocess.run([str(python), str(worker), str(point / "job.json")], stdout=out, stderr=subprocess.STDOUT)
    if code.returncode != 0:
        lines = (point / "worker.log").read_text().strip().splitlines() or ["no output"]
        raise PeerError(f"{peer} failed (exit {code.returncode}): {lines[-1][:300]} (log: {point / 'worker.log'})")
    result = json.loads((point / "result.json").read_text())
    alive = {"heads": torch.tensor(result["heads_mask"]).bool(), "neurons": torch.tensor(result["ffn_mask"]).bool()}
    model = pruned_units_copy(setup.base, masks_to_plan(alive)).eval()
    probe = torch.load(setup.work / "probe.pt")
    with torch.inference_mode():
        diff = float((model(**probe).logits - torch.load(point / "probe_logits.pt")).abs().max())
    if diff > PARITY_ATOL:
        raise PeerError(f"{peer}: our replay of its masks differs from its own model by {diff:.2e} (> {PARITY_ATOL})")
    save_pruned(model, point / "model", setup.run.tokenizer, metadata={"peer": peer})
    summary = {k: result[k] for k in ("heads_left", "ffn_left", "prune_seconds", "versions")}
    summary |= {"replay_max_abs_diff": diff, "heads_per_layer": [int(x) for x in alive["heads"].sum(1)],
                "ffn_per_layer": [int(x) for x in alive["neurons"].sum(1)]}  # fmt: skip
    done.write_text(json.dumps(summary, indent=2))
    return summary


def _same_json(path: Path, value: dict) -> bool:
    """Whether `path` holds `value` as JSON (a cached point made with the same settings)."""
    return path.exists() and json.loads(path.read_text()) == value


def quick_speedup(setup: Setup, model_dir: Path) -> dict:
    """A point's PyTorch speed-up over the original at the budget's batch and length (compressor's calibration
    check) and its encoder FLOPs share: only to steer the speed-matched search; the reported figures come from the
    one bench at the end."""
    budget = setup.recipe.prune.resolved_budget
    pruned = load_pruned(model_dir, attn_implementation="eager")
    share = encoder_flops(pruned, budget.seq_len) / encoder_flops(setup.base, budget.seq_len)
    speedup = measured_speedup(setup.base, pruned, "pytorch", budget.batch_size, budget.seq_len)
    return {"quick_speedup": speedup, "flop_share": share}


def next_share(points: list[tuple[float, float]], speedup: float) -> float:
    """The encoder FLOPs share at which 1 / speed-up reaches 1 / `speedup` on the line through the last two
    measured `(share, 1 / speed-up)` points (the original is `(1, 1)`); time is close to linear in FLOPs over a
    small step, so this secant converges in a try or two."""
    (x0, y0), (x1, y1) = points[-2], points[-1]
    if y1 == y0:
        return x1
    return max(0.01, min(1.0, x1 + (1 / speedup - y1) * (x1 - x0) / (y1 - y0)))


def _off(point: dict, target: Target) -> float:
    return abs(point["quick_speedup"] / target.aim - 1)


def speed_point(setup: Setup, python: Path, peer: str, target: Target, units: dict, args) -> dict:
    """The peer's point at `target.aim`: the member's head and FFN counts scaled by one factor (FLOPs are
    linear in both) to the share `next_share` predicts, a new peer run per try (`speed_tries` at most), until
    within `speed_tolerance`; the closest point is kept (the units point itself when it is already close)."""
    base = setup.work / peer / target.label
    cached = base / "speed.json"
    search = {"aim": target.aim, "tolerance": args.speed_tolerance, "tries": args.speed_tries,
              "units": [units["heads_left"], units["ffn_left"], units["prune_seconds"]]}  # fmt: skip
    if cached.exists() and json.loads(cached.read_text()).get("search") == search:
        return json.loads(cached.read_text())
    heads_total, ffn_total = _totals(setup.base)
    history = [(1.0, 1.0), (units["flop_share"], 1 / units["quick_speedup"])]
    best = units
    for attempt in range(args.speed_tries):
        if _off(best, target) <= args.speed_tolerance:
            break
        scale = next_share(history, target.aim) / units["flop_share"]
        heads = min(heads_total, max(1, round(target.heads * scale)))
        ffn = min(ffn_total, max(1, round(target.ffn * scale)))
        point = base / f"speed-{attempt + 1}"
        result = run_peer(setup, python, peer, heads, ffn, _iters(target, args), point)
        result |= {"dir": str(point), **quick_speedup(setup, point / "model")}
        history.append((result["flop_share"], 1 / result["quick_speedup"]))
        if _off(result, target) < _off(best, target):
            best = result
    cached.write_text(json.dumps(best | {"search": search}, indent=2))
    return best


def _totals(model: torch.nn.Module) -> tuple[int, int]:
    """Heads and FFN neurons of the unpruned model."""
    return num_layers(model) * original_num_heads(model), num_layers(model) * original_ffn_size(model)


def _iters(target: Target, args) -> int:
    """Peer iterations: as many as our member's pruning steps (1 with --quick)."""
    return 1 if args.quick else max(1, target.steps)


def _recovery_steps(target: Target, args) -> int:
    """Our recovery fine-tunes per peer point: one per step the member took (1 with --quick)."""
    return 1 if args.quick else target.steps


def units_point(setup: Setup, python: Path, peer: str, target: Target, args) -> dict:
    """The peer at the member's head and FFN counts, with a quick speed-up to steer the speed-matched search."""
    point = setup.work / peer / target.label / "units"
    result = run_peer(setup, python, peer, target.heads, target.ffn, _iters(target, args), point)
    if "quick_speedup" not in result and not args.quick:
        result |= quick_speedup(setup, point / "model")
        (point / "point.json").write_text(json.dumps(result, indent=2))
    return result | {"dir": str(point)}


def recovered(setup: Setup, point_dir: Path, steps: int, index: int = 0) -> dict:
    """Our recovery on a point's model: the recipe's `prune.finetune` once per step the member took (seed
    `seed + step`, the same distillation targets), then the member's final fine-tune when the recipe has one
    (`prune.member_finetune`, the member's seed), saved as `point_dir/recovered`; its test accuracy."""
    out = point_dir / "recovered.json"
    recipe, run, finetune, final = setup.recipe, setup.run, setup.finetune, setup.member_finetune
    settings = {"steps": steps, "finetune": finetune.model_dump(mode="json"), "seed": recipe.seed}
    if final is not None:
        settings |= {"member_finetune": final.model_dump(mode="json"), "member_index": index}
    if out.exists() and json.loads(out.read_text()).get("settings") == settings:
        return json.loads(out.read_text())
    model = load_pruned(point_dir / "model", attn_implementation="eager")
    started = time.perf_counter()
    for step in range(steps):
        train(model, run.splits["train"], run.tokenizer, finetune, run.accelerator, seed=recipe.seed + step,
              desc=f"recovery {step + 1}/{steps}", teacher=setup.teacher)  # fmt: skip
    if final is not None:
        train(model, run.splits["train"], run.tokenizer, final, run.accelerator, seed=member_seed(recipe.seed, index),
              desc="final fine-tune", teacher=setup.teacher)  # fmt: skip
    seconds = time.perf_counter() - started
    model = run.accelerator.unwrap_model(model).cpu().eval()
    save_pruned(model, point_dir / "recovered", run.tokenizer, metadata={"recovery_steps": steps})
    correct = _correct(setup, model, point_dir / "recovered.test.json")  # `versus_member` reads it back
    result = {"test": accuracy(correct), "seconds": round(seconds, 1), "settings": settings}
    out.write_text(json.dumps(result))
    return result


def test_correct(setup: Setup, model_dir: Path, cache: Path) -> list[bool]:
    """Whether a saved model is right on each test example, with our evaluator's predictions (cached in `cache`):
    its accuracy, and the pairs McNemar's test compares."""
    if cache.exists() and "correct" in (saved := json.loads(cache.read_text())):
        return saved["correct"]
    return _correct(setup, load_pruned(model_dir, attn_implementation="eager"), cache)


def _correct(setup: Setup, model: torch.nn.Module, cache: Path) -> list[bool]:
    """`model`'s per-example correctness on the test split, written to `cache`."""
    logits, labels = predict(model, setup.run.splits["test"], setup.run.tokenizer, desc="test")
    correct = (logits.argmax(-1) == labels).tolist()
    cache.write_text(json.dumps({"accuracy": accuracy(correct), "correct": correct}))
    return correct


def accuracy(correct: list[bool]) -> float:
    return sum(correct) / len(correct)


def versus_member(setup: Setup, rows: list[dict], ours: dict[str, list[bool]]) -> None:
    """Each recovered peer point against our member it is matched to, on the same test examples: exact McNemar
    (`vs_member`: the examples only the peer gets right, only ours gets right, and p)."""
    for row in (r for r in rows if "error" not in r and r["member"] in ours):
        point = Path(row["dir"])
        peer = test_correct(setup, point / "recovered", point / "recovered.test.json")
        row["recovered"]["vs_member"] = mcnemar_exact(np.array(peer), np.array(ours[row["member"]]))


# ------------------------------------------------------------------------------------------------------- one model
def model_points(setup: Setup, targets: list[Target], peers: list[str], args) -> list[dict]:
    """Every peer point of one model (units-matched and speed-matched, each without and with our recovery)."""
    members = max(t.index for t in targets) + 1
    setup.teacher = teacher_targets(setup, max(_recovery_steps(t, args) for t in targets), members)
    rows = []
    for peer in peers:
        python = venv_python(args.venv_dir, peer)
        for target in targets:
            points = _points(setup, python, peer, target, args, rows)
            for match, point in points:
                point_dir = Path(point["dir"])
                rows.append({
                    "model": setup.name, "peer": peer, "member": target.label, "match": match,
                    "dir": str(point_dir), "heads_left": point["heads_left"], "ffn_left": point["ffn_left"],
                    "heads_per_layer": point["heads_per_layer"], "ffn_per_layer": point["ffn_per_layer"],
                    "prune_seconds": round(point["prune_seconds"], 1), "versions": point["versions"],
                    "replay_max_abs_diff": point["replay_max_abs_diff"],
                    "accuracy": accuracy(test_correct(setup, point_dir / "model", point_dir / "model.test.json")),
                    "recovered": recovered(setup, point_dir, _recovery_steps(target, args), target.index),
                })  # fmt: skip
    return rows


def _points(setup: Setup, python: Path, peer: str, target: Target, args, failed: list[dict]) -> list[tuple]:
    """The peer's (match, point) pairs at `target`; a failed one is logged and added to `failed` as an error row."""
    points: list[tuple] = []
    for match in ("units",) if args.quick else ("units", "speed"):
        try:
            if match == "units":
                points.append((match, units_point(setup, python, peer, target, args)))
            else:
                points.append((match, speed_point(setup, python, peer, target, points[0][1], args)))
        except PeerError as err:
            log.error("%s at %s (%s): %s", peer, target.label, match, err)
            failed.append(
                {"model": setup.name, "peer": peer, "member": target.label, "match": match, "error": str(err)}
            )
            break
    return points


def bench(setup: Setup, targets: list[Target], rows: list[dict], args) -> dict:
    """One interleaved PyTorch bench of the original, our members and every distinct peer model (a point and its
    recovered model share one architecture, so the point is timed), at the budget's batch and length; speed-ups
    paired with the original round by round."""
    budget = setup.recipe.prune.resolved_budget
    seq, batch = budget.seq_len, budget.batch_size
    models = {"original": setup.base}
    models |= {f"ours/{t.label}": load_pruned(t.model_dir, attn_implementation="eager") for t in targets if t.model_dir}
    for row in (r for r in rows if "error" not in r):
        models.setdefault(_candidate_name(row), load_pruned(Path(row["dir"]) / "model", attn_implementation="eager"))
    candidates = [pytorch_candidate(name, as_sdpa(m), seq) for name, m in models.items()]
    log.info("bench: %d candidates, %d rounds, batch %d x %d tokens", len(candidates), args.rounds, batch, seq)
    throughput = measure_throughput(candidates, [batch], seq, rounds=args.rounds, min_time_s=args.min_time_s)
    speedups = paired_speedups(throughput, "original")
    return {name: speedups[name][str(seq)][str(batch)] for name in models} | {"_setup": throughput["setup"]}


def _candidate_name(row: dict) -> str:
    """A peer model's bench name: a speed-matched point that is its units point (already at the member's speed)
    is the same model, timed once."""
    return f"{row['peer']}/{row['member']}/{row['heads_left']}h{row['ffn_left']}f"


def run_model(name: str, targets: list[Target], peers: list[str], args) -> dict:
    """Everything for one model: setup, peer points, our members' test accuracy, the bench; the model's section."""
    started = time.perf_counter()
    setup = prepare(name, args.recipe.get(name, ROOT / RECIPES[name]), args.work_dir, args.quick)
    if args.quick:
        targets = targets[:1]
    for t in targets:  # the speed-matched points aim at the member's speed-up as this machine times it
        t.aim = quick_speedup(setup, Path(t.model_dir))["quick_speedup"] if t.model_dir else t.speedup
    original = evaluate(setup.base, setup.run.splits["test"], setup.run.tokenizer)["accuracy"]
    rows = model_points(setup, targets, peers, args)
    speed = bench(setup, targets, rows, args)
    for row in (r for r in rows if "error" not in r):
        row["speedup"] = speed[_candidate_name(row)]["median"]
        row["speedup_iqr"] = [speed[_candidate_name(row)]["q1"], speed[_candidate_name(row)]["q3"]]
    ours, correct = [], {}
    for t in targets:
        entry = {"model": name, "peer": "compressor", "member": t.label, "match": "member", "heads_left": t.heads,
                 "ffn_left": t.ffn, "steps": t.steps, "run_speedup": t.speedup, "prune_seconds": t.prune_seconds,
                 "recovery_seconds": t.recovery_seconds,
                 "quick_speedup_here": t.aim}  # fmt: skip
        if t.model_dir:
            cache = setup.work / f"ours-{t.label}.test.json"
            correct[t.label] = test_correct(setup, Path(t.model_dir), cache)
            entry["accuracy"] = accuracy(correct[t.label])
            entry["speedup"] = speed[f"ours/{t.label}"]["median"]
        ours.append(entry)
    versus_member(setup, rows, correct)
    return {
        "recipe": str(args.recipe.get(name, RECIPES[name])),
        "base_model_dir": "the recipe's cached base fine-tune ($COMPRESSOR_CACHE/finetuned/...)",
        "original_test_accuracy": original,
        "test_examples": len(setup.run.splits["test"]),
        "score_examples": setup.recipe.prune.score_examples,
        "bench_setup": speed["_setup"],
        "ours": ours,
        "peers": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------------------------------------------------- output
def table(section: dict) -> list[str]:
    """Markdown rows: ours and every peer point, accuracy (no recovery / our recovery), speed-up, prune time."""
    base = section["original_test_accuracy"]
    lines = [
        f"original test accuracy {100 * base:.2f} ({section['test_examples']} examples)",
        "| pruner | member | matched on | heads | FFN | speed-up | test acc (no recovery) | test acc (our recovery) "
        "| p vs ours | prune s | recovery s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in section["ours"]:
        acc = f"{100 * o['accuracy']:.2f}" if "accuracy" in o else "—"
        speed = f"{o['speedup']:.2f}×" if "speedup" in o else f"({o['run_speedup']:.2f}×)"
        lines.append(f"| compressor | {o['member']} | — | {o['heads_left']} | {o['ffn_left']} | {speed} | — | {acc} "
                     f"| — | {o['prune_seconds']} | {o['recovery_seconds']} |")  # fmt: skip
    for r in section["peers"]:
        if "error" in r:
            lines.append(f"| {r['peer']} | {r['member']} | {r['match']} | failed: {r['error'][:80]} |||||||")
            continue
        rec = r["recovered"]
        p = f"{rec['vs_member']['p_value']:.2g}" if "vs_member" in rec else "—"
        lines.append(
            f"| {r['peer']} | {r['member']} | {r['match']} | {r['heads_left']} | {r['ffn_left']} | {r['speedup']:.2f}× "
            f"| {100 * r['accuracy']:.2f} | {100 * rec['test']:.2f} | {p} | {r['prune_seconds']} | {rec['seconds']} |"
        )
    return lines


def plot(sections: dict, path: Path) -> None:
    """Test accuracy against measured speed-up per model: ours, each peer without and with our recovery."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sections), figsize=(6 * len(sections), 4.5), squeeze=False)
    styles = {"textpruner": ("tab:orange", "s"), "torch-pruning": ("tab:green", "^")}
    for ax, (name, section) in zip(axes[0], sections.items(), strict=True):
        ours = [o for o in section["ours"] if "speedup" in o]
        ax.plot([o["speedup"] for o in ours], [100 * o["accuracy"] for o in ours], "o-", color="tab:blue",
                label="compressor (members)")  # fmt: skip
        for peer, (color, marker) in styles.items():
            rows = sorted(
                (r for r in section["peers"] if r["peer"] == peer and "error" not in r), key=lambda r: r["speedup"]
            )
            if not rows:
                continue
            x = [r["speedup"] for r in rows]
            ax.plot(
                x, [100 * r["recovered"]["test"] for r in rows], marker, color=color, label=f"{peer} + our recovery"
            )
            ax.plot(x, [100 * r["accuracy"] for r in rows], marker, color=color, fillstyle="none",
                    label=f"{peer}, no recovery")  # fmt: skip
        ax.axhline(100 * section["original_test_accuracy"], color="grey", ls=":", label="original")
        ax.set(title=name, xlabel="measured PyTorch speed-up (batch 32 × 64 tokens)", ylabel="test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def portable(value, args):
    """`value` (JSON-like) with this machine's paths written as `<work-dir>/...`, `<venv-dir>/...`, repository-relative
    or a bare file name: a committed result names no local path."""
    if isinstance(value, dict):
        return {k: portable(v, args) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, args) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str):
        return value
    for prefix, name in ((args.work_dir, "<work-dir>"), (args.venv_dir, "<venv-dir>"), (ROOT, ".")):
        value = value.replace(str(Path(prefix).resolve()), name).replace(str(prefix), name)
    key, sep, rest = value.partition("=")  # MODEL=PATH options
    if sep and rest.startswith(("/", "~")):
        return f"{key}={Path(rest).name}"
    return Path(value).name if value.startswith(("/", "~")) else value


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(RECIPES), default=sorted(RECIPES))
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--ours", nargs="+", default=[], metavar="MODEL=RUN_DIR",
                        help="finished runs (a family, or one target)")  # fmt: skip
    parser.add_argument("--members", nargs="+", metavar="LABEL",
                        help="only these members of the --ours runs (e.g. 1.5x 2x); default: all")  # fmt: skip
    parser.add_argument("--target", action="append", default=[], metavar="MODEL:LABEL:SPEEDUP:HEADS:FFN:STEPS")
    parser.add_argument("--recipe", nargs="+", default=[], metavar="MODEL=RECIPE",
                        help="another recipe for a model (its base fine-tune, data and recovery settings)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="one member, one peer iteration, no speed matching, a short recovery: checks the "
                        "pipeline in minutes (writes peers_quick.json; not a figure)")  # fmt: skip
    parser.add_argument("--name", default="peers", help="the results' file stem (NAME.json, NAME.png)")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="where NAME.json and NAME.png go")
    parser.add_argument("--work-dir", type=Path, default=cache_root() / "peers" / "work")
    parser.add_argument("--venv-dir", type=Path, default=cache_root() / "peers" / "venvs")
    parser.add_argument("--speed-tolerance", type=float, default=0.05, help="relative, for the speed-matched points")
    parser.add_argument("--speed-tries", type=int, default=2, help="peer runs per speed-matched point at most")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time-s", type=float, default=0.3)
    parser.add_argument("--else-running", default="unknown", help="what else ran on the machine (recorded)")
    args = parser.parse_args(argv)
    args.recipe = dict(_pair(item, "--recipe") for item in args.recipe)
    return args


def _pair(item: str, option: str) -> tuple[str, Path]:
    """`MODEL=PATH` of `option`, MODEL one of ours."""
    name, _, path = item.partition("=")
    if name not in RECIPES or not path:
        raise SystemExit(f"{option}: '{item}' is not MODEL=PATH with MODEL in {sorted(RECIPES)}")
    return name, Path(path)


def targets_for(args) -> dict[str, list[Target]]:
    """Per model: the members of its `--ours` run, else its `--target`s."""
    out: dict[str, list[Target]] = {}
    for item in args.ours:
        name, run_dir = _pair(item, "--ours")
        out[name] = [t for t in targets_from_run(run_dir) if not args.members or t.label in args.members]
    for text in args.target:
        name, target = parse_target(text)
        out.setdefault(name, []).append(target)
    missing = [m for m in args.models if not out.get(m)]
    if missing:
        raise SystemExit(f"peers: no members for {missing}; give --ours MODEL=RUN_DIR or --target")
    return out


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("compressor").setLevel(logging.INFO)
    args = parse_args(argv)
    targets = targets_for(args)
    started = time.perf_counter()
    sections = {name: run_model(name, targets[name], args.peers, args) for name in args.models}
    for name, section in sections.items():
        print(f"\n## {name}\n" + "\n".join(table(section)))
    stem = "peers_quick" if args.quick else args.name
    args.out_dir.mkdir(parents=True, exist_ok=True)
    plot(sections, args.out_dir / f"{stem}.png")
    result = {
        "commit": commit(),
        "cpu": cpu_summary(),
        "machine": machine_info(),
        "else_running": args.else_running,
        "quick": args.quick,
        "settings": {k: v for k, v in vars(args).items() if k not in ("work_dir", "venv_dir")},
        "work_dir": "--work-dir (default $COMPRESSOR_CACHE/peers/work): every point's models, logs and caches",
        "peer_stacks": {peer: VENVS[peer][0] + VENVS[peer][1] for peer in args.peers},
        "models": sections,
        "seconds": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(portable(result, args), indent=2, default=str)
    (args.out_dir / f"{stem}.json").write_text(text + "\n")
    print(f"wrote {args.out_dir / stem}.json and {stem}.png")


if __name__ == "__main__":
    main()
