"""The pipeline: the only place that knows the whole order of stages.

`runner` runs a recipe (preflight → sources → base fine-tune → `recovery.loop` → stages → report, with resume);
`members` makes the run's members (one for a one-target run: a family of one), `measure` benchmarks them together;
`stages` are the steps that make one member shippable (surgery + save → layer-drop baseline → export → model card),
each adding its section to the report.

May import every stage; only `commands` import it.
"""
