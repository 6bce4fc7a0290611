"""The wheel carries everything a run needs: built from the repository, installed into a fresh venv outside it, then
`compressor init`, `validate` and a tiny `run` from another directory use only what the wheel installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import tiny_recipe

ROOT = Path(__file__).resolve().parents[1]


def build_wheel(dest: Path) -> Path:
    """`pip wheel .` of a copy of the repository (setuptools builds in the tree) into `dest`; no dependencies, and
    this interpreter's setuptools builds it."""
    source = dest / "src"
    skip = shutil.ignore_patterns(".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__", ".*cache")
    shutil.copytree(ROOT, source, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = dest.glob("compressor-*.whl")
    return wheel


def venv_with(wheel: Path, path: Path) -> Path:
    """A fresh venv at `path` with `wheel` installed and this interpreter's installed libraries visible (a plain
    path line, so no editable install of compressor comes with them): nothing is downloaded. `--ignore-installed`:
    a compressor visible through that line is neither reused nor touched. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=300)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True
    ).stdout.strip()
    (Path(purelib) / "_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return python


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_repository(tmp_path, tiny_model_dir, tiny_csv):
    wheel = build_wheel(tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in (
        "compressor/surgery/portable.py",  # copied into every saved model as modeling_compressor.py
        "compressor/sources/metrics/accuracy/accuracy.py",
        "compressor/sources/metrics/f1/f1.py",
        "compressor/recipe/template.py",  # `compressor init`'s starter recipe
    ):
        assert shipped in names, shipped
    python = venv_with(wheel, tmp_path / "venv")
    script = tmp_path / "venv" / "bin" / "compressor"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"COMPRESSOR_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([script, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)

    where = subprocess.run([python, "-c", "import compressor; print(compressor.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where.stdout + where.stderr
    assert cli("--version").stdout.startswith("compressor ")
    assert cli("init", "--model", str(tiny_model_dir), "--data", str(tiny_csv), "starter.yaml").returncode == 0
    assert cli("validate", "starter.yaml").returncode == 0
    recipe = tiny_recipe(tiny_model_dir, tiny_csv, Path("runs/tiny"), **{"export": {"variants": ["fp32"]}})
    (elsewhere / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    result = cli("run", "tiny.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    out = elsewhere / "runs" / "tiny"
    for produced in ("report.json", "model/modeling_compressor.py", "model/model.safetensors", "onnx/fp32/model.onnx"):
        assert (out / produced).exists(), produced
