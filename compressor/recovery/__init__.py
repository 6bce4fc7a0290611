"""Recovery: the pruning loop and the fine-tuning that recovers accuracy between steps.

Owns fine-tuning through Accelerate (`train`), evaluation of masked models (`evaluate`), the examples each step
draws (`draws`), distillation with cached teacher targets (`distill`), per-step checkpoints and resume
(`checkpoints`), the recovery steps a recipe lists (`steps`: one module each, registered), and the loop itself,
score → select → mask → recover (`loop.prune`, the public `compressor.prune`).

May import every stage below it: `pruning`, `deploy`, `sources`, `surgery`, `recipe`, `core`.
"""
