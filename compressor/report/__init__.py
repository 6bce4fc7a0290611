"""Report: what a run found, for a person.

Owns the run report (`writer.write_report`: a one-target run's, `summary`, with its recommendation, or a family's,
`family`) and the model card's deployment section (`card`). The head analysis is its own stage,
`compressor.analysis`.

May import every stage below it (it reads their results); nothing below imports it.
"""
