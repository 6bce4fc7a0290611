"""One-off: the retired scripts' result files that back figures kept on docs/results.md, converted into the suite's
schema (`legacy: true`, the script named in provenance). Run once; removed in the next commit (git keeps it)."""

from __future__ import annotations

import json
import subprocess

from benchmarks.readers import bench_against_pruning, frontier_rows, peers_rows, versus_row
from benchmarks.schema import Provenance, Result, Row, write_result
from benchmarks.suite import RESULTS, load_experiments
from compressor.core.machine import int8_features

EXPS = load_experiments()


def _old(name: str) -> dict:
    """The retired file as committed (a converted result may already have taken its name)."""
    show = ["git", "show", f"HEAD:benchmarks/results/{name}"]
    return json.loads(subprocess.run(show, capture_output=True, text=True, check=True).stdout)


def _prov(d: dict, script: str | None, old: str, cache: str, seconds: float | None, **extra) -> Provenance:
    cpu = d["cpu"]
    features = d.get("cpu_int8_features") or (int8_features(cpu) if cpu.get("flags") else cpu.get("int8_features"))
    return Provenance(
        commit=(d.get("commit") or "")[:7] or None, cpu=" ".join(filter(None, [cpu["model"], cpu.get("generation")])),
        int8_features=features, cpu_identity=d.get("cpu_identity"), else_running=d["else_running"], cache=cache,
        seconds=seconds, script=script, note=f"was {old}, retired", **extra)  # fmt: skip


def _result(name: str, rows: list[Row], prov: Provenance) -> None:
    exp = EXPS[name]
    write_result(RESULTS / f"{name}.json", Result(experiment=name, figure=exp.figure, goal=exp.goal, legacy=True,
                                                  rows=rows, provenance=prov))  # fmt: skip


def demo_and_rescale() -> None:
    d = _old("every_cpu_zen3.json")
    after, repeats = d["demo_empty_cache"]["after"], d["demo_bench_repeats"]
    before = d["demo_empty_cache"]["before"]["seconds"]
    rows = [
        Row(label="run, wall, from an empty cache", value=round(after["seconds"]), seeds=[0], unit="s",
            goal="<= 600 s", met=False, detail=f"before the bench changes {before:.0f} s"),
        Row(label="bench share of the run", value=round(100 * after["bench_share"], 1), seeds=[0], unit="%",
            goal="<= 15 %", met=False),
        Row(label="recommended (onnx-int8) vs original, test", value=after["pruned_minus_original_test_points"],
            seeds=[0], n=1276, unit="points", goal=">= -0.5 points", met=True),
        Row(label="recommended (onnx-int8) speed-up over 3 benches", value=round(repeats["mean"], 2), seeds=[0], n=3,
            unit="x", goal="each within 5% of the mean", met=True,
            detail=", ".join(f"{v:.2f}x" for v in repeats["speedups_batch32"])),
    ]  # fmt: skip
    d["cpu"]["model"] = "AMD EPYC"
    note = "assembled by hand from `make demo` runs (issue 60)"
    prov = _prov(d, None, "every_cpu_zen3.json", "empty", after["seconds"])
    prov.commit, prov.note = after["commit"].split()[0], f"{note}; {prov.note}"
    _result("demo", rows, prov)
    resc = d["rescale_recipe"]
    rows = [
        bench_against_pruning({"bench": resc["bench_s"], "pruning steps": resc["pruning_s"]}, 0),
        Row(label=f"recommended ({resc['recommended']}) speed-up", value=round(resc["speedup"], 2), seeds=[0],
            unit="x"),
    ]  # fmt: skip
    prov = _prov(d, None, "every_cpu_zen3.json", "warm", None)
    prov.commit, prov.note = resc["commit"], f"{note}; {prov.note}"
    _result("rescale", rows, prov)


def mpnet() -> None:
    d = _old("mpnet_family_layerback_zen5.json")
    cache = "warm"
    prov = _prov(d, "mpnet_family.py", "mpnet_family_layerback_zen5.json", cache, d["wall"]["wall_s"])
    runtimes = EXPS["mpnet_family"].runtimes
    _result("mpnet_family", frontier_rows(d["frontier"], runtimes, 1276, 0), prov)
    _result("mpnet_vs_minilm", [versus_row(d["references"], "minilm-l6", "pytorch", 1276, 0)], prov)


def quantize_only() -> None:
    d = _old("openvino.json")
    int8 = [r for r in d["rows"] if r.get("int8")]
    rows = [r | {"runtime": "onnx-int8" if "ONNX" in r["runtime"] else "openvino-int8"} for r in int8]
    prov = _prov(d, "openvino.py", "openvino.json", "warm", None)
    _result("quantize_only", frontier_rows(rows, [], 1276, 0), prov)


def peers() -> None:
    d = _old("peers_mpnet.json")
    prov = _prov(d, "peers.py", "peers_mpnet.json", "warm", d["models"]["mpnet"].get("seconds"))
    _result("peers_mpnet", peers_rows(d["models"]["mpnet"]), prov)


if __name__ == "__main__":
    demo_and_rescale()
    mpnet()
    quantize_only()
    peers()
