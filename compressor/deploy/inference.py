"""Running exported ONNX graphs and PyTorch models on batches, and comparing their logits.

`OnnxClassifier` wraps a CPU `onnxruntime.InferenceSession` over one variant directory so that it is called like a
model (batch -> logits); `evaluate_variant` and `compare` give the max |Δlogit| and argmax agreement that the export
parity gate and the int8 checks are decided on. `quiet_ort` keeps ONNX Runtime's tools from flooding the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from compressor.core.errors import UserError
from compressor.core.timing import ORT_DEFAULT_NOTE, ort_default_threads
from compressor.sources.batches import MODEL_INPUTS as INPUT_NAMES

ONNX_FILE = "model.onnx"
# ONNX Runtime session fusions left off on CPU: `SkipLayerNormalization`'s CPU kernel is a scalar loop, slower than
# the `Add` and `LayerNormalization` kernels it would replace (`graph.unfuse_skip_norms` says more).
SLOW_CPU_FUSIONS = ("SkipLayerNormFusion",)
# ONNX Runtime's worker threads spin for more work after each run. With many sessions alive in one process and timed
# in turn (a latency table's synthetic blocks), the spinning threads of one session take the cores from the next and
# inflate its time unevenly; `OnnxClassifier(spinning=False)` turns that off for such sessions.
SPINNING = "session.intra_op.allow_spinning"


def _as_int64(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.int64)


def onnx_file(variant_dir: str | Path) -> Path:
    """The graph of a variant directory (`model.onnx`, else its only `.onnx` file); a file path is returned as is."""
    path = Path(variant_dir)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"onnx: variant directory '{path}' not found")
    if (path / ONNX_FILE).is_file():
        return path / ONNX_FILE
    found = sorted(path.glob("*.onnx"))
    if len(found) != 1:
        raise UserError(f"onnx: expected one .onnx file in '{path}', found {len(found)}")
    return found[0]


def graph_size(file: str | Path) -> int:
    """Bytes of an ONNX graph plus any external-data files beside it."""
    file = Path(file)
    extra = sum(p.stat().st_size for p in file.parent.glob(f"{file.name}_data*") if p.is_file())
    return file.stat().st_size + extra


def graph_feed(batch: Mapping, input_names: Iterable[str], graph: Path) -> dict[str, np.ndarray]:
    """The inputs an exported graph (ONNX or OpenVINO) declares, from `batch` as numpy int64; `token_type_ids`
    is zeros when the batch lacks it (as PyTorch defaults it), any other missing input a one-line error."""
    feed = {}
    for name in input_names:
        if name in batch:
            feed[name] = _as_int64(batch[name])
        elif name == "token_type_ids" and "input_ids" in batch:
            feed[name] = np.zeros_like(_as_int64(batch["input_ids"]))
        else:
            raise UserError(f"export: the graph '{graph}' needs input '{name}', which the batch lacks")
    return feed


def cpu_session(file: str | Path, options=None):
    """An `onnxruntime.InferenceSession` on the CPU with ONNX Runtime's usual optimizations except `SLOW_CPU_FUSIONS`:
    the session every timing and every check of ours runs, and the one the docs tell users to create."""
    import onnxruntime as ort

    options = options or ort.SessionOptions()
    return ort.InferenceSession(
        str(file), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(SLOW_CPU_FUSIONS)
    )


class OnnxClassifier:
    """A CPU `onnxruntime.InferenceSession` over one exported variant, called like a model: batch → logits.

    Only the inputs the graph declares are fed (as int64); a graph input missing from the batch is an error except
    `token_type_ids`, which is zeros, as PyTorch defaults it. `threads` fixes the intra-op thread count (ONNX Runtime
    reads it once, when the session is created); left None, `threads` records ONNX Runtime's default and why.
    `spinning=False` keeps idle worker threads from spinning (`SPINNING`): for sessions timed beside many others.
    """

    def __init__(self, variant_dir: str | Path, threads: int | None = None, spinning: bool = True):
        import onnxruntime as ort

        self.path = onnx_file(variant_dir)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
            options.inter_op_num_threads = 1
        if not spinning:  # see `SPINNING`
            options.add_session_config_entry(SPINNING, "0")
        options.log_severity_level = 3
        self.session = cpu_session(self.path, options)
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_name = self.session.get_outputs()[0].name
        self.size_bytes = graph_size(self.path)
        self.threads = int(threads) if threads else ort_default_threads()
        self.threads_note = None if threads else ORT_DEFAULT_NOTE

    def feed(self, batch: Mapping) -> dict[str, np.ndarray]:
        """The session inputs for `batch` (numpy int64), filling `token_type_ids` with zeros when absent."""
        return graph_feed(batch, self.input_names, self.path)

    def __call__(self, batch: Mapping) -> np.ndarray:
        return self.session.run([self.output_name], self.feed(batch))[0]


def torch_logits(model: nn.Module, batch: Mapping) -> np.ndarray:
    """PyTorch logits for the model inputs of `batch` (labels and other keys dropped)."""
    inputs = {k: v for k, v in batch.items() if k in INPUT_NAMES}
    with torch.inference_mode():
        return model(**inputs).logits.float().cpu().numpy()


def evaluate_variant(predict: Callable[[Mapping], np.ndarray], batches: Iterable[Mapping]) -> dict:
    """Logits, predictions and (when batches carry `labels`) accuracy of `predict` over `batches`."""
    logits, labels = [], []
    for batch in batches:
        logits.append(np.asarray(predict(batch), dtype=np.float32))
        if "labels" in batch:
            labels.append(_as_int64(batch["labels"]).reshape(-1))
    out = np.concatenate(logits) if logits else np.zeros((0, 0), np.float32)
    predictions = out.argmax(-1) if out.size else np.zeros(0, np.int64)
    accuracy = float((predictions == np.concatenate(labels)).mean()) if labels and len(predictions) else None
    return {"logits": out, "predictions": predictions, "accuracy": accuracy, "examples": int(len(predictions))}


def compare(candidate: dict, reference: dict) -> dict:
    """Max |Δlogit| and argmax agreement of an `evaluate_variant` result against the PyTorch one."""
    diff = float(np.abs(candidate["logits"] - reference["logits"]).max()) if reference["examples"] else 0.0
    agreement = float((candidate["predictions"] == reference["predictions"]).mean()) if reference["examples"] else 1.0
    return {
        "max_abs_diff": diff,
        "agreement": agreement,
        "check_accuracy": candidate["accuracy"],
        "pytorch_check_accuracy": reference["accuracy"],
        "check_examples": reference["examples"],
    }


# ORT's transformer tools put their own folder on sys.path, so their loggers are named by bare module name.
_ORT_LOGGER_PREFIXES = ("onnxruntime", "fusion_", "onnx_model", "optimizer", "quant", "onnx_utils", "shape_infer")


@contextmanager
def quiet_ort():
    """Silence ONNX Runtime's tool loggers below ERROR while they run.

    The attention fusion warns once per pruned layer that the input hidden size differs from the Q/K/V width, which
    is exactly the uneven-heads case it handles (heads are read from each layer's own shapes).
    """
    names = [n for n in list(logging.root.manager.loggerDict) if n.startswith(_ORT_LOGGER_PREFIXES)]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    logging.root.addFilter(_drop_ort_root_records)  # the quantiser logs through the root logger itself
    try:
        yield
    finally:
        logging.root.removeFilter(_drop_ort_root_records)
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _drop_ort_root_records(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR or "onnxruntime" not in record.pathname


class ExportParityError(UserError):
    """The exported graph does not reproduce PyTorch's logits within the tolerance (nothing was written)."""


def check_parity(name: str, stats: dict, atol: float, runtime: str = "ONNX") -> None:
    """Raise `ExportParityError` when variant `name`'s max |Δlogit| against PyTorch (`compare` stats) exceeds atol."""
    if not stats["max_abs_diff"] <= atol:  # `not <=` also catches NaN
        raise ExportParityError(
            f"export: {name} {runtime} logits differ from PyTorch by {stats['max_abs_diff']:.3g} > atol {atol:g} on "
            f"{stats['check_examples']} examples (prediction agreement {stats['agreement']:.4f}); no variant written"
        )
