"""fp8 on each ragged bf16 workload's shapes, each accumulation
(use_fast_accum True: '_fast', and False): ours rowwise and blockwise next to
torch._scaled_grouped_mm (rowwise) with the same use_fast_accum, and our bf16
grouped_mm; the accumulations' errors against float64; quantize_fp8's
bandwidth against this GPU's device copy."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime.formats import GRANULARITIES
from gg_runtime.testing import (FP8_TOLERANCE, TOLERANCE, fp8_moe_inputs, moe_inputs,
                                ref_grouped_mm, ref_scaled_grouped_mm, rel_error, time_ms)

from ..markdown import fmt, geomean, not_timed, table
from ..measure import measure, ratio

TITLE = "fp8"
COLUMNS = {"row fast": "gg_fp8_rowwise_fast", "blk fast": "gg_fp8_blockwise_fast",
           "torch fast": "torch_scaled_grouped_mm_fast", "row": "gg_fp8_rowwise",
           "blk": "gg_fp8_blockwise", "torch": "torch_scaled_grouped_mm", "ours bf16": "gg_bf16"}
# Ratio name -> (the faster, the slower) of runs.
RATIOS = {"rowwise_fast_vs_bf16": ("gg_fp8_rowwise_fast", "gg_bf16"),
          "rowwise_fast_vs_torch_fast": ("gg_fp8_rowwise_fast", "torch_scaled_grouped_mm_fast"),
          "blockwise_fast_vs_rowwise_fast": ("gg_fp8_blockwise_fast", "gg_fp8_rowwise_fast"),
          "rowwise_vs_torch": ("gg_fp8_rowwise", "torch_scaled_grouped_mm"),
          "blockwise_vs_rowwise": ("gg_fp8_blockwise", "gg_fp8_rowwise")}


def run(context) -> dict:
    copy_tbps = context.ceilings()["copy_tbps"]
    return {"workloads": [bench_fp8(w) for w in context.ragged_bf16],
            "accumulation": accumulation_errors(),
            "copy_tbps": copy_tbps, "quantize": bench_quantize(copy_tbps)}


def bench_fp8(w) -> dict:
    flops = 2 * sum(w["m"]) * w["N"] * w["K"]
    a, b, offs = moe_inputs(w["m"], w["N"], w["K"], torch.bfloat16)
    ref = ref_grouped_mm(a, b, offs)
    runs = measure({"gg_bf16": lambda: gg_runtime.grouped_mm(a, b, offs)},
                   lambda out: rel_error(out, ref), TOLERANCE[torch.bfloat16], flops)
    for granularity in ("rowwise", "blockwise"):
        inputs = fp8_moe_inputs(w["m"], w["N"], w["K"], granularity)
        ref = ref_scaled_grouped_mm(*inputs, granularity)
        candidates = {}
        for fast, suffix in ((True, "_fast"), (False, "")):
            candidates[f"gg_fp8_{granularity}{suffix}"] = (
                lambda x=inputs, f=fast: gg_runtime.scaled_grouped_mm(*x, use_fast_accum=f))
            if granularity == "rowwise":
                candidates[f"torch_scaled_grouped_mm{suffix}"] = (
                    lambda x=inputs, f=fast: torch._scaled_grouped_mm(
                        *x[:4], offs=x[4], out_dtype=torch.bfloat16, use_fast_accum=f))
        runs.update(measure(candidates, lambda out, r=ref: rel_error(out, r),
                            FP8_TOLERANCE[torch.bfloat16], flops))
    return {"name": w["name"], "runs": runs,
            **{name: ratio(runs, *pair) for name, pair in RATIOS.items()}}


def accumulation_errors(k_values=(512, 2048, 7168, 16384)) -> list:
    """Relative error against float64 of the dequantised inputs, rowwise fp8,
    one group of 2048 x 2048 per K: ours (float32 and bfloat16 output) and
    torch._scaled_grouped_mm (bfloat16) with use_fast_accum False and True."""
    rows = []
    for k in k_values:
        a, b, scale_a, scale_b, offs = fp8_moe_inputs([2048], 2048, k, "rowwise")
        ref = (a.double() * scale_a.double()[:, None]) @ (
            b[0].double() * scale_b[0].double()[None, :])
        row = {"K": k}
        for out_dtype in (torch.float32, torch.bfloat16):
            out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype=out_dtype)
            row[f"gg_{str(out_dtype).removeprefix('torch.')}"] = rel_error(out, ref)
        for fast in (False, True):
            try:
                out = torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs,
                                               out_dtype=torch.bfloat16, use_fast_accum=fast)
                row[f"torch_fast_accum_{fast}"] = rel_error(out, ref)
            except RuntimeError as error:  # a torch build without it
                row[f"torch_fast_accum_{fast}"] = str(error)[:80]
        rows.append(row)
    return rows


def bench_quantize(copy_tbps: float) -> dict:
    """quantize_fp8 of a bf16 [16384, 7168] input, each granularity: bytes
    moved (input read once, q and scales written) per second, against this
    GPU's measured device-copy bandwidth."""
    x = torch.randn(16384, 7168, device="cuda", dtype=torch.bfloat16)
    rows = {}
    for granularity in GRANULARITIES:
        q, scale, _ = gg_runtime.quantize_fp8(x, granularity)
        moved = x.numel() * 2 + q.numel() + scale.numel() * 4
        tbps = moved / time_ms(lambda g=granularity: gg_runtime.quantize_fp8(x, g)) / 1e9
        rows[granularity] = {"tbps": tbps, "vs_copy": tbps / copy_tbps}
    return rows


def report(data) -> list:
    rows = data["workloads"]
    lines = ["TFLOP/s ('fast': use_fast_accum=True, ours and torch's; row: rowwise scales, "
             "blk: blockwise, 1x128 activations and 128x128 weights).", ""]
    lines += table(["workload", *COLUMNS], [
        [r["name"], *(fmt(r["runs"].get(run, {}).get("tflops"), "{:.0f}")
                      for run in COLUMNS.values())] for r in rows])
    lines += ["", "How many times faster the first ran than the second:", ""]
    label = {run: column for column, run in COLUMNS.items()}
    lines += table(["workload", *(f"{label[a]} / {label[b]}" for a, b in RATIOS.values())],
                   [[r["name"], *(fmt(r[name]) for name in RATIOS)] for r in rows]
                   + [["geomean", *(fmt(geomean(r[name] for r in rows)) for name in RATIOS)]])
    lines += not_timed(rows)
    lines += ["", "Rowwise fp8, one group of 2048 x 2048, relative error against float64 of the "
              "dequantised inputs:", ""]
    columns = [c for c in data["accumulation"][0] if c != "K"] if data["accumulation"] else []
    lines += table(["K", *columns], [
        [row["K"], *(fmt(row[c], "{:.2e}") if isinstance(row[c], float) else row[c]
                     for c in columns)] for row in data["accumulation"]])
    lines += ["", f"quantize_fp8 of a bf16 [16384, 7168] input: TB/s moved (x read, q and "
              f"scales written), and its fraction of the device copy's "
              f"{data['copy_tbps']:.2f} TB/s:", ""]
    lines += table(["granularity", "TB/s", "of copy"], [
        [g, f"{r['tbps']:.2f}", f"{r['vs_copy']:.0%}"] for g, r in data["quantize"].items()])
    return lines
