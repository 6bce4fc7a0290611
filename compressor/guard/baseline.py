"""Regression checks against a saved baseline: what users put in their own CI (`compressor bench --baseline`).

A baseline file records, for one benchmark setup, every metric with its value, the direction that is better and a
tolerance, plus the *identity* of what was measured (reference model fingerprint, batch sizes, sequence lengths,
threads, runtime versions, evaluation data). A check refuses (exit 2) a baseline whose identity differs from the
run's: a ratio measured on other shapes or another torch says nothing about this one. The candidate itself is what
a check is about (a new export, a new pruning plan), so its fingerprint is recorded but never refused.

Metric kinds and how each is decided (why: a shared CI runner is noisy, so one number per run would flake):
- `ratio`: candidate vs reference speed-up, per round (interleaved rounds, same run, so portable across
  machines of one CPU model, and across CPU models when both run the same kernels: a ratio between two runtimes,
  e.g. ONNX Runtime vs PyTorch, or of an int8 candidate, rests on each runtime's kernels for this CPU and is compared
  only on the baseline's CPU model, like throughput). The estimate is the change of the mean per-round log value
  (now vs baseline), reported as a relative change (equal to now/was − 1 of the geometric means). The rule is the
  usual "practically and statistically significant" one: REGRESSION when the estimate is beyond the tolerance in
  the bad direction AND Welch's one-sided t-test of "no change" on the per-round logs (scipy.stats.ttest_ind,
  unequal variances) is significant at the baseline's `confidence` (p < 1 − confidence). Reported with it: the
  two-sided (2·confidence − 1) interval of the change, which lies wholly on the bad side of zero exactly when the
  test is significant.
  `inconclusive` (fails the check, exit 1, never a silent pass) when this run's rounds are too dispersed to detect
  the tolerance (`too_noisy`: the half-width of the one-sided `confidence` interval of their mean log exceeds the
  tolerance), or when the estimate is beyond the tolerance but not significant; the advice is to re-run on a quiet
  machine or raise --rounds. `--save-baseline` refuses (exit 2) a run whose rounds are too dispersed by the same
  measure: every later check against it would be blind.
- `throughput`: absolute examples/s per round, decided the same way, but only when the baseline's CPU model is this
  machine's (otherwise reported as skipped, never as passed silently: the table says so).
- `quality`: accuracy and agreement on the same evaluation examples (deterministic), compared directly.
Tolerances are `relative` (fraction of the baseline value; the only kind for per-round metrics) or `absolute`.
Default ratio tolerance 10%: with a point-estimate rule it must clear the run-to-run spread of an unchanged model
(within ±6% over 10 rounds on a 2-core machine) and stay below what a 15% slowdown measures (−13% to −15%).

The verdicts are rendered (Markdown, plot, regression.json) by `compressor.guard.report`.
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

from compressor.core import atomic
from compressor.core.errors import UserError
from compressor.core.machine import cpu_identity
from compressor.recipe.yamlio import format_validation_error

FORMAT = "compressor-baseline/1"
CONFIDENCE = 0.95
DEFAULT_TOLERANCES = {"ratio": {"relative": 0.10}, "throughput": {"relative": 0.25}, "quality": {"absolute": 0.01}}
PER_ROUND_KINDS = ("ratio", "throughput")
FAILING = ("REGRESSION", "inconclusive")  # statuses that fail a check (exit 1)
RERUN = "re-run on a quiet machine or raise --rounds"
NOISY_ADVICE = f"rounds too dispersed to detect the tolerance; {RERUN}"
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
    from compressor.core.machine import machine_info

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
    cpu_bound: bool = False  # a ratio that rests on this CPU's kernels (`cpu_bound_ratio`): same CPU model only


def _geomean(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def cpu_bound_ratio(result: dict, name: str) -> bool:
    """Whether candidate `name`'s speed-up over the reference depends on the CPU model, not only on the models: it
    runs on another engine than the reference (ONNX Runtime, OpenVINO vs PyTorch: each picks its own kernels per CPU)
    or on int8 kernels (VNNI, AMX or neither), so another CPU moves it by more than any tolerance."""
    summary = result["summary"]
    entry, ref = summary[name], summary[result["reference"]]
    return entry["kind"] != ref["kind"] or "cpu_int8_features" in entry


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
                    bound = cpu_bound_ratio(result, name)
                    out[f"ratio:{name}:s{s}:b{b}"] = Measured("ratio", _geomean(ratios), list(ratios), bound)
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
        "cpu_model": cpu_identity(),
        "metrics": metrics,
    }


def check_noise(baseline: Baseline) -> None:
    """Refuse (BaselineError, one line) a baseline whose rounds are too dispersed to detect their own tolerance
    (`too_noisy`): every later check against it would be inconclusive or blind, e.g. one taken on a loaded machine."""
    worst = {
        name: half_width(m.per_round, baseline.confidence)
        for name, m in baseline.metrics.items()
        if m.kind in PER_ROUND_KINDS and too_noisy(m.per_round, m.tolerance.relative, m.direction, baseline.confidence)
    }
    if worst:
        names = sorted(worst, key=worst.get, reverse=True)
        shown = ", ".join(
            f"{n} ±{100 * np.expm1(worst[n]):.0f}% vs {_tolerance_text(baseline.metrics[n].tolerance)}"
            for n in names[:3]
        )
        raise BaselineError(
            f"--save-baseline: rounds too dispersed to resolve the tolerance of {len(worst)} metric(s) ({shown}"
            f"{', …' if len(names) > 3 else ''}); {RERUN}"
        )


def save_baseline(baseline: dict, path: str | Path) -> Path:
    """Validate, refuse a too-noisy baseline (`check_noise`) and write atomically (a killed run never leaves half a
    baseline)."""
    check_noise(Baseline.model_validate(baseline))
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
    """The decision on one metric. `change` is now/was − 1 (or now − was for absolute tolerances); for per-round
    metrics `low`/`high` bound its two-sided (2·confidence − 1) interval and `p_value` is the one-sided Welch test of
    "no change" against a change in the bad direction (None for quality); `limit` is the tolerated change."""

    metric: str
    kind: str
    direction: str
    was: float
    now: float
    tolerance: str
    limit: float
    change: float
    low: float | None
    high: float | None
    p_value: float | None
    status: Literal["ok", "REGRESSION", "inconclusive", "better", "skipped"]
    note: str = ""


@dataclass
class LogChange:
    """Change of the mean log value between two sets of rounds: estimate, two-sided interval, one-sided p-value."""

    estimate: float
    low: float
    high: float
    p_value: float


def _bad_sign(direction: str) -> float:
    return 1.0 if direction == "higher" else -1.0


def _tolerance_text(tol: Tolerance) -> str:
    return f"{100 * tol.relative:.1f}%" if tol.relative is not None else f"{tol.absolute:g}"


def limit_log(relative: float, direction: str) -> float:
    """The tolerated change of the mean log value, signed in the bad direction: log(1 − tol) when higher is
    better, log(1 + tol) when lower is."""
    return float(np.log1p(-relative) if direction == "higher" else np.log1p(relative))


def half_width(rounds: Sequence[float], confidence: float) -> float:
    """Half-width, in log units, of the one-sided `confidence` interval of the mean log of `rounds`: the smallest
    change these rounds alone can tell from noise (infinite with fewer than 2 rounds)."""
    logs = np.log(rounds)
    if len(logs) < 2:
        return float("inf")
    return float(stats.t.ppf(confidence, len(logs) - 1) * np.std(logs, ddof=1) / np.sqrt(len(logs)))


def too_noisy(rounds: Sequence[float], relative: float, direction: str, confidence: float) -> bool:
    """True when the rounds' half-width exceeds the tolerance: a change as large as the tolerance could not be
    told from noise, so these rounds can neither show nor rule out a regression."""
    return half_width(rounds, confidence) > abs(limit_log(relative, direction))


def log_change(now: Sequence[float], was: Sequence[float], direction: str, confidence: float) -> LogChange:
    """Welch's t-test (scipy.stats.ttest_ind, unequal variances) on the per-round logs: the change of the mean log,
    its two-sided (2·confidence − 1) interval and the one-sided p-value of a change in the bad direction. Rounds
    without any spread make the change exact (p 0 when it is in the bad direction, else 1)."""
    a, b = np.log(now), np.log(was)
    point = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        exact = 0.0 if _bad_sign(direction) * point < 0 else 1.0
        return LogChange(point, point, point, exact if len(a) > 1 and len(b) > 1 else 1.0)
    alternative = "less" if direction == "higher" else "greater"
    p_value = float(stats.ttest_ind(a, b, equal_var=False, alternative=alternative).pvalue)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(2 * confidence - 1)
    return LogChange(point, float(ci.low), float(ci.high), p_value)


def _per_round_status(ref: Metric, now: Measured, change: LogChange, confidence: float) -> tuple[str, str]:
    """REGRESSION when the estimate is beyond the tolerance in the bad direction and significant; inconclusive
    when this run's rounds are too noisy, or the estimate is beyond the tolerance but not significant."""
    sign, limit = _bad_sign(ref.direction), limit_log(ref.tolerance.relative, ref.direction)
    beyond = sign * change.estimate < sign * limit
    if beyond and change.p_value < 1 - confidence:
        return "REGRESSION", ""
    if too_noisy(now.per_round, ref.tolerance.relative, ref.direction, confidence):
        return "inconclusive", NOISY_ADVICE
    if beyond:
        return "inconclusive", f"beyond the tolerance but not significant (p={change.p_value:.2g}); {RERUN}"
    better = sign * np.expm1(change.estimate) > ref.tolerance.relative  # e.g. +10% or more for a 10% tolerance
    return ("better" if better else "ok"), ""


def decide(name: str, ref: Metric, now: Measured, confidence: float) -> Verdict:
    """Per-round metrics: see `_per_round_status`. Quality: regression when the change is beyond the tolerance in
    the bad direction. Either kind is 'better' when its change is beyond the tolerance in the good direction."""
    sign, tol = _bad_sign(ref.direction), ref.tolerance
    text = _tolerance_text(tol)
    if ref.kind in PER_ROUND_KINDS:
        lc = log_change(now.per_round, ref.per_round, ref.direction, confidence)
        status, note = _per_round_status(ref, now, lc, confidence)
        low, high, limit = (float(np.expm1(x)) for x in (lc.low, lc.high, limit_log(tol.relative, ref.direction)))
        change = float(np.expm1(lc.estimate))
        return Verdict(name, ref.kind, ref.direction, ref.value, now.value, text, limit, change, low, high,
                       lc.p_value, status, note)  # fmt: skip
    relative = tol.relative is not None
    change = now.value / ref.value - 1 if relative else now.value - ref.value
    limit = -sign * (tol.relative if relative else tol.absolute)
    status = (
        "REGRESSION" if sign * change < sign * limit - 1e-12 else "better" if sign * change > -sign * limit else "ok"
    )
    return Verdict(name, ref.kind, ref.direction, ref.value, now.value, text, limit, change, None, None, None, status)


def compare(baseline: Baseline, measured: dict[str, Measured], same_cpu: bool) -> list[Verdict]:
    """A verdict per baseline metric. A metric set that differs from the baseline's is a mismatch (BaselineError):
    a metric that vanished must never pass silently. On another CPU model, throughput and the ratios that rest on
    the CPU's kernels (`cpu_bound_ratio`) are skipped, and the table says so."""
    missing, extra = sorted(set(baseline.metrics) - set(measured)), sorted(set(measured) - set(baseline.metrics))
    if missing or extra:
        raise BaselineError(
            f"--baseline: metrics differ: missing now {missing or '[]'}, not in baseline {extra or '[]'}"
        )
    verdicts = []
    for name, ref in baseline.metrics.items():
        v = decide(name, ref, measured[name], baseline.confidence)
        if not same_cpu and (ref.kind == "throughput" or measured[name].cpu_bound):
            why = "" if ref.kind == "throughput" else "runtime kernels differ by CPU: "
            v.status, v.note = "skipped", f"{why}baseline CPU '{baseline.cpu_model}' is not this one"
        verdicts.append(v)
    return verdicts


def passed(verdicts: Sequence[Verdict]) -> bool:
    """No metric regressed and none was inconclusive (a CI check must never pass on rounds it cannot read)."""
    return not any(v.status in FAILING for v in verdicts)
