"""Measurements behind the notes, not the benchmark: profiling and A/B scripts
and CUDA cost probes, each run by hand on a GPU machine as its docstring says.
Neither shipped nor tested; bench/ is the benchmark (make bench), and results
live in the dated notes (docs/notes) and bench/RESULTS.md."""
