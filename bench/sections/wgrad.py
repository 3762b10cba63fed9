"""The weight gradient of each ragged workload (ragged K: x^T @ dy per
expert) next to torch._grouped_mm's, same inputs, in both orientations."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime.testing import TOLERANCE, moe_inputs, ref_grouped_mm, rel_error

from ..markdown import fmt, geomean, not_timed, table
from ..measure import DTYPES, measure, ratio

TITLE = "Weight gradient (ragged K)"


def run(context) -> dict:
    ceil = context.ceilings()
    return {"ceilings": ceil, "workloads": [bench_wgrad(w, ceil) for w in context.ragged]}


def bench_wgrad(w, ceil) -> dict:
    """Its roofline floor counts x, dy and the gradient written (G x K x N,
    empty experts' zeros too) once each."""
    dtype = DTYPES[w["dtype"]]
    x, _, offs = moe_inputs(w["m"], w["N"], w["K"], dtype)
    dy = torch.randn(x.shape[0], w["N"], device="cuda").to(dtype)
    ref = ref_grouped_mm(x.t(), dy, offs)
    flops = 2 * x.shape[0] * w["N"] * w["K"]
    candidates = {"gg_runtime": lambda: gg_runtime.grouped_mm(x.t(), dy, offs),
                  "torch_grouped_mm": lambda: torch._grouped_mm(x.t(), dy, offs),
                  # as the gradient of a weight passed as w.transpose(1, 2) is computed
                  # (by both libraries: in that weight's layout)
                  "gg_runtime_transposed": lambda: gg_runtime.grouped_mm(dy.t(), x, offs).mT,
                  "torch_grouped_mm_transposed": lambda: torch._grouped_mm(dy.t(), x, offs).mT}
    runs = measure(candidates, lambda out: rel_error(out, ref), TOLERANCE[dtype], flops)
    ours = runs.get("gg_runtime", {}).get("ms")
    traffic = x.element_size() * (x.numel() + dy.numel() + len(w["m"]) * w["K"] * w["N"])
    floor_ms = max(flops / (ceil["matmul_tflops"] * 1e9), traffic / (ceil["copy_tbps"] * 1e9))
    return {"name": w["name"] + "_wgrad", "runs": runs,
            "vs_torch": ratio(runs, "gg_runtime", "torch_grouped_mm"),
            "transposed_vs_torch": ratio(runs, "gg_runtime_transposed",
                                         "torch_grouped_mm_transposed"),
            "roofline_fraction": floor_ms / ours if ours else None}


def report(data) -> list:
    rows = data["workloads"]
    lines = ["x torch: torch._grouped_mm's time / ours, same inputs; transposed: both computing "
             "dy^T x, as for a weight passed as w.transpose(1, 2); roof: the floor (x, dy and "
             "the gradient once; FLOPs at the dense rate) / our time.", ""]
    lines += table(["workload", "ours TFLOP/s", "x torch", "transposed x torch's", "roof"], [
        [r["name"], fmt(r["runs"]["gg_runtime"].get("tflops"), "{:.0f}"), fmt(r["vs_torch"]),
         fmt(r["transposed_vs_torch"]), fmt(r["roofline_fraction"], "{:.0%}")] for r in rows])
    lines += ["", f"Geomeans: x torch {fmt(geomean(r['vs_torch'] for r in rows))}, transposed "
              f"{fmt(geomean(r['transposed_vs_torch'] for r in rows))}."]
    return lines + not_timed(rows)
