"""The sm80 kernels on this GPU through the driver-compiled PTX (the path a
GPU without a cubin of its own takes; on an H100 a proxy for an A100, whose
own figures this does not measure): the `aligned` flavour (vectorised,
cp.async loads) against `basic` (masked scalar loads) and a cuBLAS loop."""
from __future__ import annotations

import gg_runtime
from gg_runtime.testing import forced, last_variant, moe_inputs, time_ms

from ..markdown import fmt, table
from ..measure import DTYPES

TITLE = "The sm80 path through PTX"
WORKLOADS = ("mixtral_up_8e_8k", "dsv3_down_32e_8k", "qwen3_up_128e_32k", "balanced_16e_16k")
COLUMNS = ("aligned", "basic", "cublas_loop")


def run(context) -> dict:
    return {"workloads": [bench_proxy(w) for w in context.workloads if w["name"] in WORKLOADS]}


def bench_proxy(w) -> dict:
    a, b, offs = moe_inputs(w["m"], w["N"], w["K"], DTYPES[w["dtype"]])
    flops = 2 * a.shape[0] * w["N"] * w["K"]
    bounds = offs.tolist()
    row = {"name": w["name"]}
    gg_runtime.force_ptx(True)
    try:
        for flavour, basic in (("aligned", False), ("basic", True)):
            with forced(basic=basic):
                gg_runtime.grouped_mm(a, b, offs)
                row[flavour + "_variant"] = last_variant()
                row[flavour] = flops / time_ms(lambda: gg_runtime.grouped_mm(a, b, offs)) / 1e9
    finally:
        gg_runtime.force_ptx(False)
    ranges = list(enumerate(zip([0] + bounds[:-1], bounds)))
    row["cublas_loop"] = flops / time_ms(lambda: [a[s:e] @ b[g] for g, (s, e) in ranges]) / 1e9
    return row


def report(data) -> list:
    lines = ["TFLOP/s; the variants the dispatch picked.", ""]
    return lines + table(["workload", *COLUMNS, "aligned variant", "basic variant"], [
        [r["name"], *(fmt(r[c], "{:.0f}") for c in COLUMNS), f"`{r['aligned_variant']}`",
         f"`{r['basic_variant']}`"] for r in data["workloads"]])
