"""What the sections' plots share: matplotlib (optional) and how a figure is saved."""
from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), or None where
    matplotlib is not importable (the section then reports no plot)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(fig, path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
