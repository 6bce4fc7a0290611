"""The supported version range (declared once, checked at run time), `compressor --version` and `compressor init`."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import tomllib
from conftest import cli
from pydantic import BaseModel

from compressor.core import compat
from compressor.recipe import Recipe, load_recipe
from compressor.recipe.template import _section_type

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, cwd: Path, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess:
    """`python -m compressor ARGS` in a fresh process with `pythonpath` in front of the repository."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*pythonpath, ROOT]))}
    return subprocess.run(
        [sys.executable, "-m", "compressor", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _fake_distribution(root: Path, name: str, version_: str) -> Path:
    """A directory whose only content is the metadata of `name` at `version_` (what `pip show` would read)."""
    info = root / f"{name}-{version_}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version_}\n")
    return root


def test_pyproject_declares_the_compat_range():
    """pyproject.toml's dependencies carry exactly `compat.REQUIRED`'s specifiers (one source of truth, checked)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {}
    for dep in deps:
        name = dep.split(";")[0]
        for i, char in enumerate(name):
            if char in "<>=!~ ":
                declared[name[:i]] = name[i:].replace(" ", "")
                break
    for package, spec in compat.REQUIRED.items():
        assert declared.get(package) == spec.replace(" ", ""), (package, declared.get(package), spec)


def test_floor_requirements_pin_the_declared_floors():
    """requirements-floor.txt (what `make test-compat` installs) pins each package of `compat.REQUIRED` at its floor."""
    pins = {}
    for line in (ROOT / "requirements-floor.txt").read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if "==" in requirement:
            name, _, pinned = requirement.partition("==")
            pins[name.strip()] = pinned.strip()
    for package, spec in compat.REQUIRED.items():
        floor = spec.split(",")[0].removeprefix(">=")
        assert pins[package].startswith(floor), (package, pins[package], spec)


def test_installed_stack_is_supported():
    assert compat.outside(tuple(compat.REQUIRED)) == {}
    compat.require_supported()


def test_unsupported_transformers_is_one_line_exit_2(tmp_path):
    """An old transformers found at run time: one line naming the installed version and the supported range, exit 2
    and no traceback; `--version` still answers and flags it."""
    fake = _fake_distribution(tmp_path / "site", "transformers", "4.57.6")
    (tmp_path / "r.yaml").write_text("name: x\n")
    result = _cli("validate", "r.yaml", cwd=tmp_path, pythonpath=[fake])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "transformers 4.57.6 is installed" in lines[0]
    assert f"transformers{compat.REQUIRED['transformers']}" in lines[0]
    shown = _cli("--version", cwd=tmp_path, pythonpath=[fake])
    assert shown.returncode == 0, shown.stderr
    assert "transformers 4.57.6" in shown.stdout and "UNSUPPORTED" in shown.stdout


def test_unsupported_torch_refuses_the_python_api(tmp_path):
    fake = _fake_distribution(tmp_path / "site", "torch", "2.1.0")
    code = "import compressor\ntry:\n    compressor.prune\nexcept compressor._compat.UnsupportedVersionError as e:\n"
    code += "    print('refused:', e)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused: torch 2.1.0 is installed; compressor supports torch>=")


def test_allow_unsupported_warns_instead_of_refusing(monkeypatch):
    """COMPRESSOR_ALLOW_UNSUPPORTED=1 turns the refusal of an installed-but-untested version into a warning with the
    same text; a missing library is still refused."""
    monkeypatch.setattr(compat, "installed", lambda name: {"torch": "2.11.0"}.get(name, "99.0"))
    with pytest.raises(compat.UnsupportedVersionError, match="^torch 2.11.0 is installed; compressor supports torch>="):
        compat.require_supported()
    monkeypatch.setenv(compat.ALLOW_ENV, "1")
    with pytest.warns(UserWarning, match=r"^torch 2.11.0 is installed; .* running anyway"):
        compat.require_supported()
    monkeypatch.setattr(compat, "installed", lambda name: None if name == "torch" else "99.0")
    with pytest.raises(compat.UnsupportedVersionError, match="^torch is not installed"):
        compat.require_supported()


def test_version_names_the_libraries_in_use(tmp_path):
    result = cli("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    from compressor import __version__

    assert lines[0] == f"compressor {__version__}"
    for package in ("transformers", "torch", "onnxruntime", "accelerate"):
        assert any(line.startswith(f"{package} {version(package)} (supported ") for line in lines), result.stdout
    assert "UNSUPPORTED" not in result.stdout


def _fields(model: type[BaseModel], path: str = ""):
    for name, info in model.model_fields.items():
        yield f"{path}{name}", info, _section_type(info)
        if (section := _section_type(info)) is not None:
            yield from _fields(section, f"{path}{name}.")


def test_starter_recipe_comments_every_field_and_loads(tmp_path):
    """`compressor init` writes every field of the schema (sections that are off, commented out), each under a
    comment of its own, and the file loads as written with the given model and data."""
    for path, info, section in _fields(Recipe):
        assert info.description or (section and section.__doc__), f"recipe field {path} has no description"
    result = cli("init", "--model", "org/my-model", "--data", "reviews.csv", "starter.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "starter.yaml").read_text()
    recipe = load_recipe(tmp_path / "starter.yaml")
    assert (recipe.model.source, recipe.data.source, recipe.output_dir) == (
        "org/my-model",
        "reviews.csv",
        "runs/starter",
    )
    assert recipe.model_copy(update={"name": "run", "output_dir": "runs/out"}).prune == Recipe().prune
    keys = {line.lstrip(" #").split(":")[0] for line in text.splitlines() if ":" in line}
    for path, _, _ in _fields(Recipe):
        assert path.rsplit(".", 1)[-1] in keys, f"{path} missing from the starter recipe"
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith("#"):
            assert lines[i - 1].lstrip().startswith("#"), f"no comment above {line!r}"


@pytest.mark.parametrize("args", [["exists.yaml"], ["missing_dir/r.yaml"]])
def test_init_refuses_to_overwrite_or_write_nowhere(tmp_path, args):
    (tmp_path / "exists.yaml").write_text("keep: me\n")
    result = cli("init", *args, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("compressor: error: recipe:"), result.stderr
    assert (tmp_path / "exists.yaml").read_text() == "keep: me\n"
    assert not (tmp_path / "missing_dir").exists()


def test_traceable_masks_shims_only_the_releases_that_need_it_and_restores():
    """On the installed transformers: where it is in `MASK_LENGTH_BC` (the floor), the SDPA mask takes the query
    length as the 0-d tensor the TorchScript tracer hands it and builds the mask the int length builds; elsewhere the
    function is transformers' own. Either way it is transformers' own again on exit."""
    import torch
    from transformers import masking_utils

    original = masking_utils.sdpa_mask
    mapping = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    shimmed = compat._within(compat.installed("transformers"), compat.MASK_LENGTH_BC)
    padding = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    args = {"batch_size": 2, "kv_length": 4, "attention_mask": padding, "allow_is_bidirectional_skip": False,
            "mask_function": masking_utils.bidirectional_mask_function}  # fmt: skip
    with compat.traceable_masks():
        assert (masking_utils.sdpa_mask is not original) == shimmed and mapping["sdpa"] is masking_utils.sdpa_mask
        if shimmed:
            assert torch.equal(masking_utils.sdpa_mask(q_length=torch.tensor(4), **args), original(q_length=4, **args))
    assert masking_utils.sdpa_mask is original and mapping["sdpa"] is original


def test_scripted_helpers_are_traced_as_python_and_restored(monkeypatch):
    """A modeling module's `torch.jit.script`ed function (as transformers 5.5's DeBERTa-v2 has) is its Python source
    inside the block, so the tracer follows it instead of recording an ONNX `If`; it is the scripted one again on
    exit, and other names of the module are untouched."""
    import types

    import torch

    module = types.ModuleType("fake_modeling")

    def helper(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if x.size(0) > 1 else x

    module.helper, module.plain = torch.jit.script(helper), helper
    Layer = type("Layer", (torch.nn.Module,), {"__module__": "fake_modeling"})
    monkeypatch.setitem(sys.modules, "fake_modeling", module)
    scripted = module.helper
    with compat.traceable(torch.nn.Sequential(Layer())):
        assert module.helper is helper and module.plain is helper
    assert module.helper is scripted and module.plain is helper
