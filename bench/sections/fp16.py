"""Each ragged bf16 workload's shapes in fp16 next to bf16, ours both
(torch._grouped_mm takes bf16 only)."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime.testing import TOLERANCE, moe_inputs, ref_grouped_mm, rel_error

from ..markdown import fmt, geomean, not_timed, table
from ..measure import measure, ratio

TITLE = "fp16 against bf16"


def run(context) -> dict:
    return {"workloads": [bench_fp16(w) for w in context.ragged_bf16]}


def bench_fp16(w) -> dict:
    flops = 2 * sum(w["m"]) * w["N"] * w["K"]
    runs = {}
    for dtype in (torch.float16, torch.bfloat16):
        a, b, offs = moe_inputs(w["m"], w["N"], w["K"], dtype)
        ref = ref_grouped_mm(a, b, offs)
        name = str(dtype).removeprefix("torch.")
        run = lambda a=a, b=b, o=offs: gg_runtime.grouped_mm(a, b, o)  # noqa: E731
        runs.update(measure({name: run}, lambda out, r=ref: rel_error(out, r), TOLERANCE[dtype],
                            flops))
    return {"name": w["name"], "runs": runs, "fp16_vs_bf16": ratio(runs, "float16", "bfloat16")}


def report(data) -> list:
    rows = data["workloads"]
    lines = ["TFLOP/s of ours in each dtype; fp16 / bf16: how many times faster fp16 ran.", ""]
    lines += table(["workload", "fp16", "bf16", "fp16 / bf16"], [
        [r["name"], *(fmt(r["runs"][d].get("tflops"), "{:.0f}") for d in ("float16", "bfloat16")),
         fmt(r["fp16_vs_bf16"])] for r in rows])
    lines += ["", f"Geomean fp16 / bf16: {fmt(geomean(r['fp16_vs_bf16'] for r in rows))}."]
    return lines + not_timed(rows)
