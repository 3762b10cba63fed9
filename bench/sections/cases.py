"""The cases whose ragged operand lies along its contiguous dimension, ours
next to torch._grouped_mm: 3-D x 2-D with b row-major [K, T] (ragged N), and
2-D x 2-D with a row-major [M, T] (ragged K).  Ragged N also as the product
of its transposes (gg_runtime_out_transposed: the output a transposed view,
its tiles stored by TMA), what its row-major output's stores through
registers cost."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime.testing import (TOLERANCE, offsets_from_counts, ref_grouped_mm, rel_error,
                                skewed_counts)

from ..markdown import fmt, not_timed, table
from ..measure import measure

TITLE = "Ragged operands along their contiguous dimension"
CANDIDATES = ("gg_runtime", "torch_grouped_mm", "gg_runtime_out_transposed")


def run(context) -> dict:
    # Groups of multiples of 8 rows: torch asserts (on the device) 16-byte group sizes.
    counts = [8 * c for c in skewed_counts(2048, 16, generator=torch.Generator().manual_seed(0))]
    offs = offsets_from_counts(counts)
    groups, m, k, t = 16, 2048, 4096, sum(counts)
    rows = []
    for name, a, b in (
            ("ragged_n_3d_2d", torch.randn(groups, m, k, device="cuda").bfloat16(),
             torch.randn(k, t, device="cuda").bfloat16() * k ** -0.5),
            ("ragged_k_row_major_a", torch.randn(m, t, device="cuda").bfloat16(),
             torch.randn(t, k, device="cuda").bfloat16())):
        ref = ref_grouped_mm(a, b, offs)
        candidates = {"gg_runtime": lambda a=a, b=b: gg_runtime.grouped_mm(a, b, offs),
                      "torch_grouped_mm": lambda a=a, b=b: torch._grouped_mm(a, b, offs)}
        if a.dim() == 3:
            candidates["gg_runtime_out_transposed"] = \
                lambda a=a, b=b: gg_runtime.grouped_mm(b.t(), a.transpose(1, 2), offs).t()
        runs = measure(candidates, lambda out, r=ref: rel_error(out, r), TOLERANCE[torch.bfloat16],
                       2 * m * k * t)
        rows.append({"name": name, "runs": runs})
    return {"cases": rows}


def report(data) -> list:
    rows = data["cases"]
    lines = ["TFLOP/s; ours, output transposed: ragged N computed as the product of its "
             "transposes.", ""]
    lines += table(["case", "ours", "torch", "ours, output transposed"], [
        [r["name"], *(fmt(r["runs"].get(c, {}).get("tflops"), "{:.0f}") for c in CANDIDATES)]
        for r in rows])
    return lines + not_timed(rows)
