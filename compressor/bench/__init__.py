"""Benchmark: quality and throughput of an original model and its pruned / exported variants.

Everything here works on *candidates*: a name, a `predict(batch) -> logits` function, size on disk, FLOPs per example
and heads per layer. PyTorch models and export variants become candidates through `pytorch_candidate` and
`exported_candidate` (loaded by their runtime's engine), so the measuring code never knows which runtime it times.
Measurement only: the layer-drop baseline is trained beside the recovery it mirrors (`compressor.recovery.layer_drop`),
and the users' CI guard that decides a bench result against a saved baseline is its own package (`compressor.guard`).

May import every stage below it; `report`, `analysis`, `pipeline` and the commands import it.

Design choices, and why:
- Throughput rounds are *interleaved*: every round visits every (sequence length, batch size) shape and, inside it,
  every candidate in a rotating order, so slow drift of a shared machine (other jobs, thermal state) hits all
  variants alike. Within a round a variant's time is its fastest of several calls (other processes only ever add
  time); across rounds times and speed-ups (computed per round, paired) are summarised by median, inter-quartile
  range and min–max. Results are keyed `[variant][str(seq_len)][str(batch_size)]` (report schema 2).
- Inputs are synthetic token ids of exactly each sequence length with an all-ones attention mask: timing must not
  depend on how a particular batch happens to be padded. FLOPs, and so the FLOP-ideal ratio, are per length (the
  attention scores grow with its square, the projections linearly).
- Quality uses the same tokenised batches for every candidate; accuracy gets a 95% Wilson interval and each
  candidate is compared with the reference on the *same examples* (exact McNemar test on the discordant pairs and a
  paired interval for the accuracy difference), which separates a real loss from sampling noise.
- Peak memory is the growth of the process's resident-set high-water mark (VmHWM, reset through
  /proc/self/clear_refs) above its resident size while a candidate is timed: tracemalloc cannot see PyTorch's or
  ONNX Runtime's allocators. It is taken in every round (same rotating order as the timing) and the median over
  rounds reported. Caveat: all variants share one process, so memory an earlier measurement left resident
  (allocator caches, ONNX Runtime arenas) is not counted again; the figure is a lower bound of a variant's working
  set and depends somewhat on what ran before it, which the rotation and the median even out but do not remove.
- The bench output directory is written atomically (`core.atomic.directory`): a killed run leaves the previous
  complete output or none, never half of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compressor.bench.candidates import (
    Batch,
    Candidate,
    check_names,
    exported_candidate,
    onnx_candidate,
    pytorch_candidate,
    runtime_candidate,
)
from compressor.bench.quality import (
    collect_logits,
    mcnemar_exact,
    measure_quality,
    paired_difference_interval,
    wilson_interval,
)
from compressor.bench.render import BENCH_FILES, SCHEMA_VERSION, check_out_dir, render_bench_md, write_bench_report
from compressor.bench.timing import (
    LAYOUT,
    headline_batch,
    measure_throughput,
    paired_check,
    paired_speedups,
    peak_rss_delta,
    synthetic_batch,
)
from compressor.core.errors import UserError
from compressor.core.machine import cpu_summary, int8_features, machine_info
from compressor.core.timing import ORT_DEFAULT_NOTE, ort_default_threads, set_threads, time_call

__all__ = [
    "BENCH_FILES",
    "LAYOUT",
    "ORT_DEFAULT_NOTE",
    "SCHEMA_VERSION",
    "Batch",
    "Candidate",
    "bench",
    "check_out_dir",
    "collect_logits",
    "headline_batch",
    "machine_info",
    "mcnemar_exact",
    "measure_quality",
    "measure_throughput",
    "exported_candidate",
    "onnx_candidate",
    "ort_default_threads",
    "paired_check",
    "paired_difference_interval",
    "paired_speedups",
    "peak_rss_delta",
    "pytorch_candidate",
    "render_bench_md",
    "runtime_candidate",
    "set_threads",
    "summarize",
    "synthetic_batch",
    "time_call",
    "wilson_interval",
    "write_bench_report",
]


def is_int8(name: str) -> bool:
    """Whether candidate `name` (`compressor.core.candidates`) runs on an int8 runtime (a gated declaration)."""
    from compressor.core.candidates import CandidateName
    from compressor.core.runtimes import runtime

    cid = CandidateName.parse(name)
    return cid is not None and runtime(cid.runtime).gated


def validation_quality(candidates: Sequence[Candidate], validation: Sequence[Batch], reference: str) -> dict:
    """`measure_quality` on the validation batches: of every candidate that can read them (one with its own
    tokenisation brings its own `val_batches`; without them it is left out)."""
    import dataclasses

    readers = [
        c if c.eval_batches is None else dataclasses.replace(c, eval_batches=c.val_batches)
        for c in candidates
        if c.eval_batches is None or c.val_batches is not None
    ]
    return measure_quality(readers, validation, reference, keep_hits=False)  # test hits suffice for seed repeats


def summarize(
    candidates: Sequence[Candidate],
    throughput: dict,
    quality: dict | None,
    reference: str,
    cpu: dict | None = None,
    val_quality: dict | None = None,
) -> dict:
    """Per candidate: size, heads, FLOPs and ratios vs the reference, measured and FLOP-ideal, per sequence length
    (and batch size); the one headline figure is at the headline batch and the first sequence length. An int8
    candidate's entry names the CPU's int8 features (`cpu`: a `cpu_summary`, this machine's by default), since its
    speed-up depends on them. With `val_quality`, each entry has its validation accuracy too (`val_accuracy`, None
    for a candidate it did not score)."""
    features = int8_features(cpu)
    speedups = paired_speedups(throughput, reference)
    by_name = {c.name: c for c in candidates}
    ref = by_name[reference]
    setup = throughput["setup"]
    lengths = setup["seq_lens"]
    seq, head = str(lengths[0]), str(headline_batch(setup["batch_sizes"]))
    summary = {}
    for c in candidates:
        flops = {str(s): c.flops_at(s, lengths[0]) for s in lengths}
        ref_flops = {str(s): ref.flops_at(s, lengths[0]) for s in lengths}
        ideal = {s: ref_flops[s] / flops[s] if ref_flops[s] and flops[s] else None for s in flops}
        speed = {s: {b: row["median"] for b, row in rows.items()} for s, rows in speedups[c.name].items()}
        entry = {
            "kind": c.kind,
            "size_bytes": c.size_bytes,
            "size_ratio": ref.size_bytes / c.size_bytes if c.size_bytes else None,
            "flops_per_example": flops[seq],
            "flops_per_example_by_seq_len": flops,
            "flop_ideal_speedup": ideal[seq],
            "flop_ideal_speedup_by_seq_len": ideal,
            "heads_per_layer": c.heads_per_layer,
            "heads": sum(c.heads_per_layer) if c.heads_per_layer is not None else None,
            "speedup": speed,
            "speedup_iqr": {
                s: {b: [row["q1"], row["q3"]] for b, row in rows.items()} for s, rows in speedups[c.name].items()
            },
            "headline_seq_len": int(seq),
            "headline_batch": int(head),
            "headline_speedup": speed[seq][head],
            "speedup_over_ideal": speed[seq][head] / ideal[seq] if ideal[seq] else None,
        }
        if is_int8(c.name):
            entry["cpu_int8_features"] = features
        if quality is not None:
            q = quality["results"][c.name]
            entry |= {k: q.get(k) for k in ("accuracy", "accuracy_ci95", "accuracy_delta", "agreement")}
            entry["mcnemar_p"] = q.get("mcnemar", {}).get("p_value")
        if val_quality is not None:
            entry["val_accuracy"] = val_quality["results"].get(c.name, {}).get("accuracy")
        summary[c.name] = entry
    return summary


def bench(
    candidates: Sequence[Candidate],
    batches: Sequence[Batch] | None,
    spec,
    out_dir: str | Path | None,
    reference: str = "pytorch-original",
    compare: Sequence[tuple[str, str]] = (),
    skipped: Sequence[str] = (),
    validation: Sequence[Batch] | None = None,
) -> dict:
    """Quality (when `batches` are given) and throughput per `spec` (a `compressor.recipe.BenchSpec`), with ratios
    against `reference`; writes report.json, report.md and plots into `out_dir` when given (atomically: the whole
    directory is replaced, so it must be empty or hold only an earlier benchmark's files); `compare`: further
    (candidate, versus) pairs whose accuracies are compared on the same examples (`quality["pairs"]`); `skipped`:
    one line per runtime left out of it and why (`core.runtimes.cannot_pay`), kept in the result and its report;
    `validation`: labelled batches of the validation split, scored like the test batches (`validation_quality`) so
    that choices are made on validation and test is only reported (`bench.frontier.pick`). Returns the result."""
    check_names(candidates)
    if reference not in [c.name for c in candidates]:
        raise UserError(f"bench: reference '{reference}' is not among the candidates {[c.name for c in candidates]}")
    if out_dir is not None:
        check_out_dir(out_dir)  # before minutes of measuring
    set_threads(spec.threads)
    quality = measure_quality(candidates, batches, reference, compare) if batches else None
    val_quality = validation_quality(candidates, validation, reference) if validation else None
    throughput = measure_throughput(
        candidates,
        spec.batch_sizes,
        spec.seq_lens,
        rounds=spec.rounds,
        warmup=spec.warmup,
        min_time_s=spec.min_time_s,
        threads=spec.threads,
        precision=spec.precision,
        reference=reference,
    )
    cpu = cpu_summary()
    result = {
        "schema_version": SCHEMA_VERSION,
        "reference": reference,
        "machine": machine_info(),
        "cpu": {**cpu, "int8_features": int8_features(cpu)},
        "setup": throughput["setup"],
        "summary": summarize(candidates, throughput, quality, reference, cpu, val_quality),
        "quality": quality,
        "validation_quality": val_quality,
        "throughput": throughput["results"],
        "speedups": paired_speedups(throughput, reference),
        "skipped": list(skipped),
    }
    if out_dir is not None:
        result["files"] = [str(p) for p in write_bench_report(result, out_dir)]
    return result
