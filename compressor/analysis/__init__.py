"""Head-role analysis: what each attention head does, with statistical tests, and what survives pruning.

Public API (see docs/analysis.md): `analyze_heads`, `role_masks`, `kept_vs_removed`, `write_analysis`,
`model_texts` (a split's inputs as the model sees them: texts or pairs), and `RoleConfig` for the detectors'
thresholds (the recipe's `analysis.roles`).

A stage of its own (the pipeline's analysis step and `compressor analyze`), beside `report`: may import `pruning`
(attention maps) and the stages below it; nothing below imports it.
"""

from compressor.analysis.collect import model_texts
from compressor.analysis.core import analyze_heads, kept_vs_removed, role_masks
from compressor.analysis.report import write_analysis
from compressor.analysis.roles import RoleConfig

__all__ = ["RoleConfig", "analyze_heads", "kept_vs_removed", "model_texts", "role_masks", "write_analysis"]
