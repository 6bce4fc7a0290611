"""The name of a benchmark candidate (which model, of which kind, on which runtime), built and parsed in one place.

A candidate is a model × runtime; the model is of one `Kind`:

- `original`: the unpruned model, named `<runtime>-original` ("pytorch-original", "onnx-int8-original");
- `member`: a pruned model the run ships, named `<label>/<runtime>` ("2x/onnx-int8");
- `baseline`: the layer-drop baseline made beside member `<label>`, named `<label>/layer-drop` on PyTorch,
  `<label>/layer-drop-<runtime>` elsewhere;
- `reference`: another model the frontier compares with, named `reference/<label>/<runtime>`.

A one-target run ships one member labelled `SINGLE` ("pruned"); its names keep the spelling its `report.json` has
always had (users' scripts read them): "pytorch-pruned", "onnx-<variant>" and "pytorch-layer-drop".
`CandidateName.parse` reads every spelling back; the bench, the frontier, the report's recommendation and
`compressor pick` all go through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from compressor.core.runtimes import BY_NAME, runtime

Kind = Literal["original", "member", "baseline", "reference"]
KINDS: tuple[str, ...] = ("member", "original", "baseline", "reference")
SINGLE = "pruned"  # the member label of a one-target run
ORIGINAL = "original"
_BASELINE = "layer-drop"
_REFERENCE = "reference"


@dataclass(frozen=True)
class CandidateName:
    """`model` (a member's label, "original", or a reference's label), its `kind` and its `runtime` name."""

    model: str
    kind: Kind
    runtime: str = "pytorch"

    def __post_init__(self) -> None:
        runtime(self.runtime, "candidate runtime")
        if self.kind not in KINDS:
            raise ValueError(f"candidate kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if "/" in self.model:
            raise ValueError(f"candidate model label: expected no '/', got {self.model!r}")

    @classmethod
    def original(cls, runtime_name: str = "pytorch") -> CandidateName:
        return cls(ORIGINAL, "original", runtime_name)

    @property
    def name(self) -> str:
        """The candidate's name in the bench, the report and the frontier."""
        if self.kind == "original":
            return f"{self.runtime}-original"
        if self.kind == "reference":
            return f"{_REFERENCE}/{self.model}/{self.runtime}"
        if self.kind == "baseline":
            drop = _BASELINE if self.runtime == "pytorch" else f"{_BASELINE}-{self.runtime}"
            return f"pytorch-{drop}" if self.model == SINGLE and self.runtime == "pytorch" else f"{self.model}/{drop}"
        if self.model == SINGLE:
            return "pytorch-pruned" if self.runtime == "pytorch" else self.runtime
        return f"{self.model}/{self.runtime}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> CandidateName | None:
        """The candidate `name` stands for, or None when it is no name `name` builds (a user's own bench name)."""
        parts = name.split("/")
        if len(parts) == 1:
            return _parse_flat(name)
        if len(parts) == 3 and parts[0] == _REFERENCE and parts[2] in BY_NAME:
            return cls(parts[1], "reference", parts[2])
        if len(parts) != 2 or not parts[0]:
            return None
        label, rest = parts
        if rest in BY_NAME:
            return cls(label, "member", rest)
        if rest == _BASELINE:
            return cls(label, "baseline")
        tail = rest.removeprefix(f"{_BASELINE}-")
        return cls(label, "baseline", tail) if tail != rest and tail in BY_NAME else None


def _parse_flat(name: str) -> CandidateName | None:
    """The one-target spellings and the original's: "pytorch-pruned", "onnx-int8", "pytorch-layer-drop",
    "<runtime>-original"."""
    if name == "pytorch-pruned":
        return CandidateName(SINGLE, "member")
    if name == f"pytorch-{_BASELINE}":
        return CandidateName(SINGLE, "baseline")
    base = name.removesuffix(f"-{ORIGINAL}")
    if base != name and base in BY_NAME:
        return CandidateName.original(base)
    if name in BY_NAME and name != "pytorch":
        return CandidateName(SINGLE, "member", name)
    return None


def name_of(model: str, kind: Kind, runtime_name: str = "pytorch") -> str:
    """Shorthand for `CandidateName(model, kind, runtime_name).name`."""
    return CandidateName(model, kind, runtime_name).name


ORIGINAL_NAME = name_of(ORIGINAL, "original")  # the PyTorch original: every speed-up's reference
