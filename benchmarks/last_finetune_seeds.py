"""Seeds and schedule on both sides of issue 37's gap, anywhere: the deepest member's last fine-tune and the
reference's, each over several seeds and epoch counts, from a portable payload, so the study can run where the
family's base model is not installed (a lent GPU, whose transfers are capped). It redraws only the last
fine-tunes (the member's and the reference's), not the pipeline: the pruning steps, their scoring batches and their
fine-tunes stay the packed run's; `compressor run RECIPE --seeds 0,1,2` redraws everything after the base fine-tune.

`--pack RUN --step N --payload DIR`: from a finished family run's checkpoint of the step that closes its last member
(`state/step_NNN`), write a payload: that member before its last fine-tune, physically pruned (`Masks.pruned_copy`,
`save_pruned`); a local copy of the reference's pretrained source (`bench.references[0]`); the run's teacher
targets (or, with `--teacher-model`, those of another task-tuned original); its resolved recipe; and the run's
own reference's per-example test hits. `--half` stores the weights in
fp16, as the fine-tunes' bf16 autocast rounds them further anyway, to fit a transfer limit.

`--payload DIR`: for each of `--epochs` and each seed offset in `--seeds`, the member's last fine-tune
(`prune.member_spec`, epochs replaced; the run's teacher targets) and the reference's (`bench.reference_finetune`,
epochs replaced, distilled from the same targets when `bench.reference_distill`), on the device Accelerate picks, in
the run's precision (`auto`: bf16 where native). Each row has validation and test accuracy and the test gap to the
run's own reference (McNemar p); the summary, the mean and spread per side and epochs (`member_finetune.spread`).
The result is written after every fine-tune, so a study cut short keeps what it finished.

Usage:
    .venv/bin/python benchmarks/last_finetune_seeds.py --pack runs/mpnet_rt_family --step 7 --payload PAYLOAD --half
    python benchmarks/last_finetune_seeds.py --payload PAYLOAD --seeds 0 1 2 3 --epochs 2 5 --else-running "nothing" \
        --out benchmarks/results/seed_gap_gpu.json
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import set_seed
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # its sibling scripts, after the packages

from family import write_result  # noqa: E402
from member_finetune import correct, scored, spread, step_model  # noqa: E402
from provenance import measured_on  # noqa: E402

from compressor.core.outdir import RESOLVED_FILE  # noqa: E402
from compressor.pipeline.runner import finetune_device, make_accelerator  # noqa: E402
from compressor.recipe import ModelSpec, load_recipe  # noqa: E402
from compressor.recovery.distill import load_or_compute  # noqa: E402
from compressor.recovery.draws import member_seed  # noqa: E402
from compressor.recovery.train import train  # noqa: E402
from compressor.sources import load_model, load_task_data, load_tokenizer  # noqa: E402
from compressor.sources.batches import tokenize_splits  # noqa: E402
from compressor.sources.builtins import builtin_path  # noqa: E402
from compressor.surgery.checkpoint import load_pruned, save_pruned  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "seed_gap_gpu.json"
REFERENCE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def _halve(weights: Path) -> None:
    """Store the float32 tensors of a safetensors file as float16, in place."""
    state = load_file(str(weights))
    save_file({k: v.half() if v.dtype == torch.float32 else v for k, v in state.items()}, str(weights))


def pack(run: Path, step: int, payload: Path, half: bool, teacher_model: Path | None = None) -> None:
    """Write the payload of `run`'s step `step` to `payload` (see the module docstring); with `teacher_model` (a
    task-tuned original saved elsewhere, e.g. by `base_examples.py --save`), its targets instead of the run's."""
    recipe = load_recipe(run / RESOLVED_FILE)
    task, tokenizer = load_task_data(recipe.data), load_tokenizer(recipe.model)
    model, masks = step_model(recipe, task.label_names, run / "state" / f"step_{step:03d}")
    save_pruned(masks.pruned_copy(model), payload / "member", tokenizer)
    source = recipe.bench.references[0]
    src = builtin_path(source) if source.startswith("builtin:") else Path(source)
    (payload / "reference").mkdir(parents=True)
    for name in (*REFERENCE_FILES, "model.safetensors"):
        if (src / name).exists():
            shutil.copy(src / name, payload / "reference" / name)
    if teacher_model is None:
        shutil.copytree(run / "state" / "teacher", payload / "teacher")
    else:
        splits = tokenize_splits(task, tokenizer, recipe.data.max_length)
        accelerator = make_accelerator(recipe.accelerate.mixed_precision)  # "auto" resolved there
        teacher = load_model(ModelSpec(source=str(teacher_model), task_tuned=True), task.label_names)
        load_or_compute(payload / "teacher", teacher, splits["train"], tokenizer, accelerator,
                        recipe.prune.recovery_finetune.distill)  # fmt: skip
    shutil.copy(run / RESOLVED_FILE, payload / RESOLVED_FILE)
    ref_dir = next((run / "references").iterdir()) / "model"
    ref_tokenizer = load_tokenizer(ModelSpec(source=str(ref_dir), task_tuned=True))
    test = tokenize_splits(task, ref_tokenizer, recipe.data.max_length)["test"]
    hits = correct(load_pruned(ref_dir), test, ref_tokenizer)
    np.save(payload / "reference_test_hits.npy", hits)
    if half:
        for weights in payload.glob("*/model.safetensors"):
            _halve(weights)
    print(f"packed step {step} of {run.name} into {payload.name}")


def fine_tuned(model, splits, tokenizer, spec, accelerator, seed: int, teacher, desc: str) -> tuple[dict, list]:
    """`model` fine-tuned under `spec` from `seed`; its train figures and per-example validation and test hits."""
    started = time.perf_counter()
    info = train(model, splits["train"], tokenizer, spec, accelerator, seed=seed, desc=desc, teacher=teacher)
    info["seconds"] = time.perf_counter() - started
    model = accelerator.unwrap_model(model).eval()  # evaluated where it trained
    return info, [correct(model, splits[name], tokenizer) for name in ("validation", "test")]


def study(args) -> None:
    """Run the member's and the reference's last fine-tunes over `args.epochs` x `args.seeds` from the payload."""
    pay = args.payload
    recipe = load_recipe(pay / RESOLVED_FILE)
    p, index = recipe.prune, len(recipe.prune.resolved_budget.targets) - 1
    accelerator = make_accelerator(recipe.accelerate.mixed_precision)  # "auto" resolved there
    task = load_task_data(recipe.data)
    member_spec = ModelSpec(source=str(pay / "member"), task_tuned=True)
    ref_spec = ModelSpec(source=str(pay / "reference"), task_tuned=False)
    tokenizers = {side: load_tokenizer(spec) for side, spec in (("member", member_spec), ("reference", ref_spec))}
    splits = {side: tokenize_splits(task, tok, recipe.data.max_length) for side, tok in tokenizers.items()}
    reference = np.load(pay / "reference_test_hits.npy")
    distill = p.recovery_finetune.distill
    teacher = load_or_compute(pay / "teacher", load_pruned(pay / "member"), splits["member"]["train"],
                              tokenizers["member"], accelerator, distill)  # fmt: skip
    ref_settings = recipe.bench.reference_finetune or recipe.base_finetune
    rows: dict[str, list] = {"member": [], "reference": []}
    hits: dict[str, list] = {"member": [], "reference": []}
    started = time.perf_counter()
    for epochs in args.epochs:
        for offset in args.seeds:
            change = {"epochs": float(epochs), "seed": float(offset)}
            for side in ("member", "reference"):
                if side == "member":
                    seed = member_seed(recipe.seed + offset, index)
                    model, spec, targets = load_pruned(pay / "member"), p.member_spec(index), teacher
                else:
                    seed = recipe.seed + offset
                    set_seed(seed)
                    model, spec = load_model(ref_spec, task.label_names), ref_settings
                    targets = teacher if recipe.bench.reference_distill else None
                spec = spec.model_copy(update={"epochs": float(epochs)})
                text = f"{side} epochs={epochs:g},seed={offset}"
                info, (val, test) = fine_tuned(model, splits[side], tokenizers[side], spec, accelerator, seed,
                                               targets, text)  # fmt: skip
                rows[side].append(scored(text, change, info, info["seconds"], val, test, reference))
                hits[side].append(test)
                write_result(result(args, recipe, accelerator, reference, rows, hits, started), args.out)


def result(args, recipe, accelerator, reference, rows: dict, hits: dict, started: float) -> dict:
    """The study's result so far."""
    return {
        "what": "the last member's final fine-tune and its reference's, over seeds and epochs, from one payload",
        "run": recipe.name, **measured_on(args.else_running, started), "precision": accelerator.mixed_precision,
        "device": finetune_device(accelerator),
        "reference_test_accuracy": float(reference.mean()), "threads": torch.get_num_threads(),
        "rows": rows["member"], "reference_rows": rows["reference"],
        "spread": spread(rows["member"], hits["member"], rows["reference"], hits["reference"]),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", type=Path, help="a finished family run to pack a payload from")
    parser.add_argument("--step", type=int, help="with --pack: the checkpointed step that closes the last member")
    parser.add_argument("--half", action="store_true", help="with --pack: store the weights in fp16")
    parser.add_argument("--teacher-model", type=Path, help="with --pack: the teacher targets of this model instead")
    parser.add_argument("--payload", type=Path, required=True, help="the payload directory (written by --pack)")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2], help="seed offsets to the run's seed")
    parser.add_argument("--epochs", nargs="*", type=float, default=[2.0], help="epochs of both last fine-tunes")
    parser.add_argument("--else-running", default="not stated", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.pack:
        if args.step is None:
            raise SystemExit("--step: expected the step that closes the last member, with --pack")
        pack(args.pack, args.step, args.payload, args.half, args.teacher_model)
    else:
        study(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
