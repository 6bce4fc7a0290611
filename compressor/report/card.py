"""The model card's recovery and deployment section: distillation, and each ONNX variant's gate and verdict,
appended to the card that `surgery.checkpoint.save_pruned` wrote.
"""

from __future__ import annotations

from pathlib import Path

from compressor.core import atomic
from compressor.deploy.quantize import smoothing_note
from compressor.surgery.checkpoint import CARD_FILE


def describe_distillation(distill: dict | None) -> str:
    """How recovery fine-tuning learned, in words: distillation settings, or that it was off."""
    if not distill:
        return "plain task loss (distillation off)"
    hidden = f", hidden-state matching weight {distill['hidden_weight']:g}" if distill.get("hidden_weight") else ""
    return f"distilled from the unpruned model (KL weight {distill['alpha']:g}, T={distill['temperature']:g}{hidden})"


def render_deployment_section(export: dict | None, distill: dict | None) -> str:
    """Model-card section on how the weights were recovered (distillation on/off) and which ONNX variants exist,
    with each int8 variant's validation gate: a rejected variant is listed as such and must not be deployed."""
    lines = [
        "",
        "## Recovery and deployment",
        "",
        f"Fine-tuning between pruning steps: {describe_distillation(distill)}.",
    ]
    if export:
        lines += ["", "| ONNX variant | validation accuracy vs fp32 | status |", "|---|---|---|"]
        for name, info in export.items():
            gate = info.get("gate")
            acc = "–" if gate is None else f"{100 * gate['accuracy']:.2f}% vs {100 * gate['fp32_accuracy']:.2f}%"
            status = info.get("status", "passed parity")
            status = "REJECTED (failed the int8 gate)" if status == "rejected" else status
            kept = (info.get("fp32_fallback") or {}).get("kept_fp32")
            status += f", {len(kept)} node(s) kept in fp32: {', '.join(kept)}" if kept else ""
            lines.append(f"| {name}{smoothing_note(info.get('smoothing'))} | {acc} | {status} |")
    return "\n".join(lines) + "\n"


def add_deployment_section(model_dir: str | Path, export: dict | None, distill: dict | None) -> None:
    """Append `render_deployment_section` to the model card of a saved model (written after export ran)."""
    card = Path(model_dir) / CARD_FILE
    before = card.read_text() if card.exists() else ""
    atomic.write_text(card, before + render_deployment_section(export, distill))
