"""Head-role analysis: what each attention head does, with statistical tests, and what survives pruning.

Public API (see docs/analysis.md): `analyze_heads`, `role_masks`, `kept_vs_removed`, `write_analysis`, and
`RoleConfig` for the detectors' thresholds.
"""

from compressor.analysis.core import analyze_heads, kept_vs_removed, role_masks
from compressor.analysis.report import write_analysis
from compressor.analysis.roles import RoleConfig

__all__ = ["RoleConfig", "analyze_heads", "kept_vs_removed", "role_masks", "write_analysis"]
