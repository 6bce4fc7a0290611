"""The regression check's outputs: a Markdown summary for pull requests, regression.json/.md/.png in the bench output
directory, and `check_result`, which decides a bench result against a baseline (`guard.baseline`) and writes
them. `$GITHUB_STEP_SUMMARY` gets the Markdown too when set (GitHub Actions shows it on the run's page).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from compressor.core import atomic
from compressor.core.machine import cpu_identity
from compressor.guard.baseline import FAILING, PER_ROUND_KINDS, Baseline, Verdict, compare, measured_metrics, passed

REGRESSION_FILES = ("regression.json", "regression.md", "regression.png")


def _fmt(v: Verdict, x: float) -> str:
    return f"{x:.4g}"


def _change(v: Verdict, x: float | None) -> str:
    if x is None:
        return "–"
    return f"{100 * x:+.1f}%" if v.kind in PER_ROUND_KINDS or v.tolerance.endswith("%") else f"{x:+.4f}"


def _interval(v: Verdict) -> str:
    if v.low is None or v.high is None:
        return "–"
    return f"[{_change(v, v.low)}, {_change(v, v.high)}]"


def _status(v: Verdict) -> str:
    status = f"**{v.status}**" if v.status in FAILING else v.status
    return status + (f" ({v.note})" if v.note else "")


def regression_table(verdicts: Sequence[Verdict], confidence: float) -> list[str]:
    """Markdown table rows (header included): estimate, its interval and one-sided p-value for per-round metrics."""
    level = f"{100 * (2 * confidence - 1):.0f}%"
    lines = [
        f"| metric | direction | was | now | change | {level} interval | p (worse) | tolerance | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for v in verdicts:
        p = "–" if v.p_value is None else f"{v.p_value:.2g}"
        lines.append(
            f"| `{v.metric}` | {v.direction} is better | {_fmt(v, v.was)} | {_fmt(v, v.now)} | "
            f"{_change(v, v.change)} | {_interval(v)} | {p} | {v.tolerance} | {_status(v)} |"
        )
    return lines


def render_markdown(verdicts: Sequence[Verdict], baseline_path: str | Path, confidence: float) -> str:
    """The summary a person reads in a pull request: regressions first, then every metric."""
    bad = [v for v in verdicts if v.status in FAILING]
    count = {s: sum(v.status == s for v in verdicts) for s in ("REGRESSION", "inconclusive", "skipped")}
    head = f"## compressor bench: {'FAIL' if bad else 'PASS'} against `{Path(baseline_path).name}`"
    lines = [head, ""]
    lines.append(
        f"{count['REGRESSION']} of {len(verdicts)} metrics regressed; {count['inconclusive']} inconclusive; "
        f"{count['skipped']} skipped. A per-round metric regresses when its change (of the geometric mean) is beyond "
        f"the tolerance in the bad direction and Welch's one-sided t-test on the per-round logs is significant "
        f"(p < {1 - confidence:.2g}); it is inconclusive (fails too) when this run's rounds are too dispersed to "
        "detect the tolerance, or the change is beyond it but not significant: re-run on a quiet machine or raise "
        "--rounds."
    )
    if bad:
        lines += ["", "### Regressed or inconclusive", "", *regression_table(bad, confidence)]
    lines += ["", "### All metrics", "", *regression_table(verdicts, confidence), ""]
    return "\n".join(lines)


def _plot(verdicts: Sequence[Verdict], path: Path) -> Path:
    """Change vs baseline per metric (estimate, interval) against the tolerated change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.35 * len(verdicts) + 1.5))
    colours = {"REGRESSION": "tab:red", "inconclusive": "tab:orange", "ok": "tab:blue", "better": "tab:green",
               "skipped": "grey"}  # fmt: skip
    for i, v in enumerate(verdicts):
        ax.plot([v.change], [i], "o", color=colours[v.status])
        if v.low is not None and v.high is not None:
            ax.plot([v.low, v.high], [i, i], "-", color=colours[v.status])
        ax.plot([v.limit], [i], "|", color="black", ms=12)
    ax.axvline(0, color="grey", lw=0.8, ls="--")
    ax.set_yticks(range(len(verdicts)), [v.metric for v in verdicts], fontsize=7)
    ax.set_xlabel("change vs baseline (estimate, interval); | = tolerated change")
    ax.set_title("Regression check")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(verdicts: Sequence[Verdict], markdown: str, out_dir: str | Path) -> list[Path]:
    """regression.json, regression.md and regression.png in `out_dir`; the Markdown is also appended to
    `$GITHUB_STEP_SUMMARY` when that is set (GitHub Actions shows it on the run's page)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"passed": passed(verdicts), "verdicts": [asdict(v) for v in verdicts]}
    atomic.write_text(out / "regression.json", json.dumps(payload, indent=2) + "\n")
    atomic.write_text(out / "regression.md", markdown)
    _plot(verdicts, out / "regression.png")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(markdown + "\n")
    return [out / name for name in REGRESSION_FILES]


def check_result(baseline: Baseline, result: dict, baseline_path: str | Path, out_dir: str | Path | None) -> bool:
    """Compare a bench result with a validated, identity-checked baseline; print the Markdown summary, write the
    outputs (when `out_dir` is given) and return whether every metric passed."""
    verdicts = compare(baseline, measured_metrics(result), same_cpu=baseline.cpu_model == cpu_identity())
    markdown = render_markdown(verdicts, baseline_path, baseline.confidence)
    print(markdown)
    if out_dir is not None:
        write_outputs(verdicts, markdown, out_dir)
    return passed(verdicts)
