"""Other libraries open what compressor ships: sentence-transformers' `CrossEncoder` a pruned saved model (a sequence
classifier is what a reranker is), and optimum-intel's `OVModelForSequenceClassification` the OpenVINO variants
(marker `optimum`: optimum-intel 2.2 requires transformers < 5.6, so on the pinned stack these are slow and build a
venv of their own from the registry; `make test-compat` runs them in the floor venv, which holds optimum-intel)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import NEGATIVE, POSITIVE, make_tokenizer_dir
from test_export import CHECK, int8_tol
from test_wheel import build_wheel
from transformers import AutoTokenizer

from compressor.core.compat import installed
from compressor.surgery.arch import arch_spec, present_heads, present_neurons
from compressor.surgery.checkpoint import save_pruned
from compressor.surgery.slicing import pruned_copy
from compressor.testing import ARCHS, tiny_batch, tiny_model

ROOT = Path(__file__).resolve().parents[1]
# Uneven per layer: heads 2, 4 and 3 of 4 left; layer 0 loses 3 FFN neurons, layer 1 ten, layer 2 one.
HEADS = {0: [1, 3], 2: [0]}
NEURONS = {0: [0, 2, 5], 1: list(range(10)), 2: [7]}
PAIRS = [
    ("the movie was good", "great plot and fun acting"),
    ("bad acting", "the story was dull and boring"),
    ("a lovely film", "superb"),
    ("weak", "the plot was really quite poor , but the acting was fine ."),
]


def pruned_saved(root: Path, arch: str, num_labels: int = 2) -> tuple[torch.nn.Module, object, Path]:
    """(model, tokenizer, saved directory) of a tiny classifier with heads and FFN neurons removed unevenly, saved as
    the pipeline saves a member; the tokenizer gives `token_type_ids` only to an architecture that takes them."""
    model = pruned_copy(tiny_model(arch, layers=3, heads=4, num_labels=num_labels), HEADS, NEURONS)
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer_dir(root / "tok"))
    if not arch_spec(model).takes_token_types(model.config):
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
    return model, tokenizer, save_pruned(model, root / f"{arch}-model", tokenizer)


@torch.no_grad()
def pair_logits(model: torch.nn.Module, model_dir: Path, pairs: list[tuple[str, str]]) -> torch.Tensor:
    """Our PyTorch model's logits on text pairs, tokenised as a cross-encoder tokenises them: by the tokenizer saved
    beside the model, as a client loads it (which inputs it gives, token types included, is then theirs)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    return model(**encoded).logits


# ------------------------------------------------------------------------------------------------ CrossEncoder


@pytest.mark.parametrize("arch", ARCHS)
def test_cross_encoder_opens_a_pruned_model_and_scores_as_pytorch(tmp_path, arch):
    """sentence-transformers loads the shipped modeling file (`trust_remote_code=True`) and its scores are our
    logits (two labels: no activation by default); without the modeling file it refuses the pruned shapes loudly
    instead of scoring with reinitialised weights."""
    from sentence_transformers import CrossEncoder

    model, _, model_dir = pruned_saved(tmp_path, arch)
    assert len(set(map(len, present_heads(model)))) > 1 and len(set(map(len, present_neurons(model)))) > 1
    encoder = CrossEncoder(str(model_dir), trust_remote_code=True, device="cpu")
    assert sum(p.numel() for p in encoder.model.parameters()) == sum(p.numel() for p in model.parameters())
    scores = encoder.predict(PAIRS, convert_to_tensor=True, batch_size=3)
    torch.testing.assert_close(scores, pair_logits(model, model_dir, PAIRS), atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        CrossEncoder(str(model_dir), device="cpu")


def test_a_pruned_reranker_ranks_documents_by_our_logits(tmp_path):
    """One label, as rerankers have: `CrossEncoder.rank` orders the documents by our logit and scores them with
    its default sigmoid."""
    from sentence_transformers import CrossEncoder

    model, _, model_dir = pruned_saved(tmp_path, "bert", num_labels=1)
    query, documents = "the movie was good", [b for _, b in PAIRS] + [" ".join(POSITIVE), " ".join(NEGATIVE)]
    logits = pair_logits(model, model_dir, [(query, d) for d in documents]).squeeze(-1)
    ranked = CrossEncoder(str(model_dir), trust_remote_code=True, device="cpu").rank(query, documents)
    assert [r["corpus_id"] for r in ranked] == logits.argsort(descending=True).tolist()
    scores = torch.tensor([float(r["score"]) for r in ranked])
    torch.testing.assert_close(scores, torch.sigmoid(logits.sort(descending=True).values), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------ optimum-intel

VENVS = "COMPRESSOR_CLIENT_VENVS"  # a directory keeping the client venvs between runs (else the session's tmp dir)
OPTIMUM_INTEL = "optimum-intel[openvino]==2.2.*"
PIP_TIMEOUT_S = 900
OPTIMUM_SCRIPT = """
import json, sys
import numpy as np, openvino, torch, transformers
from importlib.metadata import version
from optimum.intel import OVModelForSequenceClassification
from transformers import AutoTokenizer

dirs, pairs, ov_config, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
for name, path in dirs.items():
    tokenizer = AutoTokenizer.from_pretrained(path)
    encoded = tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    model = OVModelForSequenceClassification.from_pretrained(path, ov_config=ov_config)
    logits = model(**encoded).logits
    np.savez(f"{out}/{name}.npz", logits=np.asarray(logits), **{k: v.numpy() for k, v in encoded.items()})
print(json.dumps({p: version(p) for p in ("optimum-intel", "transformers", "torch", "openvino", "nncf")}))
"""


def pinned(package: str) -> str:
    """`package`'s line in requirements.txt (the tested stack), its comment cut off."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.split("==")[0].strip() == package:
            return line.split("#")[0].strip()
    raise AssertionError(f"requirements.txt pins no {package}")


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    """This interpreter's pip acting on the venv of `python` (one pip version for every venv)."""
    command = [sys.executable, "-m", "pip", "--python", str(python), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    assert result.returncode == 0, f"{' '.join(args[:2])}: {result.stderr[-3000:]}"
    return result


def versions(python: Path) -> dict[str, str]:
    """{name: version} of every distribution installed in the venv of `python`."""
    listed = json.loads(pip(python, "list", "--format=json").stdout)
    return {d["name"].lower().replace("_", "-"): d["version"] for d in listed}


def optimum_requirements() -> list[str]:
    """optimum-intel 2.2 with OpenVINO, beside torch as requirements.txt pins it (an unpinned torch pulls a CUDA
    build of ~5.5 GB on x86_64) and the openvino release this interpreter runs, so that both sides of the
    comparison compile the IR with one OpenVINO."""
    return [OPTIMUM_INTEL, pinned("torch"), f"openvino=={version('openvino')}"]


def build_optimum_venv(path: Path, requirements: list[str]) -> None:
    """A venv at `path` with `requirements` from the registry.

    optimum-intel requires torchvision; where torch is the CPU build, the torchvision pip finds may be a CUDA build
    that cannot load beside it (its operators are missing at import), and a torchvision that fails to import breaks
    `import optimum.intel` (transformers imports it for its processors). Nothing of a text classifier uses it, so
    such a torchvision is uninstalled: the venv is then what a user with a working torch stack has."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=300)
    python = path / "bin" / "python"
    pip(python, "install", "-q", *requirements)
    if subprocess.run([python, "-c", "import torchvision"], capture_output=True, timeout=300).returncode:
        pip(python, "uninstall", "-y", "-q", "torchvision")


def optimum_here() -> bool:
    """Whether this interpreter holds optimum-intel 2.2 (the floor venv of `make test-compat` does)."""
    return (installed("optimum-intel") or "").startswith("2.2.")


@pytest.fixture(scope="module")
def optimum_venv(tmp_path_factory) -> Path:
    """The python of an environment holding optimum-intel 2.2: this interpreter where it holds it (the floor venv),
    else a venv of optimum-intel alone, built once per set of requirements under $COMPRESSOR_CLIENT_VENVS (kept
    between runs) or the session's tmp dir. The tests never install into it."""
    if optimum_here():
        return Path(sys.executable)
    requirements = optimum_requirements()
    key = hashlib.sha256(json.dumps([sys.version, *requirements]).encode()).hexdigest()[:12]
    root = Path(os.environ[VENVS]) if os.environ.get(VENVS) else tmp_path_factory.mktemp("client-venvs")
    path = root / f"optimum-intel-{key}"
    if not (path / "bin" / "python").exists():
        building = root / f".building-{key}-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        build_optimum_venv(building, requirements)
        building.rename(path)  # a venv half built by an interrupted run is never taken for a finished one
    return path / "bin" / "python"


def changed_by_installing(python: Path, wheel: Path, workdir: Path) -> dict[str, str]:
    """{package: 'installed -> wanted'} for every installed package whose version pip would change to install
    `wheel` (with its dependencies) into the environment of `python`, with every installed version given to pip as a
    constraint (`pip freeze` as `-c`), so that the resolver weighs what is there; a dry run, nothing is written.

    Without the constraints pip resolves compressor's tree alone: in a venv of optimum-intel 2.2 without `datasets`,
    it takes the newest datasets, which needs huggingface-hub >= 1.31 where optimum-intel caps it below 1.22, and
    moves it (pip only warns afterwards). docs/versions.md says so."""
    before = versions(python)
    frozen = [line for line in pip(python, "freeze").stdout.splitlines() if not line.lower().startswith("compressor")]
    constraints = workdir / "installed.txt"
    constraints.write_text("\n".join(line for line in frozen if "==" in line) + "\n")
    args = ("install", "--dry-run", "--quiet", "--report", "-", "-c", str(constraints), str(wheel))
    report = json.loads(pip(python, *args).stdout)
    wanted = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}
    return {name: f"{before[name]} -> {v}" for name, v in wanted.items() if name in before and name != "compressor"
            and before[name] != v}  # fmt: skip


@pytest.mark.slow
@pytest.mark.optimum
def test_installing_the_wheel_beside_optimum_intel_moves_no_installed_version(request, tmp_path, optimum_venv):
    """A user who serves models with optimum-intel 2.2 adds compressor: with what is installed kept (as constraints),
    pip resolves it, and may add packages but changes none (it fails to resolve where the range excludes the stack).

    It holds in the floor venv (optimum-intel resolved with compressor's floors). In a venv of optimum-intel alone it
    does not: torch brings fsspec 2026.9, every datasets release compressor admits either caps fsspec below that (5.0,
    5.1) or needs huggingface-hub >= 1.31 (5.2), which optimum-intel caps below 1.22; flagged when that is gone."""
    if not optimum_here():
        reason = "datasets cannot join a venv of optimum-intel alone without moving fsspec or huggingface-hub"
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    assert versions(optimum_venv)["optimum-intel"].startswith("2.2.")
    moved = changed_by_installing(optimum_venv, build_wheel(tmp_path / "dist"), tmp_path)
    assert not moved, f"installing compressor beside optimum-intel 2.2 would change {moved}"


def openvino_exports(root: Path, arch: str) -> tuple[Path, dict[str, Path]]:
    """(saved model, {variant: directory}) of the fp32 and int8 OpenVINO variants of a tiny pruned model."""
    from compressor.deploy import export as ex

    model_dir = pruned_saved(root, arch)[2]
    int8 = ex.Int8Options(calibration=CALIBRATION)
    ex.export_onnx(model_dir, root / "onnx", list(OPENVINO), CHECK, int8=int8)
    return model_dir, {name: root / "onnx" / name for name in OPENVINO}


OPENVINO = ("openvino-fp32", "openvino-int8")
CALIBRATION = [tiny_batch(batch=16, seq=11, seed=s) for s in range(40, 44)]
OPTIMUM_ARCHS = ("bert", "modernbert", "mpnet")  # token types, a fused-QKV pre-norm architecture, MPNet's shared bias


@pytest.mark.slow
@pytest.mark.optimum
@pytest.mark.parametrize("arch", OPTIMUM_ARCHS)
def test_optimum_intel_opens_the_openvino_variants_and_gives_our_logits(tmp_path, optimum_venv, arch):
    """`OVModelForSequenceClassification.from_pretrained` opens each variant directory as exported (its config.json,
    tokenizer files and IR) and, fed what the directory's tokenizer makes of text pairs, gives the logits of our own
    wrapper (`OpenVinoClassifier`).

    Both compile the same IR with the same OpenVINO release (asserted), the same compile settings (compressor's
    `COMPILE_CONFIG`: fp32 precision, so no bf16 on a bf16-capable CPU, handed to optimum-intel as `ov_config`) and
    one inference thread, on the same CPU: they run the same kernels in the same order, so even the int8 graph's
    logits agree as two runs of one fp32 graph do (1e-4), and its predictions agree exactly. Nothing here is a
    measured int8 error: how far the int8 graph may be from PyTorch is `int8_tol` (a multiple of the int8
    deviation simulated in fp32, the same on any CPU), which optimum-intel's int8 logits must keep too."""
    from compressor.deploy.openvino import COMPILE_CONFIG, OpenVinoClassifier
    from compressor.surgery.checkpoint import load_pruned

    model_dir, dirs = openvino_exports(tmp_path, arch)
    config = {**COMPILE_CONFIG, "INFERENCE_NUM_THREADS": "1"}
    args = [json.dumps({n: str(d) for n, d in dirs.items()}), json.dumps(PAIRS), json.dumps(config), str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    run = subprocess.run([optimum_venv, "-c", OPTIMUM_SCRIPT, *args], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    client = json.loads(run.stdout.strip().splitlines()[-1])
    assert client["optimum-intel"].startswith("2.2.") and client["openvino"] == version("openvino"), client
    model = load_pruned(model_dir)
    for name, path in dirs.items():
        got = dict(np.load(tmp_path / f"{name}.npz"))
        theirs = got.pop("logits")
        ours = OpenVinoClassifier(path, threads=1)(got)
        assert np.abs(theirs - ours).max() <= 1e-4, name
        assert (theirs.argmax(-1) == ours.argmax(-1)).all(), name
        batch = {k: torch.from_numpy(v) for k, v in got.items()}
        reference = model(**batch).logits.detach().numpy()
        tol = int8_tol(model, [batch], CALIBRATION) if name == "openvino-int8" else 1e-4
        assert np.abs(theirs - reference).max() <= tol, name
