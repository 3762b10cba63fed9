"""`python -m gg_runtime`: the gg-runtime command (gg_runtime/cli.py)."""
from .cli import run

run()
