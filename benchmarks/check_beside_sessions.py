"""Whether what a run's process did before its budget check moves the check: a finished run's members checked
(`compressor.bench.paired_check`, as the run's budget check) alone, then beside every other frontier point's ONNX
Runtime and OpenVINO session (built; then right after one bench round of them), then after freeing them, then after
`--finetune-steps` steps of a bf16-autocast (where native) AdamW fine-tune of the original in this process.

A run's budget check comes after its bench, in a process that holds a session for every exported candidate; if those
sessions' threads or memory slowed the PyTorch timings, the run's own verdict would read low; so would it if the
fine-tunes before it (every step's, member's and baseline's, in the same process) left the allocator or the threads
slower. This measures both on the same models in one process, so the readings differ by that alone (and the
machine's drift).

Usage (machine to itself):
    .venv/bin/python benchmarks/check_beside_sessions.py --run runs/mpnet_rt_family --else-running "nothing" \
        → benchmarks/results/check_beside_sessions.json
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from budget_check import check_parser, load_run, pairs  # noqa: E402
from family import write_result  # noqa: E402
from provenance import measured_on  # noqa: E402
from retime_family import original_dir, points  # noqa: E402
from transformers import AutoModelForSequenceClassification  # noqa: E402

from compressor import bench  # noqa: E402
from compressor.pipeline.runner import native_precision  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "check_beside_sessions.json"
OTHER_RUNTIMES = ["onnx-fp32", "onnx-int8", "openvino-int8"]


def checks(members: list, shape: tuple[int, int, int, float], stage: str) -> dict[str, float]:
    """Each member's budget-check median at `shape` (batch, length, rounds, min_time_s), printed under `stage`."""
    out = {label: bench.paired_check(member, original, *shape)["median"] for label, member, original in members}
    print(f"{stage}: " + ", ".join(f"{label} {value:.2f}x" for label, value in out.items()), flush=True)
    return out


def finetune(model_dir: Path, steps: int, batch_size: int, seq_len: int) -> float:
    """`steps` AdamW steps of the model at `model_dir` on random tokens at the budget's shape, under bf16 autocast
    where this CPU multiplies bf16 natively (as a run's fine-tunes): a fine-tune's allocations and thread use, not
    its result. Returns the seconds it took."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).train()  # the run's cached base fine-tune
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(
        1000, int(model.config.vocab_size), (batch_size, seq_len), generator=torch.Generator().manual_seed(0)
    )
    labels = torch.zeros(batch_size, dtype=torch.long)
    started = time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_precision()[0] == "bf16"):
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    del model, optimizer
    gc.collect()
    return round(time.perf_counter() - started, 1)


def main() -> None:
    parser = check_parser(__doc__, RESULTS)
    parser.add_argument("--finetune-steps", type=int, default=40, help="steps of the last stage's fine-tune (0: none)")
    args = parser.parse_args()
    report, recipe, budget = load_run(args.run)
    shape = (budget.batch_size, budget.seq_len, args.rounds, recipe.bench.min_time_s)
    members = pairs(report, args.run, budget.seq_len)
    original = members[0][2]
    started, stages = time.perf_counter(), {}
    stages["alone"] = checks(members, shape, "alone")
    rows = points(report, args.run, [r for r in OTHER_RUNTIMES if r != budget.runtime])
    others = [bench.runtime_candidate(r["name"], r["runtime"], args.run / r["path"], budget.seq_len, None, original)
              for r in rows]  # fmt: skip
    stages["sessions_built"] = checks(members, shape, f"beside {len(others)} sessions")
    bench.measure_throughput(others, [budget.batch_size], [budget.seq_len], rounds=1, warmup=1)
    stages["after_a_round_of_them"] = checks(members, shape, "right after one bench round of them")
    del others
    gc.collect()
    stages["freed"] = checks(members, shape, "after freeing them")
    if args.finetune_steps:
        spent = finetune(original_dir(report, None), args.finetune_steps, budget.batch_size, budget.seq_len)
        stages["after_a_finetune"] = checks(members, shape, f"after {args.finetune_steps} fine-tune steps ({spent} s)")
    result = {
        "figure": f"each member's budget check alone, beside {len(rows)} other sessions, after a round, freed, after "
        f"{args.finetune_steps} fine-tune steps",
        "run": args.run.name,
        "runtime": budget.runtime,
        **measured_on(args.else_running, started),
        "stages": stages,
        "run_report_speedup": {m.label: m.budget.measured_speedup if m.budget else None for m in report.members()},
    }
    write_result(result, args.out)


if __name__ == "__main__":
    main()
