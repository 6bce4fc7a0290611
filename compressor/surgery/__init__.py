"""Surgery: what each architecture looks like and how its weights are cut.

Owns the per-architecture declarations (`arch`: where heads, FFN neurons and layers live, one module per
architecture), the physical removal of heads, neurons and layers (`slicing`, written once per kind of module), FLOP
and parameter counts (`cost`), and pruned checkpoints (`checkpoint`: save and `load_pruned`).

May import `core` and `recipe`. It sits low because every later stage (loading a saved model, masking, export)
needs to know an architecture's shape.
"""
