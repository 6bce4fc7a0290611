"""Count how often `compressor run` climbs back to a higher stage, call by call (issue 59).

The stages import downward only (import-linter's layers in pyproject.toml), yet a lower module can still call back up
at run time: a callback passed down (the runner's member fine-tune handed to the members, then called from there), a
lazy import. Each Python call of a compressor function is paired with the nearest compressor frame that made it; the
call climbs when the callee's module sits above the caller's: in a higher stage layer, or in a module that imports
the caller's (directly or not, by grimp's import graph, the one import-linter reads). The count is of distinct call
edges (caller function → callee function), so a climb inside a loop counts once.

`python tests/stage_climbs.py` runs a tiny recipe through every stage (export and bench on) and prints each edge;
it imports `compressor` from `sys.path`, so `PYTHONPATH=<an older checkout> python -P tests/stage_climbs.py` measures
that commit the same way. A registry calling what registered with it (criteria, recovery steps, engines) counts too:
the count is a map of where control comes back up, not a score to drive to zero.
"""

from __future__ import annotations

import csv
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def stage_layers() -> dict[str, int]:
    """`{package: depth}` from the import-linter layers contract: 0 for the top (`cli`), one more per layer down;
    packages sharing a layer (`report | analysis`) share its depth."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return {name.strip(): depth for depth, layer in enumerate(contract["layers"]) for name in layer.split("|")}


def _module(code: CodeType, roots: tuple[str, ...]) -> str | None:
    """The compressor module a function's code is defined in (`compressor.pruning.units`), or None outside it."""
    path = code.co_filename
    root = next((r for r in roots if path.startswith(r)), None)
    if root is None:
        return None
    parts = path[len(root) :].removesuffix(".py").split("/")
    return ".".join(["compressor", *parts[: -1 if parts[-1] == "__init__" else None]])


def _above(callee: str, caller: str, layers: dict[str, int], graph) -> bool:
    """Whether module `callee` sits above module `caller`: a higher stage layer, or it imports `caller`."""
    stage = [layers.get(m.split(".")[1]) if m.count(".") else None for m in (callee, caller)]
    if None not in stage and stage[0] != stage[1]:
        return stage[0] < stage[1]
    return callee != caller and graph.chain_exists(importer=callee, imported=caller)


def count_climbs(run: Callable[[], object]) -> dict[tuple[str, str], int]:
    """`{(caller, callee): calls}` for every call during `run()` from a function of one stage to a function of a
    higher stage (named `stage.module:function`)."""
    import grimp

    import compressor

    layers, graph = stage_layers(), grimp.build_graph("compressor")
    roots = tuple(str(Path(p)) + "/" for p in compressor.__path__)
    edges: dict[tuple[str, str], int] = {}
    above: dict[tuple[str, str], bool] = {}

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or (callee := _module(frame.f_code, roots)) is None:
            return
        caller_frame = frame.f_back
        while caller_frame is not None and _module(caller_frame.f_code, roots) is None:
            caller_frame = caller_frame.f_back
        if caller_frame is None:
            return
        caller = _module(caller_frame.f_code, roots)
        if (callee, caller) not in above:
            above[callee, caller] = _above(callee, caller, layers, graph)
        if above[callee, caller]:
            edge = (f"{caller}:{caller_frame.f_code.co_qualname}", f"{callee}:{frame.f_code.co_qualname}")
            edges[edge] = edges.get(edge, 0) + 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return edges


def tiny_full_recipe(work: Path) -> dict:
    """A recipe for a tiny BERT on a small CSV that passes through every stage: scoring, two steps with their
    fine-tunes, surgery, export (fp32 and int8, gated), the bench and the report."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_rows, make_tokenizer_dir, tiny_recipe

    from compressor.testing import tiny_model

    model_dir = make_tokenizer_dir(work / "model")
    tiny_model("bert", layers=3, heads=4, head_size=8, randomized=False).save_pretrained(model_dir)
    data = work / "reviews.csv"
    with data.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(make_rows(300))
    bench = {"batch_sizes": [4], "seq_len": 16, "rounds": 1, "warmup": 0, "min_time_s": 0.01, "max_drop": None}
    return tiny_recipe(model_dir, data, work / "out", export={"variants": ["fp32", "int8"]}, bench=bench)


def main() -> None:
    from compressor.pipeline.runner import run_recipe
    from compressor.recipe import parse_recipe

    with tempfile.TemporaryDirectory() as tmp:
        recipe = parse_recipe(tiny_full_recipe(Path(tmp)))
        edges = count_climbs(lambda: run_recipe(recipe))
    for (caller, callee), calls in sorted(edges.items()):
        print(f"{caller} -> {callee}  ({calls} calls)")
    print(f"{len(edges)} distinct climbs, {sum(edges.values())} calls")


if __name__ == "__main__":
    main()
