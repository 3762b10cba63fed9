"""Each ragged bf16 workload with a per-group bias [G, N]: ours fused in the
epilogue, next to ours without bias and to torch._grouped_mm followed by
torch adding each row's group's bias (torch's grouped_mm refuses bias)."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime.testing import TOLERANCE, moe_inputs, ref_grouped_mm, rel_error

from ..markdown import fmt, geomean, not_timed, table
from ..measure import measure, ratio

TITLE = "Per-group bias"


def run(context) -> dict:
    return {"workloads": [bench_bias(w) for w in context.ragged_bf16]}


def bench_bias(w) -> dict:
    flops = 2 * sum(w["m"]) * w["N"] * w["K"]
    a, b, offs = moe_inputs(w["m"], w["N"], w["K"], torch.bfloat16)
    bias = torch.randn(len(w["m"]), w["N"], device="cuda").to(torch.bfloat16)
    row_group = torch.repeat_interleave(torch.arange(len(w["m"]), device="cuda"),
                                        torch.tensor(w["m"], device="cuda"))
    ref = ref_grouped_mm(a, b, offs, bias)
    runs = measure({"gg_bias": lambda: gg_runtime.grouped_mm(a, b, offs, bias),
                    "torch_grouped_mm_then_add": lambda: torch._grouped_mm(a, b, offs)
                    + bias[row_group]},
                   lambda out: rel_error(out, ref), TOLERANCE[torch.bfloat16], flops)
    runs.update(measure({"gg": lambda: gg_runtime.grouped_mm(a, b, offs)},
                        lambda out: rel_error(out, ref_grouped_mm(a, b, offs)),
                        TOLERANCE[torch.bfloat16], flops))
    return {"name": w["name"], "runs": runs,
            "bias_cost": ratio(runs, "gg", "gg_bias"),
            "vs_torch_then_add": ratio(runs, "gg_bias", "torch_grouped_mm_then_add")}


def report(data) -> list:
    rows = data["workloads"]
    lines = ["bias cost: our time with bias / without; x torch: torch._grouped_mm then the "
             "add, its time / ours with bias.", ""]
    lines += table(["workload", "bias cost", "x torch then add"], [
        [r["name"], fmt(r["bias_cost"]), fmt(r["vs_torch_then_add"])] for r in rows])
    lines += ["", f"Geomeans: bias cost {fmt(geomean(r['bias_cost'] for r in rows))}, x torch "
              f"then add {fmt(geomean(r['vs_torch_then_add'] for r in rows))}."]
    return lines + not_timed(rows)
