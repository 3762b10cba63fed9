"""What bench/run.py gives every section: the workloads, the --only filter,
where plots go and this GPU's ceilings (measured once, for the sections that
use them)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .measure import ceilings

WORKLOADS = Path(__file__).resolve().parent / "workloads.json"


def load_workloads(path: Path = WORKLOADS, only: str = "") -> list:
    """The workloads of `path` (bench/workloads.json) whose name contains `only`."""
    return [w for w in json.loads(Path(path).read_text())["workloads"] if only in w["name"]]


@dataclass
class Context:
    workloads: list  # of bench/workloads.json, --only applied
    only: str  # sections with named cases of their own run those whose name contains it
    out_dir: Path  # where results.json and RESULTS.md are written
    _ceilings: dict = field(default=None, repr=False)

    @property
    def ragged_bf16(self) -> list:
        """The MoE workloads (ragged M) in bf16."""
        return [w for w in self.workloads if w["layout"] == "ragged" and w["dtype"] == "bfloat16"]

    @property
    def ragged(self) -> list:
        return [w for w in self.workloads if w["layout"] == "ragged"]

    def plot_path(self, name: str) -> tuple:
        """(where to write the plot `name`, its path as RESULTS.md links it)."""
        return self.out_dir / "plots" / name, f"plots/{name}"

    def ceilings(self) -> dict:
        """measure.ceilings(), measured on the first call."""
        if self._ceilings is None:
            self._ceilings = ceilings()
        return self._ceilings
