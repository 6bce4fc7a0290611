"""Report: what a run found, for a person.

Owns the run report (`writer.write_report`: a one-target run's, `summary`, with its recommendation, or a family's,
`family`), the model card's deployment section (`card`) and the head
analysis (`analysis`: roles, statistical tests, plots).

May import every stage below it (it reads their results); nothing below imports it.
"""
