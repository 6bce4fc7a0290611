"""The users' CI guard: decide a benchmark result against a saved baseline (`baseline`: the baseline file, its
metrics and the per-round statistics) and write the verdict (`report`: regression.json / .md / .png).

`compressor bench --reference ... --baseline FILE` runs it (docs/ci.md). Imports only `core` and the recipe's YAML
helpers, so `bench` (which keeps these files in its output directory) may import it.
"""
