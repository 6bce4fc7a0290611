"""Writing an analysis result for people: analysis.json, analysis.md (tables) and PNG figures, as one directory
written atomically (`compressor.core.atomic.directory`): a killed process leaves the previous output or none, never
half of one."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from compressor.analysis import plots
from compressor.analysis.core import SIEVE_ROLES, SPECIALISED, TOKEN_MAPS, TOKEN_ROLES
from compressor.core import atomic

MAP_ORDER = (*TOKEN_MAPS, "syntactic_gain")
# Everything `write_analysis` may write: a directory holding only these is an earlier analysis, safe to replace.
ANALYSIS_FILES = (
    "analysis.json",
    "analysis.md",
    "maps.png",
    "sieve.png",
    "roles.png",
    "js_clustering.png",
    "pruning_roles.png",
)
DEFINITIONS = {
    "positional": "max attention at one relative offset for ≥ {positional_threshold:.0%} of queries (Voita)",
    "rare_word": "max attention on the sentence's rarest piece for ≥ {rare_threshold:.0%} of queries (Voita)",
    "syntactic": "some relation/direction with accuracy ≥ fixed-offset baseline + {syntactic_margin:.0%} (Voita/Clark)",
    "delimiter": "≥ {delimiter_threshold:.0%} of attention on [CLS]/[SEP]/punctuation (Clark)",
    "sieve_local": "sieve bias to ±1 neighbours > τ, corrected one-sided test (Pande)",
    "sieve_syntactic": "sieve bias to syntactic neighbours > τ (Pande)",
    "sieve_block": "sieve bias to the same segment/sentence > τ (Pande)",
    "sieve_delimiter": "sieve bias to [CLS]/[SEP] > τ (Pande)",
    "any": "positional ∪ rare_word ∪ syntactic (specialised, Voita)",
}


def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _top(grid: list[list], n: int = 5) -> list[tuple[str, float]]:
    cells = [(f"L{layer}H{h}", v) for layer, row in enumerate(grid) for h, v in enumerate(row) if v is not None]
    return sorted(cells, key=lambda c: -c[1])[:n]


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return out


def _pruning_section(steps: list[dict]) -> list[str]:
    roles = [*SPECIALISED, "delimiter", "any"]
    header = ["step", "kept", "removed", *[f"{r} kept / removed share" for r in roles]]
    rows = []
    for s in steps:
        cells = [s.get("label", s.get("step")), s["heads_kept"], s["heads_removed"]]
        for r in roles:
            info = s["roles"].get(r, {})
            cells.append(f"{_fmt(info.get('kept_share'), 2)} / {_fmt(info.get('removed_share'), 2)}")
        rows.append(cells)
    return ["## Roles of kept vs removed heads", "", *_table(header, rows), "", "![pruning](pruning_roles.png)", ""]


def render_markdown(result: dict) -> str:
    """The human-readable report (tables; figures referenced by relative path), one section after another."""
    sections = (_roles_found, _attention_shares, _layer_means, _relations, _sieve_and_maps, _distances)
    lines = [line for section in sections for line in section(result)]
    if result.get("pruning_steps"):
        lines += _pruning_section(result["pruning_steps"])
    return "\n".join(lines) + "\n"


def _roles_found(result: dict) -> list[str]:
    """The header, the roles found (counts and rules), the sieve test used, and how roles overlap."""
    s, counts = result["settings"], result["counts"]
    lines = [
        "# Head analysis",
        "",
        f"{result['layers']} layers × {result['heads']} heads ({counts['analysed_heads']} present), "
        f"{result['examples']} {'sentence pairs' if s.get('pairs') else 'examples'}, max length {s['max_length']}. "
        "Heads are `L<layer>H<head>`, 0-based original ids; removed heads are blank.",
        "",
        *([f"**Syntactic roles skipped**: {s['syntax_skipped']}.", ""] if s.get("syntax_skipped") else []),
        "## Roles found",
        "",
        *_table(
            ["role", "heads", "rule"],
            [[r, counts.get(r, 0), DEFINITIONS[r].format(**s)] for r in (*TOKEN_ROLES, *SIEVE_ROLES, "any")],
        ),
        "",
        f"Sieve tests: one-sided {s['sieve_test']}-test of H0 mean bias ≤ τ = {s['sieve_tau']}, "
        f"{s['sieve_correction']} correction over {result['sieve']['tests']} head × role tests, "
        f"α = {s['sieve_alpha']}.",
        "",
        "![roles](roles.png)",
        "",
        "### Overlaps (roles are not exclusive)",
        "",
    ]
    for group, ov in result["overlaps"].items():
        combos = ", ".join(f"{k}: {v}" for k, v in ov["combinations"].items())
        pairs = ", ".join(f"{k}: {v}" for k, v in ov["pairs"].items())
        lines += [f"- {group} — combinations: {combos}", f"- {group} — pairs: {pairs}"]
    return lines


def _shares(result: dict, key: str) -> str:
    return ", ".join(f"{h} {v:.2f}" for h, v in _top(result["maps"][key]))


def _attention_shares(result: dict) -> list[str]:
    """Positional heads (or the highest shares), rare-word heads and delimiter attention."""
    lines = ["", "## Positional heads", ""]
    pos = result["positional_heads"]
    if pos:
        lines += _table(["head", "offset", "share"], [[p["head"], p["offset"], p["share"]] for p in pos])
    else:
        lines += ["None at the threshold. Highest shares: " + _shares(result, "positional_share")]
    return lines + [
        "",
        "## Rare-word heads",
        "",
        f"Sentences with a rare piece: {result['rare_word']['sentences']}. "
        "Highest shares of queries attending to the rarest piece: " + _shares(result, "rare_share"),
        "",
        "## Delimiter attention (Clark)",
        "",
        "Highest total share on [CLS]/[SEP]/punctuation: " + _shares(result, "delimiter_share"),
        "",
    ]


def _relations(result: dict) -> list[str]:
    """Per syntactic relation, the best head against the most-frequent-offset baseline."""
    s = result["settings"]
    lines = ["## Syntactic relations (best head vs most-frequent-offset baseline)", ""]
    if not result["relations"]:
        why = f"syntax skipped: {s['syntax_skipped']}" if s.get("syntax_skipped") else "syntax ran"
        return lines + [f"No relation had ≥ {s['min_relation_count']} instances ({why})."]
    header = ["relation", "direction", "n", "baseline (offset)", "best head", "accuracy", "gain", "syntactic heads"]
    rows = [
        [r["relation"], r["direction"], r["count"], f"{r['baseline']:.3f} ({r['baseline_offset']:+d})", r["best_head"],
         r["best_accuracy"], r["gain"], len(r["syntactic_heads"])]
        for r in result["relations"]
    ]  # fmt: skip
    return lines + _table(header, rows)


def _sieve_and_maps(result: dict) -> list[str]:
    """Sieve bias per role, the layer × head maps, and the criterion scores' correlation with confidence."""
    counts = result["counts"]
    rows = [
        [role, info["sequences"], counts.get(f"sieve_{role}", 0),
         ", ".join(f"{h} {v:.1f}" for h, v in _top(info["mean_bias"], 3))]
        for role, info in result["sieve"]["roles"].items()
    ]  # fmt: skip
    lines = [
        "",
        "## Sieve bias (Pande)",
        "",
        *_table(["role", "sequences", "heads assigned", "top heads by mean bias"], rows),
    ]
    lines += ["", "![sieve](sieve.png)", "", "## Layer × head maps", "", "![maps](maps.png)", ""]
    if result.get("score_correlations"):
        lines += [
            "Spearman ρ of criterion scores vs confidence: "
            + ", ".join(f"{k} {_fmt(v['spearman_vs_confidence'])}" for k, v in result["score_correlations"].items()),
            "",
        ]
    return lines


def _distances(result: dict) -> list[str]:
    """The Jensen–Shannon clustering of heads."""
    return [
        "## Head distances (Jensen–Shannon, Clark)",
        "",
        _clusters_line(result["js"]),
        "",
        "![js](js_clustering.png)",
        "",
    ]


def _layer_means(result: dict) -> list[str]:
    rows = []
    for layer in range(result["layers"]):
        row = [layer]
        for key in ("cls_share", "sep_share", "punct_share"):
            vals = [v for v in result["maps"][key][layer] if v is not None]
            row.append(sum(vals) / len(vals) if vals else None)
        rows.append(row)
    return ["Mean attention share per layer:", "", *_table(["layer", "[CLS]", "[SEP]", "punctuation"], rows), ""]


def _clusters_line(js: dict) -> str:
    groups: dict[int, list[str]] = {}
    for name, label in zip(js["heads"], js["clusters"], strict=True):
        groups.setdefault(label, []).append(name)
    return "Clusters (average linkage on √JSD): " + "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(groups.items()))


def _json_safe(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def write_analysis(result: dict, out_dir: str | Path) -> list[Path]:
    """Write analysis.json, analysis.md and the PNG figures as the directory `out_dir`; returns the paths written.

    The files are written into a temporary sibling directory that then replaces `out_dir` as a whole
    (`compressor.core.atomic.directory`), so a killed process never leaves a half-written analysis. `out_dir` must be
    missing, empty, or hold only an earlier analysis's files (`ANALYSIS_FILES`); anything else, a user's file beside
    an earlier analysis included, is refused with a `UserError` rather than deleted.
    """
    out = atomic.check_replaceable(os.path.abspath(out_dir), ANALYSIS_FILES, "analysis output")
    with atomic.directory(out) as tmp:
        written = _write_files(result, tmp)
    return [out / p.name for p in written]


def _write_files(result: dict, out: Path) -> list[Path]:
    paths = [out / "analysis.json", out / "analysis.md"]
    paths[0].write_text(json.dumps(_json_safe(result), indent=1))
    paths[1].write_text(render_markdown(result))
    maps = result["maps"]
    token_maps = {k: maps[k] for k in MAP_ORDER if k in maps}
    token_maps.update({k: v for k, v in maps.items() if k.startswith("score_")})
    paths.append(plots.heatmaps(token_maps, out / "maps.png"))
    paths.append(plots.heatmaps({k: v for k, v in maps.items() if k.startswith("sieve_bias_")}, out / "sieve.png", 2))
    paths.append(plots.role_grid(result["roles"], result["present"], out / "roles.png"))
    paths.append(plots.js_clustering(result["js"], out / "js_clustering.png"))
    if result.get("pruning_steps"):
        paths.append(
            plots.pruning_roles(result["pruning_steps"], [*SPECIALISED, "delimiter"], out / "pruning_roles.png")
        )
    return paths
