"""Regression checks against a saved baseline: what users put in their own CI (`compressor bench --baseline`).

A baseline file records, for one benchmark setup, every metric with its value, the direction that is better and a
tolerance, plus the *identity* of what was measured (reference model fingerprint, batch sizes, sequence lengths,
threads, runtime versions, evaluation data). A check refuses (exit 2) a baseline whose identity differs from the
run's: a ratio measured on other shapes or another torch says nothing about this one. The candidate itself is what
a check is about (a new export, a new pruning plan), so its fingerprint is recorded but never refused.

Metric kinds and how each is decided (why: a shared CI runner is noisy, so one number per run would flake):
- `ratio`: candidate vs reference speed-up, per round (interleaved rounds, same run, so portable across
  machines). The per-round log-ratios of the run and of the baseline go through Welch's one-sided t-test
  (scipy.stats.ttest_ind); the one-sided `confidence` bound of the change must lie beyond the tolerance in the bad
  direction before it counts as a regression. A 15% slowdown with a 8% tolerance is caught; noise is not.
- `throughput`: absolute examples/s per round, decided the same way, but only when the baseline's CPU model is this
  machine's (otherwise reported as skipped, never as passed silently: the table says so).
- `quality`: accuracy and agreement on the same evaluation examples (deterministic), compared directly.
Tolerances are `relative` (fraction of the baseline value; the only kind for per-round metrics) or `absolute`.

The verdicts are rendered (Markdown, plot, regression.json) by `compressor.regression_report`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from scipy import stats

from compressor import atomic
from compressor.errors import UserError
from compressor.machine import cpu_model
from compressor.userinput import format_validation_error

FORMAT = "compressor-baseline/1"
CONFIDENCE = 0.95
DEFAULT_TOLERANCES = {"ratio": {"relative": 0.08}, "throughput": {"relative": 0.25}, "quality": {"absolute": 0.01}}
PER_ROUND_KINDS = ("ratio", "throughput")
WEIGHT_PATTERNS = ("config.json", "*.safetensors", "*.bin", "*.onnx", "*.onnx_data")


class BaselineError(UserError):
    """An invalid baseline, or one measured on something else: one line, exit 2."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Tolerance(_Strict):
    """How far a metric may move in its bad direction: a fraction of the baseline value, or an absolute amount."""

    relative: float | None = Field(None, ge=0, lt=1)
    absolute: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> Tolerance:
        if (self.relative is None) == (self.absolute is None):
            raise ValueError("expected exactly one of relative or absolute")
        return self


class Metric(_Strict):
    """One baseline entry. `per_round` holds the baseline run's rounds for the per-round kinds."""

    kind: Literal["ratio", "throughput", "quality"]
    direction: Literal["higher", "lower"]
    value: float
    tolerance: Tolerance
    per_round: list[float] | None = None

    @model_validator(mode="after")
    def _rounds_for_per_round_kinds(self) -> Metric:
        if self.kind in PER_ROUND_KINDS:
            if not self.per_round or any(x <= 0 for x in self.per_round):
                raise ValueError(f"per_round: expected positive per-round values for a {self.kind} metric")
            if self.tolerance.relative is None:
                raise ValueError(f"tolerance: expected relative for a {self.kind} metric")
        return self


class Baseline(_Strict):
    """The whole file (see docs/ci.md for an annotated example)."""

    format: Literal["compressor-baseline/1"]
    confidence: float = Field(CONFIDENCE, gt=0.5, lt=1)
    identity: dict
    candidate_fingerprints: dict[str, str] = {}
    cpu_model: str
    metrics: dict[str, Metric] = Field(min_length=1)


# ---------------------------------------------------------------------------------------------------- identity


def fingerprint(path: str | Path) -> str:
    """sha256 (first 16 hex digits) over a model directory's config and weight files (PyTorch or ONNX)."""
    digest = hashlib.sha256()
    files = sorted({f for pattern in WEIGHT_PATTERNS for f in Path(path).glob(pattern) if f.is_file()})
    for f in files:
        digest.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def batches_fingerprint(batches: Sequence[dict] | None) -> str | None:
    """sha256 (16 hex digits) of the evaluation examples (inputs and labels), None without evaluation data."""
    if not batches:
        return None
    digest = hashlib.sha256()
    for batch in batches:
        for key in sorted(batch):
            digest.update(key.encode() + np.ascontiguousarray(batch[key].numpy()).tobytes())
    return digest.hexdigest()[:16]


def run_identity(reference: str, spec, threads: int, candidates: Sequence[str], eval_data: str | None) -> dict:
    """What must be equal between a baseline and a check: known before anything is timed."""
    from compressor.bench import machine_info

    runtime = {k: machine_info()[k] for k in ("torch", "transformers", "onnxruntime")}
    return {
        "reference": reference,
        "candidates": sorted(candidates),
        "batch_sizes": list(spec.batch_sizes),
        "seq_lens": list(spec.seq_lens),
        "threads": threads,
        "runtime": runtime,
        "eval_data": eval_data,
    }


def check_identity(baseline: Baseline, identity: dict) -> None:
    """Raise BaselineError (one line naming every difference) when the baseline was measured on something else."""
    keys = sorted(set(baseline.identity) | set(identity))
    diffs = [
        f"{k} {baseline.identity.get(k)!r} there, {identity.get(k)!r} now"
        for k in keys
        if baseline.identity.get(k) != identity.get(k)
    ]
    if diffs:
        raise BaselineError(f"--baseline: measured on something else: {'; '.join(diffs)}")


# ---------------------------------------------------------------------------------------------------- metrics


@dataclass
class Measured:
    """One metric of this run: `value` (geometric mean of rounds for the per-round kinds) and its rounds."""

    kind: str
    value: float
    per_round: list[float] | None = None


def _geomean(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def measured_metrics(result: dict) -> dict[str, Measured]:
    """Every checkable metric of a `compressor.bench.bench` result, keyed `kind:candidate[:s<len>:b<batch>]`."""
    ref, out = result["reference"], {}
    for name, per_seq in result["throughput"].items():
        for s, per_batch in per_seq.items():
            for b, row in per_batch.items():
                eps = [int(b) / x for x in row["seconds_per_round"]]
                out[f"throughput:{name}:s{s}:b{b}"] = Measured("throughput", _geomean(eps), eps)
                if name != ref:
                    ratios = result["speedups"][name][s][b]["per_round"]
                    out[f"ratio:{name}:s{s}:b{b}"] = Measured("ratio", _geomean(ratios), list(ratios))
    quality = result.get("quality")
    for name, row in (quality or {}).get("results", {}).items():
        if name != ref:
            out[f"agreement:{name}"] = Measured("quality", row["agreement"])
        if row.get("accuracy") is not None:
            out[f"accuracy:{name}"] = Measured("quality", row["accuracy"])
    return out


def new_baseline(result: dict, identity: dict, fingerprints: dict[str, str], tolerances: dict | None = None) -> dict:
    """A baseline for this run: every metric with direction 'higher' and the default tolerance of its kind."""
    tolerances = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    metrics = {
        key: {"kind": m.kind, "direction": "higher", "value": m.value, "tolerance": tolerances[m.kind]}
        | ({"per_round": m.per_round} if m.per_round else {})
        for key, m in measured_metrics(result).items()
    }
    return {
        "format": FORMAT,
        "confidence": CONFIDENCE,
        "identity": identity,
        "candidate_fingerprints": fingerprints,
        "cpu_model": cpu_model(),
        "metrics": metrics,
    }


def save_baseline(baseline: dict, path: str | Path) -> Path:
    """Validate and write atomically (a killed run never leaves half a baseline)."""
    Baseline.model_validate(baseline)
    atomic.write_text(path, json.dumps(baseline, indent=2) + "\n")
    return Path(path)


def load_baseline(path: str | Path) -> Baseline:
    """Read and validate a baseline file; any problem is one BaselineError line naming the file and the field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(f"--baseline: '{path}' not found (expected a file written by --save-baseline)") from None
    except (OSError, ValueError) as err:
        raise BaselineError(f"--baseline: '{path}' is not a readable JSON file ({err})") from None
    try:
        return Baseline.model_validate(data)
    except ValidationError as err:
        raise BaselineError(f"--baseline: '{path}': {format_validation_error(err)}") from None


# ---------------------------------------------------------------------------------------------------- decision


@dataclass
class Verdict:
    """The decision on one metric. `change` is now/was − 1 (or now − was for absolute tolerances); `bound` the
    one-sided confidence bound of that change in the bad direction (None for quality); `limit` the tolerated
    change."""

    metric: str
    kind: str
    direction: str
    was: float
    now: float
    tolerance: str
    limit: float
    change: float
    bound: float | None
    status: Literal["ok", "REGRESSION", "better", "skipped"]
    note: str = ""


def _bad_sign(direction: str) -> float:
    return 1.0 if direction == "higher" else -1.0


def _tolerance_text(tol: Tolerance) -> str:
    return f"{100 * tol.relative:.1f}%" if tol.relative is not None else f"{tol.absolute:g}"


def per_round_bound(now: Sequence[float], was: Sequence[float], direction: str, confidence: float) -> float:
    """One-sided `confidence` bound, in the bad direction, of the change in the mean log value (Welch's t-test on
    the per-round logs). Falls back to the point estimate when either side has too few rounds or no spread."""
    a, b = np.log(now), np.log(was)
    point = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return point
    alternative = "less" if direction == "higher" else "greater"
    ci = stats.ttest_ind(a, b, equal_var=False, alternative=alternative).confidence_interval(confidence)
    bound = float(ci.high if direction == "higher" else ci.low)
    return bound if np.isfinite(bound) else point


def decide(name: str, ref: Metric, now: Measured, confidence: float) -> Verdict:
    """Regression when the change is beyond the tolerance in the bad direction (for per-round metrics: when its
    one-sided confidence bound is); 'better' when the point change is beyond it in the good direction."""
    sign = _bad_sign(ref.direction)
    tol = ref.tolerance
    if ref.kind in PER_ROUND_KINDS:
        log_bound = per_round_bound(now.per_round, ref.per_round, ref.direction, confidence)
        limit_log = np.log1p(-tol.relative) if sign > 0 else np.log1p(tol.relative)
        regressed = sign * log_bound < sign * limit_log
        change, bound, limit = now.value / ref.value - 1, float(np.expm1(log_bound)), float(np.expm1(limit_log))
    else:
        relative = tol.relative is not None
        change = now.value / ref.value - 1 if relative else now.value - ref.value
        limit = -sign * (tol.relative if relative else tol.absolute)
        bound, regressed = None, sign * change < sign * limit - 1e-12
    better = sign * change > -sign * limit
    status = "REGRESSION" if regressed else "better" if better else "ok"
    return Verdict(
        name, ref.kind, ref.direction, ref.value, now.value, _tolerance_text(tol), limit, change, bound, status
    )


def compare(baseline: Baseline, measured: dict[str, Measured], same_cpu: bool) -> list[Verdict]:
    """A verdict per baseline metric. A metric set that differs from the baseline's is a mismatch (BaselineError):
    a metric that vanished must never pass silently. Throughput metrics are skipped on another CPU model."""
    missing, extra = sorted(set(baseline.metrics) - set(measured)), sorted(set(measured) - set(baseline.metrics))
    if missing or extra:
        raise BaselineError(
            f"--baseline: metrics differ: missing now {missing or '[]'}, not in baseline {extra or '[]'}"
        )
    verdicts = []
    for name, ref in baseline.metrics.items():
        v = decide(name, ref, measured[name], baseline.confidence)
        if ref.kind == "throughput" and not same_cpu:
            v.status, v.note = "skipped", f"baseline CPU '{baseline.cpu_model}' is not this one"
        verdicts.append(v)
    return verdicts


def passed(verdicts: Sequence[Verdict]) -> bool:
    return not any(v.status == "REGRESSION" for v in verdicts)
