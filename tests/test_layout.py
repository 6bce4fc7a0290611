"""The stage rule, checked: packages import downward only, the recipe schema imports nothing of ours but `core`, no
module-level import cycle anywhere, small modules, few top-level modules, one declaration module per architecture, and
no stage outside the architecture package reading an architecture's quirks."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "compressor"
LINT = Path(sys.executable).parent / "lint-imports"
STAGES = {"core", "recipe", "surgery", "sources", "deploy", "pruning", "recovery", "bench", "report", "pipeline"}


def lint(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the package under `root`, with the contracts in this repository's pyproject.toml."""
    return subprocess.run(
        [str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": str(LINT.parent)},
        capture_output=True,
        text=True,
    )


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), i.e. every import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_import_contracts_hold() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("core/atomic.py", "from compressor.report import summary  # upward"),
        ("recipe/schema.py", "from compressor.surgery import arch  # the schema reaching into a stage"),
        ("pruning/masking.py", "from compressor.recovery import train  # upward, and a cycle"),
    ],
)
def test_the_contracts_fail_on_an_upward_import(tmp_path, module, line) -> None:
    shutil.copytree(PACKAGE, tmp_path / "compressor", ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "compressor" / module
    planted.write_text(planted.read_text() + f"\n{line}\n")
    done = lint(tmp_path)
    assert done.returncode != 0 and "BROKEN" in done.stdout, done.stdout


def test_no_module_level_import_cycle() -> None:
    assert cycles(grimp.build_graph("compressor")) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc import b\n")
    (pkg / "b.py").write_text("from cyc import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles(grimp.build_graph("cyc")) == [["cyc.a", "cyc.b"]]


def test_modules_are_small_and_the_top_level_is_stages() -> None:
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > 420} == {}
    top = {p.name for p in PACKAGE.glob("*.py")}
    assert len(top) <= 6, top
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert STAGES <= packages, STAGES - packages


def test_every_stage_package_says_what_it_owns_and_may_import() -> None:
    import importlib

    for stage in STAGES:
        doc = importlib.import_module(f"compressor.{stage}").__doc__ or ""
        assert len(doc.split()) >= 15, f"compressor.{stage} needs an __init__ docstring"
        assert "import" in doc, f"compressor.{stage}'s docstring says nothing of what it may import"


def test_each_architecture_is_declared_once_in_its_own_module() -> None:
    from compressor.surgery.arch import ARCHITECTURES, ArchSpec
    from compressor.surgery.arch.spec import register
    from compressor.testing import ARCHS

    assert set(ARCHS) <= set(ARCHITECTURES), "every tested architecture is declared"
    declared_in = {spec.__module__ for spec in ARCHITECTURES.values()}
    assert declared_in == {"compressor.surgery.arch.spec"}  # a frozen dataclass; the modules below hold them
    modules = {p.stem for p in (PACKAGE / "surgery" / "arch").glob("*.py")} - {"__init__", "spec", "shape", "parts"}
    assert modules == {"bert", "distilbert", "deberta_v2", "modernbert", "mpnet"}
    with pytest.raises(ValueError, match="already declared"):
        register(ARCHITECTURES["bert"], "bert")
    bert = ARCHITECTURES["bert"]
    with pytest.raises(ValueError, match="ArchSpec.query: expected a dotted attribute path"):
        register(replace(bert, attn=replace(bert.attn, query="q lin")), "new-architecture")
    with pytest.raises(ValueError, match="ArchSpec.ffn_norm: expected a dotted path or None"):
        register(replace(bert, norms=replace(bert.norms, ffn_norm="output LayerNorm")), "new-architecture")
    assert "new-architecture" not in ARCHITECTURES
    assert isinstance(bert, ArchSpec)


# What used to be flags on `ArchSpec`, read by slicing, cost, rescale, attribution and export: an architecture's quirks
# are now methods its module overrides (or facts the spec answers questions about), read only inside the package.
QUIRKS = frozenset(
    "fused_qkv gated_ffn pre_norm qkv_blocks ffn_in_blocks head_rows layer_returns_tuple shared_bias padding_positions "
    "token_type_ids ort_fuses_attention extra_head_flops encoder_side_module attention_norm ffn_norm".split()
)
QUIRK_READERS = ("surgery/arch/", "surgery/portable.py")  # the architecture package, and the shipped file's own copy


def quirk_reads(source: str) -> list[str]:
    """`name@line` for every read of a quirk in `source`, in line order: an attribute of that name on anything, or
    `getattr` of it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = node.attr if isinstance(node, ast.Attribute) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = next((a.value for a in node.args[1:2] if isinstance(a, ast.Constant)), None)
        if name in QUIRKS:
            found.append((node.lineno, name))
    return [f"{name}@{line}" for line, name in sorted(found)]


def test_no_stage_outside_the_architecture_package_reads_a_quirk() -> None:
    """Slicing, cost, rescale, attribution and export ask the architecture's spec and parts (methods); a stage that
    tested `spec.pre_norm` or `spec.fused_qkv` itself would be one more place to change for the next architecture or
    unit kind."""
    reads = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        found = [] if relative.startswith(QUIRK_READERS) else quirk_reads(path.read_text())
        if found:
            reads[relative] = found
    assert reads == {}


def test_the_quirk_finder_finds_a_read() -> None:
    old = "residual = attention if spec.pre_norm else x\nblocks = getattr(spec, 'qkv_blocks')\nspec.ffn.in_rows(i, 2)"
    assert quirk_reads(old) == ["pre_norm@1", "qkv_blocks@2"]
