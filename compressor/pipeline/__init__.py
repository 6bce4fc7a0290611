"""The pipeline: the only place that knows the whole order of stages.

`runner` runs a recipe (preflight → sources → base fine-tune → `recovery.loop` → stages → report, with resume);
`stages` are the steps after pruning (surgery + save → layer-drop baseline → export → model card → bench → budget →
analysis), each adding its section to the report.

May import every stage; only `commands` import it.
"""
