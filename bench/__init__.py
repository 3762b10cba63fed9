"""gg_runtime's benchmark (`make bench`): bench/run.py runs the sections of
bench/sections/ and writes bench/results.json and bench/RESULTS.md."""
