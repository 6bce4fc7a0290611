"""The "before" arm of the `demo_skipnorm` experiment: a copy of an exported variant with residual add + LayerNorm
fused into ONNX Runtime's `SkipLayerNormalization`, as ONNX Runtime's own fusion (on in a session with its default
options) writes it, and as compressor's optimized and int8 graphs held it until it undid the fusion
(`compressor.deploy.graph.unfuse_skip_norms`).

The graph is written by a session at `ORT_ENABLE_EXTENDED` (hardware-independent fusions only) with
`optimized_model_filepath`; the variant's other files (config, tokenizer) are copied beside it. Exits non-zero when
the written graph holds no `SkipLayerNormalization` (nothing to compare).

Usage: python benchmarks/skip_norms.py --variant runs/bench/demo_skipnorm/run/onnx/int8 \
    --out runs/bench/demo_skipnorm/fused
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

FUSED_OP = "SkipLayerNormalization"


def write_fused(variant: Path, out: Path) -> int:
    """`variant`'s directory copied to `out`, its `model.onnx` with ONNX Runtime's extended fusions applied; returns
    how many `SkipLayerNormalization` nodes the written graph holds."""
    import onnx
    import onnxruntime as ort

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(variant, tmp)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp / "model.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(variant / "model.onnx"), options, providers=["CPUExecutionProvider"])
    fused = sum(n.op_type == FUSED_OP for n in onnx.load(str(tmp / "model.onnx"), load_external_data=False).graph.node)
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
