"""`python -m compressor` is the same as the `compressor` console script."""

from compressor.cli import main

main()
