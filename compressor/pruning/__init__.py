"""Pruning: which units go, and how a budget is met.

Owns the prunable units and plans (`units`), the importance criteria (`criteria`, a validated registry), selection
under a schedule (`selection`), per-kind allocation (`allocation`), budgets in heads, FLOPs or measured speed-up
(`budget`, `latency`, `by_latency`) and head/neuron gates (`masking`).

May import `core`, `recipe`, `surgery`, `sources` and `deploy` (a speed-up budget times pruned copies on the
runtime it will be deployed on).
"""
