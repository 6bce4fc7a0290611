"""Does a pruned model load where users are? Every route × the transformers that saved it × architecture.

`save DIR` (run in any environment with compressor importable, transformers 4.57 included) writes, per supported
architecture, a tiny pruned classifier with uneven heads, uneven FFN widths, a layer without heads and a layer
removed whole, plus the in-memory pruned model's logits on a padded batch (`expected.npy`) and the transformers
version that saved it. `load DIR...` (run under the stack being checked) loads every saved directory through every
route and prints max |Δlogit| against the saved logits:

- `load_pruned` (compressor, SDPA and eager attention),
- `trust_remote_code` (plain transformers with the shipped `modeling_compressor.py`; directories saved by compressor
  under 4.57 have none, so that route is "n/a" for them),
- `onnx` (compressor's export, fp32 graph, run in a bare `onnxruntime.InferenceSession`).

Usage:
  python benchmarks/load_routes.py save /tmp/routes-5        # under transformers 5
  <4.57 env>/python benchmarks/load_routes.py save /tmp/routes-4.57   # from a checkout of the 4.57-era code
  python benchmarks/load_routes.py load /tmp/routes-5 /tmp/routes-4.57 --out benchmarks/results/load_routes.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HEADS = {0: [1, 3], 1: [0, 1, 2, 3], 2: [0], 3: [0, 1, 2, 3]}  # uneven; layer 1 empty; layer 3 removed below
NEURONS = {0: list(range(0, 67, 3)), 2: list(range(20)), 3: list(range(67))}  # tiny FFN width is 67


def batch() -> dict[str, torch.Tensor]:
    from compressor.testing import tiny_batch

    out = tiny_batch(batch=5, seq=13, seed=11)
    out.pop("labels")
    return out


def save(root: Path) -> None:
    """One pruned tiny model per architecture, with its expected logits and the saving transformers version."""
    import transformers

    from compressor.surgery.checkpoint import save_pruned
    from compressor.surgery.slicing import pruned_copy
    from compressor.testing import ARCHS, tiny_model

    for arch in ARCHS:
        model = pruned_copy(tiny_model(arch, layers=4), HEADS, NEURONS).eval()
        with torch.no_grad():
            logits = model(**batch()).logits.numpy()
        out = save_pruned(model, root / arch)
        np.save(out / "expected.npy", logits)
        (out / "saved_with.json").write_text(json.dumps({"transformers": transformers.__version__, "arch": arch}))
        print(f"saved {arch} with transformers {transformers.__version__}")


def _delta(logits, expected: np.ndarray) -> float:
    got = logits.detach().numpy() if isinstance(logits, torch.Tensor) else np.asarray(logits)
    return float(np.abs(got - expected).max())


def routes(model_dir: Path, expected: np.ndarray) -> dict[str, str | float]:
    """Max |Δlogit| per route, or the one-line reason it did not load."""
    from transformers import AutoModelForSequenceClassification

    from compressor.deploy.export import export_fp32
    from compressor.deploy.inference import OnnxClassifier
    from compressor.surgery.checkpoint import REMOTE_MODULE, load_pruned

    inputs, out = batch(), {}
    for attention in ("sdpa", "eager"):
        with torch.no_grad():
            out[f"load_pruned ({attention})"] = _delta(
                load_pruned(model_dir, attention).eval()(**inputs).logits, expected
            )
    if (model_dir / f"{REMOTE_MODULE}.py").exists():
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True).eval()
        with torch.no_grad():
            out["trust_remote_code"] = _delta(model(**inputs).logits, expected)
    else:
        out["trust_remote_code"] = "n/a (saved without the shipped code)"
    with tempfile.TemporaryDirectory() as tmp:
        export_fp32(load_pruned(model_dir, "eager"), Path(tmp))
        out["onnx fp32 (bare session)"] = _delta(OnnxClassifier(Path(tmp))(inputs), expected)
    return out


def load(roots: list[Path], out_file: Path | None) -> None:
    import transformers

    rows = []
    for root in roots:
        for model_dir in sorted(p for p in root.iterdir() if (p / "expected.npy").exists()):
            saved = json.loads((model_dir / "saved_with.json").read_text())
            for route, delta in routes(model_dir, np.load(model_dir / "expected.npy")).items():
                rows.append({"saved_with": saved["transformers"], "loaded_with": transformers.__version__,
                             "arch": saved["arch"], "route": route, "max_abs_diff": delta})  # fmt: skip
    print(f"{'saved with':>10} {'loaded with':>11} {'arch':<12} {'route':<26} max |Δlogit|")
    for r in rows:
        value = f"{r['max_abs_diff']:.2e}" if isinstance(r["max_abs_diff"], float) else r["max_abs_diff"]
        print(f"{r['saved_with']:>10} {r['loaded_with']:>11} {r['arch']:<12} {r['route']:<26} {value}")
    worst = max(r["max_abs_diff"] for r in rows if isinstance(r["max_abs_diff"], float))
    print(f"worst: {worst:.2e} over {len(rows)} loads")
    if out_file is not None:
        out_file.write_text(json.dumps({"rows": rows, "worst": worst}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["save", "load"])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="load: write the rows as JSON here")
    args = parser.parse_args()
    if args.mode == "save":
        save(args.dirs[0])
    else:
        load(args.dirs, args.out)


if __name__ == "__main__":
    sys.exit(main())
