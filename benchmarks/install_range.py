"""Does `pip install compressor` leave a user's other tools alone? A dry-run install of compressor's wheel into venvs
that hold those tools, checked for any installed version it would change.

Environments (each a fresh venv, torch pinned to 2.13.0, the CPU wheel):
- `optimum-intel`: optimum-intel 2.2 with the OpenVINO extra (the x86 serving route; it requires transformers < 5.6,
  so pip resolves transformers 5.5.x);
- `sentence-transformers`: sentence-transformers 6.x with the newest transformers 5.x the registry serves.

For each, `pip install --dry-run --report` of the compressor wheel: the packages it would install, and among them
those already installed at another version (a change to the user's stack). Prints one line per environment and writes
benchmarks/results/install_range.json. Needs registry access (the venvs are built from it, ~2 GB each).

Usage: python benchmarks/install_range.py [--venvs DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from compressor.core.compat import REQUIRED
from compressor.core.machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "install_range.json"
TORCH = "torch==2.13.0"  # the CPU wheel; an unpinned torch pulls a multi-GB CUDA build
ENVIRONMENTS = {
    "optimum-intel": ["optimum-intel[openvino]==2.2.*"],
    "sentence-transformers": ["sentence-transformers>=6,<7", "transformers>=5,<6"],
}
WATCHED = ("transformers", "torch", "tokenizers", "huggingface-hub", "accelerate", "onnxruntime", "numpy")


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, check=True, timeout=3600)


def installed(python: Path) -> dict[str, str]:
    """{normalised name: version} of everything installed in the venv of `python`."""
    rows = json.loads(pip(python, "list", "--format", "json").stdout)
    return {row["name"].lower().replace("_", "-"): row["version"] for row in rows}


def build_wheel(dest: Path) -> Path:
    pip(Path(sys.executable), "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(ROOT))
    (wheel,) = dest.glob("compressor-*.whl")
    return wheel


def check(name: str, packages: list[str], wheel: Path, venvs: Path) -> dict:
    """Build the environment `name` with `packages` (and torch pinned), then dry-run compressor's wheel into it."""
    venv = venvs / name
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip(python, "install", "-q", TORCH, *packages)
    before = installed(python)
    report_path = venv / "dry_run.json"
    pip(python, "install", "--dry-run", "--quiet", "--report", str(report_path), str(wheel))
    plan = json.loads(report_path.read_text())["install"]
    would = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in plan
        if item["metadata"]["name"].lower() != "compressor"
    }
    changed = {pkg: {"installed": before[pkg], "would_install": v} for pkg, v in would.items() if pkg in before}
    return {
        "environment": packages,
        "installed": {pkg: before.get(pkg) for pkg in WATCHED},
        "would_add": {pkg: v for pkg, v in would.items() if pkg not in before},
        "would_change": changed,
        "unchanged": not changed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venvs", type=Path, default=None, help="where the venvs are built (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        venvs = args.venvs or Path(tmp)
        wheel = build_wheel(Path(tmp) / "dist")
        results = {}
        for name, packages in ENVIRONMENTS.items():
            results[name] = check(name, packages, wheel, venvs)
            r = results[name]
            verdict = "changes nothing" if r["unchanged"] else f"would change {r['would_change']}"
            print(f"{name}: transformers {r['installed']['transformers']}, torch {r['installed']['torch']}: "
                  f"compressor {verdict}; adds {sorted(r['would_add'])}")  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    record = {"commit": commit, "declared": REQUIRED, "machine": machine_info(), "environments": results}
    record["what_else_ran"] = "other jobs may share the machine; nothing here is timed"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
