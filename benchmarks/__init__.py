"""The benchmark suite: every figure on docs/results.md is one *experiment*, declared in `experiments/NAME.yaml`
(its recipe, seeds, runtimes, the product commands it runs, the figure it produces and its goal), run by one runner
(`python -m benchmarks run NAME`, resumable), written in one result schema to `results/NAME.json`, and the page's
tables are generated from those results (`python -m benchmarks page`).

Modules: `schema` (the result file's typed model), `suite` (the experiment declarations), `readers` (what each kind
of product output says, as result rows; registered by name), `runner` (run and resume one experiment), `page` (the
results page from its template and the results), `provenance` (commit, CPU, what else ran, cache state, seconds),
`parts` (an unfinished step's files stored for another session to resume from: `python -m benchmarks parts NAME`).
`bench_ci.py` is the CI regression check (`make bench-ci`), `peers.py` the comparison with other pruning tools (an
experiment's second step). Nothing in `compressor` imports this package.
"""
