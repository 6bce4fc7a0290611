"""The "before" arm of the `demo_skipnorm` experiment: a copy of an exported variant with each residual add +
LayerNorm fused back into ONNX Runtime's `SkipLayerNormalization`, as compressor's optimized and int8 graphs held it
until it undid the fusion (`compressor.deploy.graph.unfuse_skip_norms`, whose output is the pattern matched here).

A `LayerNormalization` over the last axis whose input is an `Add` read by nothing else becomes one
`SkipLayerNormalization(input, skip, gamma, beta[, bias])`: when that `Add` adds a constant (the projection's bias) to
another such `Add`, the inner one's operands are the input and skip. The variant's other files (config, tokenizer)
are copied beside the graph. Exits non-zero when nothing was fused (nothing to compare).

Usage: python benchmarks/skip_norms.py --variant runs/bench/demo_skipnorm/run/onnx/int8 \
    --out runs/bench/demo_skipnorm/fused
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's compressor, as the suite's other scripts

from compressor.deploy.exporters import CONTRIB_DOMAIN  # noqa: E402

FUSED_OP = "SkipLayerNormalization"


def _sole_add(name: str, producer: dict, readers: dict):
    """The `Add` node producing `name` when nothing else reads `name`, else None."""
    node = producer.get(name)
    return node if node is not None and node.op_type == "Add" and readers.get(name, 0) == 1 else None


def fuse_skip_norms(model) -> int:
    """Fuse each residual add (+ bias) + LayerNorm of `model` (an `onnx.ModelProto`) in place; returns how many."""
    from onnx import helper

    graph = model.graph
    constants = {t.name for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    for out in graph.output:
        readers[out.name] = readers.get(out.name, 0) + 1
    replace, drop = {}, set()
    for node in graph.node:
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        outer = _sole_add(node.input[0], producer, readers) if node.op_type == "LayerNormalization" else None
        if outer is None or axis != -1 or len(node.output) != 1:
            continue
        bias = next((x for x in outer.input if x in constants), None)
        inner = _sole_add(next((x for x in outer.input if x != bias), ""), producer, readers) if bias else None
        data, skip = (inner.input if inner is not None else outer.input)[:2]
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        inputs = [data, skip, *node.input[1:3], *([bias] if inner is not None else [])]
        replace[id(node)] = helper.make_node(FUSED_OP, inputs, list(node.output), name=f"{node.name}_skip",
                                             domain=CONTRIB_DOMAIN, epsilon=epsilon)  # fmt: skip
        drop |= {id(outer), *([id(inner)] if inner is not None else [])}
    nodes = [replace.get(id(n), n) for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(nodes)
    if replace and not any(o.domain == CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return len(replace)


def write_fused(variant: Path, out: Path) -> int:
    """`variant`'s directory copied to `out`, its `model.onnx` with `fuse_skip_norms` applied; returns how many
    (none: `out` is left as it was)."""
    import onnx

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(variant, tmp)
    model = onnx.load(str(tmp / "model.onnx"))
    fused = fuse_skip_norms(model)
    if not fused:  # nothing written: no done-marker for the suite's runner to skip this step on
        shutil.rmtree(tmp)
        return 0
    onnx.save(model, str(tmp / "model.onnx"))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return fused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", type=Path, required=True, help="an exported ONNX variant directory")
    parser.add_argument("--out", type=Path, required=True, help="where the copy with the fusion goes")
    args = parser.parse_args(argv)
    if not (args.variant / "model.onnx").is_file():
        raise SystemExit(f"--variant: '{args.variant}' has no model.onnx; expected an exported ONNX variant directory")
    fused = write_fused(args.variant, args.out)
    print(f"{FUSED_OP} x{fused} in {args.out / 'model.onnx'}")
    return 0 if fused else 1


if __name__ == "__main__":
    sys.exit(main())
