"""What the sections' reports share: numbers as text, geometric means and
Markdown tables."""
from __future__ import annotations

import math


def fmt(x, spec: str = "{:.2f}") -> str:
    """x formatted by spec; '-' for None (a run that failed or did not happen)."""
    return "-" if x is None else spec.format(x)


def geomean(xs):
    """Geometric mean of the values that are not None (None if there are none)."""
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def table(header, rows) -> list:
    """Markdown lines of a table: header a sequence of column names, rows of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def not_timed(rows) -> list:
    """Markdown lines listing the candidates that raised or got a wrong result,
    and so were not timed, of rows of {name, runs: {candidate: run}}; none if
    every candidate was timed."""
    failed = [f"- {row['name']}, {name}: {run['error']}" for row in rows
              for name, run in row["runs"].items() if "error" in run]
    return ["", "Not timed:", *failed] if failed else []


def ms_cells(runs: dict, implementations) -> list:
    """Each implementation's time in runs ({implementation: run}) in ms,
    marked * where it ran without a CUDA graph; '-' where it did not run."""
    cells = []
    for implementation in implementations:
        run = runs.get(implementation, {})
        cells.append(fmt(run.get("ms"), "{:.3f}") + ("*" if run.get("graph") is False else ""))
    return cells
