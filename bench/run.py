"""Side-by-side benchmark of every workload in bench/workloads.json (a copy of
shared/bench/workloads.json) on one GPU, in one process.

    make bench                      # or: python bench/run.py [--sections a,b] [--only NAME]

Columns: gg_runtime, torch._grouped_mm (ragged workloads), a cuBLAS loop, the
tutorial's kernel under Triton JIT (fp16 only, when triton is importable), and
one dense matmul of equal FLOPs.  Median of CUDA-event timings with the L2
flushed before each repetition; every result is checked against a float32
reference before it is timed.  Also: the roofline fraction (floor = max(FLOPs /
dense rate, bytes / copy bandwidth), both measured here), host time per call,
and cold start.  Writes bench/results/results.json and results.png.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch

import gg_runtime
from problems import (FP8_TOLERANCE, TOLERANCE, fp8_moe_inputs, list_inputs, moe_inputs,
                      moe_layer, moe_layer_inputs, moe_layer_no_atomics, offsets_from_counts,
                      ref_grouped_mm, ref_list, ref_scaled_grouped_mm, rel_error, route_top_k,
                      skewed_counts, time_in_turns, time_ms, with_added_bias)

HERE = Path(__file__).resolve().parent
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def ceilings() -> dict:
    """Dense bf16 matmul rate and device-to-device copy bandwidth, measured now."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    matmul_ms = time_ms(lambda: a @ b)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src))
    return {"matmul_tflops": 2 * n ** 3 / matmul_ms / 1e9,
            "copy_tbps": 2 * src.numel() / copy_ms / 1e9}


def group_sizes(w) -> list:
    if "mnk" in w:
        return [tuple(x) for x in w["mnk"]]
    return [(m, w["N"], w["K"]) for m in w["m"]]


def traffic_bytes(w) -> int:
    """A + weights of non-empty groups + C, each once (2-byte elements)."""
    return 2 * sum(m * k + (k * n if m else 0) + m * n for m, n, k in group_sizes(w))


def measure(candidates, check, tolerance, flops) -> dict:
    """name -> {ms, tflops, rel_error} for each candidate whose result passes
    check (relative error) within tolerance, else {error}: an anchor that
    cannot run a case, or gets it wrong, is reported, not fatal.  Two or more
    candidates are timed in turns (problems.time_in_turns)."""
    runs, passing = {}, {}
    for name, fn in candidates.items():
        try:
            error = check(fn())
        except Exception as exc:
            runs[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        if error > tolerance:
            runs[name] = {"error": f"wrong result: relative error {error:.2e}"}
            continue
        runs[name] = {"rel_error": error}
        passing[name] = fn
    times = time_in_turns(passing, turns=5 if len(passing) > 1 else 1)
    for name, ms in times.items():
        runs[name].update(ms=ms, tflops=flops / ms / 1e9)
    return runs


def bench_workload(w, ceil, with_seed) -> dict:
    dtype = DTYPES[w["dtype"]]
    sizes = group_sizes(w)
    flops = 2 * sum(m * n * k for m, n, k in sizes)
    if w["layout"] == "ragged":
        a, b, offs = moe_inputs(w["m"], w["N"], w["K"], dtype)
        ref = ref_grouped_mm(a, b, offs)
        bounds = offs.tolist()
        starts = [0] + bounds[:-1]
        candidates = {
            "gg_runtime": lambda: gg_runtime.grouped_mm(a, b, offs),
            "torch_grouped_mm": lambda: torch._grouped_mm(a, b, offs),
            "cublas_loop": lambda: [a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, bounds))],
        }
        check = lambda out: rel_error(torch.cat(out) if isinstance(out, list) else out, ref)  # noqa: E731
        dense_shape = (sum(m for m, _, _ in sizes), w["K"], w["N"])
    else:
        As, Bs = list_inputs(sizes, dtype)
        refs = ref_list(As, Bs)
        candidates = {
            "gg_runtime": lambda: gg_runtime.grouped_gemm(As, Bs),
            "cublas_loop": lambda: [x @ y for x, y in zip(As, Bs)],
        }
        if with_seed and dtype == torch.float16:
            from seed_kernels import seed_grouped_gemm
            candidates["seed_basic_jit"] = lambda: seed_grouped_gemm(As, Bs)
        check = lambda outs: max(rel_error(o, r) for o, r in zip(outs, refs))  # noqa: E731
        side = round((flops / 2) ** (1 / 3))
        dense_shape = (side, side, side)
    runs = measure(candidates, check, TOLERANCE[dtype], flops)
    m, k, n = dense_shape
    da = torch.randn(m, k, device="cuda").to(dtype)
    db = torch.randn(k, n, device="cuda").to(dtype)
    dense_ms = time_ms(lambda: da @ db)
    runs["dense_same_flops"] = {"ms": dense_ms, "tflops": 2 * m * k * n / dense_ms / 1e9}
    floor_ms = max(flops / ceil["matmul_tflops"] / 1e9, traffic_bytes(w) / ceil["copy_tbps"] / 1e9)
    result = {"name": w["name"], "dtype": w["dtype"], "layout": w["layout"], "groups": len(sizes),
              "flops": flops, "bytes": traffic_bytes(w), "floor_ms": floor_ms, "runs": runs}
    ours = runs.get("gg_runtime", {}).get("ms")
    if ours:
        result["roofline_fraction"] = floor_ms / ours
        result["vs_dense"] = dense_ms / ours
        theirs = runs.get("torch_grouped_mm", {}).get("ms")
        result["vs_torch"] = theirs / ours if theirs else None
        loop = runs.get("cublas_loop", {}).get("ms")
        result["vs_cublas_loop"] = loop / ours if loop else None
    return result


def bench_wgrad(w, ceil) -> dict:
    """The weight gradient of a ragged workload (ragged K: x^T @ dy per expert)
    next to torch._grouped_mm's, same inputs.  Its roofline floor counts x, dy
    and the gradient written (G x K x N, empty experts' zeros too) once each."""
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
    ours, theirs = (runs.get(n, {}).get("ms") for n in ("gg_runtime", "torch_grouped_mm"))
    traffic = x.element_size() * (x.numel() + dy.numel() + len(w["m"]) * w["K"] * w["N"])
    floor_ms = max(flops / (ceil["matmul_tflops"] * 1e9), traffic / (ceil["copy_tbps"] * 1e9))
    transposed, theirs_transposed = (runs.get(n, {}).get("ms") for n in (
        "gg_runtime_transposed", "torch_grouped_mm_transposed"))
    return {"name": w["name"] + "_wgrad", "runs": runs,
            "vs_torch": theirs / ours if ours and theirs else None,
            "transposed_vs_torch": (theirs_transposed / transposed
                                    if transposed and theirs_transposed else None),
            "roofline_fraction": floor_ms / ours if ours else None}


def bench_fp8(w) -> dict:
    """fp8 on a ragged bf16 workload's shapes, each accumulation (use_fast_accum
    True: '_fast', and False): ours rowwise and blockwise next to
    torch._scaled_grouped_mm (rowwise) with the same use_fast_accum, and our
    bf16 grouped_mm."""
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
    ms = {name: run.get("ms") for name, run in runs.items()}
    ratio = lambda x, y: ms[y] / ms[x] if ms.get(x) and ms.get(y) else None  # noqa: E731
    return {"name": w["name"], "runs": runs,
            "rowwise_fast_vs_bf16": ratio("gg_fp8_rowwise_fast", "gg_bf16"),
            "rowwise_fast_vs_torch_fast": ratio("gg_fp8_rowwise_fast",
                                                "torch_scaled_grouped_mm_fast"),
            "blockwise_fast_vs_rowwise_fast": ratio("gg_fp8_blockwise_fast",
                                                    "gg_fp8_rowwise_fast"),
            "rowwise_vs_torch": ratio("gg_fp8_rowwise", "torch_scaled_grouped_mm"),
            "blockwise_vs_rowwise": ratio("gg_fp8_blockwise", "gg_fp8_rowwise")}


def bench_bias(w) -> dict:
    """A ragged bf16 workload with a per-group bias [G, N]: ours fused in the
    epilogue, next to ours without bias and to torch._grouped_mm followed by
    torch adding each row's group's bias (torch's grouped_mm refuses bias)."""
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
    ms = {name: run.get("ms") for name, run in runs.items()}
    ok = all(ms.values())
    return {"name": w["name"], "runs": runs,
            "bias_cost": ms["gg_bias"] / ms["gg"] if ok else None,
            "vs_torch_then_add": ms["torch_grouped_mm_then_add"] / ms["gg_bias"] if ok else None}


def fp8_accumulation_errors(k_values=(512, 2048, 7168, 16384)) -> list:
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


def bench_fp16(w) -> dict:
    """A ragged bf16 workload's shapes in fp16 next to bf16, ours both
    (torch._grouped_mm takes bf16 only)."""
    flops = 2 * sum(w["m"]) * w["N"] * w["K"]
    runs = {}
    for dtype in (torch.float16, torch.bfloat16):
        a, b, offs = moe_inputs(w["m"], w["N"], w["K"], dtype)
        ref = ref_grouped_mm(a, b, offs)
        name = str(dtype).removeprefix("torch.")
        run = lambda a=a, b=b, o=offs: gg_runtime.grouped_mm(a, b, o)  # noqa: E731
        runs.update(measure({name: run}, lambda out, r=ref: rel_error(out, r), TOLERANCE[dtype],
                            flops))
    ms = {name: run.get("ms") for name, run in runs.items()}
    ratio = ms["bfloat16"] / ms["float16"] if ms.get("float16") and ms.get("bfloat16") else None
    return {"name": w["name"], "runs": runs, "fp16_vs_bf16": ratio}


def bench_quantize(copy_tbps: float) -> dict:
    """quantize_fp8 of a bf16 [16384, 7168] input, each granularity: bytes
    moved (input read once, q and scales written) per second, against this
    GPU's measured device-copy bandwidth."""
    x = torch.randn(16384, 7168, device="cuda", dtype=torch.bfloat16)
    rows = {}
    for granularity in ("rowwise", "1x128", "128x128"):
        q, scale = gg_runtime.quantize_fp8(x, granularity)
        moved = x.numel() * 2 + q.numel() + scale.numel() * 4
        tbps = moved / time_ms(lambda g=granularity: gg_runtime.quantize_fp8(x, g)) / 1e9
        rows[granularity] = {"tbps": tbps, "vs_copy": tbps / copy_tbps}
    return rows


def bench_other_cases() -> list:
    """The cases whose ragged operand lies along its contiguous dimension, ours
    next to torch._grouped_mm: 3-D x 2-D with b row-major [K, T] (ragged N),
    and 2-D x 2-D with a row-major [M, T] (ragged K).  Ragged N also as the
    product of its transposes (gg_runtime_out_transposed: the output a
    transposed view, its tiles stored by TMA), what its row-major output's
    stores through registers cost."""
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
    return rows


def bench_moe_model() -> list:
    """A 2-block MoE model's forward (bench/moe_block.py) with gg_runtime's and
    with torch's grouped_mm, same weights and tokens; host time included (at
    these sizes the forward is bound by the host).  Measured in turns, three
    times each, best kept: the first turns run slower on a lent host."""
    from moe_block import moe_model
    rows = []
    for tokens in (2048, 8192):
        x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)
        models = {"gg_runtime": moe_model(gg_runtime.grouped_mm),
                  "torch": moe_model(torch._grouped_mm)}
        times = {name: float("inf") for name in models}
        with torch.no_grad():
            for _ in range(3):
                for name, model in models.items():
                    times[name] = min(times[name], time_ms(lambda: model(x)))
        rows.append({"tokens": tokens, "ms": times,
                     "vs_torch": times["torch"] / times["gg_runtime"]})
    return rows


# torchtitan-style MoE layers (tokens, hidden, expert intermediate, experts, top-k):
# coarse experts first, then fine-grained ones.
TRAINING_LAYERS = {
    "mixtral_8x7b": (8192, 4096, 14336, 8, 2),
    "gpt_oss_20b": (16384, 2880, 2880, 32, 4),
    "dsv3_ep8_slice": (8192, 7168, 2048, 32, 8),
    "olmoe": (16384, 2048, 1024, 64, 8),
    "qwen3_30b_a3b": (16384, 2048, 768, 128, 8),
}
# With experts' biases too (as gpt-oss has): torch's grouped_mm refuses bias, so its layer adds it.
TRAINING_WITH_BIAS = ("gpt_oss_20b",)
TRAINING_MMS = {"torch": with_added_bias(torch._grouped_mm), "gg_runtime": gg_runtime.grouped_mm}


def bench_training(name: str, shape: tuple, bias: bool = False) -> dict:
    """One MoE layer (problems.moe_layer) trained as a model would
    be, with torch._grouped_mm and with gg_runtime.grouped_mm, same inputs:
    forward (autograd recording), forward + backward (gradients of x, the
    router and both expert weights, set to None before each step, as
    optimizer.zero_grad does), each timed in turns with the other
    (problems.time_in_turns), and the peak memory of one such step above
    what was allocated before it.  gg_runtime's output and gradients are
    checked against torch's layer first."""
    tokens, hidden, inter, experts, top_k = shape
    inputs = moe_layer_inputs(tokens, hidden, inter, experts, bias=bias)
    dy = torch.randn_like(inputs["x"])

    def forward(mm):
        return moe_layer(mm, **inputs, top_k=top_k)

    def step(mm):
        for t in inputs.values():
            t.grad = None
        forward(mm).backward(dy)

    results = {}
    for impl, mm in TRAINING_MMS.items():
        step(mm)
        results[impl] = [forward(mm).detach()] + [t.grad for t in inputs.values()]
    errors = {key: rel_error(ours, theirs.float()) for key, ours, theirs in
              zip(["out"] + list(inputs), results["gg_runtime"], results["torch"])}
    row = {"name": name + (" (bias)" if bias else ""),
           "shape": dict(zip(("T", "H", "I", "E", "k"), shape)),
           "rel_error_vs_torch": errors}
    if max(errors.values()) > TOLERANCE[torch.bfloat16]:
        row["error"] = f"gg_runtime's layer differs from torch's: {errors}"
        return row
    del results
    forward_ms = time_in_turns({impl: partial(forward, mm) for impl, mm in TRAINING_MMS.items()})
    step_ms = time_in_turns({impl: partial(step, mm) for impl, mm in TRAINING_MMS.items()})
    for impl, mm in TRAINING_MMS.items():
        row[impl] = {"forward_ms": forward_ms[impl], "train_step_ms": step_ms[impl],
                     "peak_step_gb": peak_gb(lambda: step(mm))}
    ours, theirs = row["gg_runtime"], row["torch"]
    row["forward_vs_torch"] = theirs["forward_ms"] / ours["forward_ms"]
    row["train_step_vs_torch"] = theirs["train_step_ms"] / ours["train_step_ms"]
    row["peak_vs_torch"] = ours["peak_step_gb"] / theirs["peak_step_gb"]
    return row


# The layers of the fused-experts comparison (issue: fused MoE experts): the
# router, then the experts as torchtitan writes them (index_add_), without
# atomics (the baseline), the same with gg_runtime.grouped_mm, and
# gg_runtime.moe_experts.
def fused_layer(x, router, w13, w2, top_k: int, b13=None, b2=None, activation="swiglu",
                interleaved=False):
    weights, chosen = route_top_k(x, router, top_k)
    return gg_runtime.moe_experts(x, chosen, weights, w13, w2, b13=b13, b2=b2,
                                  activation=activation,
                                  gate_up="interleaved" if interleaved else "concatenated")


EXPERTS_LAYERS = {
    "torchtitan": partial(moe_layer, with_added_bias(torch._grouped_mm)),
    "no_atomics": partial(moe_layer_no_atomics, with_added_bias(torch._grouped_mm)),
    "no_atomics_gg_mm": partial(moe_layer_no_atomics, gg_runtime.grouped_mm),
    "moe_experts": fused_layer,
}


# The experts section's rows besides TRAINING_LAYERS' (SwiGLU, no bias): gpt-oss-20b
# as it is, with its experts' biases, interleaved gate/up and clamped activation.
EXPERTS_OWN_ACTIVATION = {"gpt_oss_20b_as_is": ("gpt_oss_20b", {"bias": True,
                                                                  "activation": "gpt_oss",
                                                                  "interleaved": True})}


def bench_experts(name: str, shape: tuple, bias=False, **activation) -> dict:
    """One MoE layer, each of EXPERTS_LAYERS on the same inputs: forward,
    forward + backward (all gradients; both timed in turns over the layers,
    problems.time_in_turns), peak memory of a step and the memory
    the forward keeps for backward (allocated after it, less its output).
    Ratios against the no-atomics torch layer.  Outputs and gradients are
    checked against that layer's first.  activation: the layers' activation
    and interleaved arguments (problems.moe_layer)."""
    tokens, hidden, inter, experts, top_k = shape
    inputs = moe_layer_inputs(tokens, hidden, inter, experts, bias=bias)
    dy = torch.randn_like(inputs["x"])

    def forward(layer):
        return layer(**inputs, top_k=top_k, **activation)

    def step(layer):
        for t in inputs.values():
            t.grad = None
        forward(layer).backward(dy)

    row = {"name": name, "shape": dict(zip(("T", "H", "I", "E", "k"), shape)), "errors": {}}
    results = {}
    for impl, layer in EXPERTS_LAYERS.items():
        step(layer)
        results[impl] = [forward(layer).detach()] + [t.grad for t in inputs.values()]
    for impl in EXPERTS_LAYERS:
        row["errors"][impl] = max(rel_error(ours, theirs.float()) for ours, theirs in
                                  zip(results[impl], results["no_atomics"]))
    del results
    if max(row["errors"].values()) > TOLERANCE[torch.bfloat16]:
        row["error"] = f"a layer differs from the no-atomics torch layer: {row['errors']}"
        return row
    forward_ms = time_in_turns({impl: partial(forward, layer)
                                for impl, layer in EXPERTS_LAYERS.items()})
    step_ms = time_in_turns({impl: partial(step, layer) for impl, layer in EXPERTS_LAYERS.items()})
    for impl, layer in EXPERTS_LAYERS.items():
        row[impl] = {"forward_ms": forward_ms[impl], "train_step_ms": step_ms[impl],
                     "peak_step_gb": peak_gb(lambda: step(layer)),
                     "saved_gb": saved_gb(lambda: forward(layer))}
    base = row["no_atomics"]
    for impl in EXPERTS_LAYERS:
        r = row[impl]
        r["forward_x"] = base["forward_ms"] / r["forward_ms"]
        r["train_step_x"] = base["train_step_ms"] / r["train_step_ms"]
        r["saved_x"] = r["saved_gb"] / base["saved_gb"]
    return row


def saved_gb(forward) -> float:
    """GB the forward leaves allocated (what autograd keeps for backward), its output aside."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = forward()
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
    del out
    return kept / 1e9


def print_experts(rows):
    print("\nMoE experts (bf16), x the no-atomics torch layer: forward, forward+backward, "
          "memory kept for backward")
    head = f"{'layer':16}" + "".join(f" {impl:>24}" for impl in EXPERTS_LAYERS)
    print(head + "\n" + "-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['name']:16} {r['error']}")
            continue
        cells = [f"{r[i]['forward_x']:.2f} {r[i]['train_step_x']:.2f} {r[i]['saved_x']:.2f}"
                 for i in EXPERTS_LAYERS]
        print(f"{r['name']:16}" + "".join(f" {c:>24}" for c in cells))
        print(f"{'  ms, GB':16}" + "".join(
            f" {r[i]['forward_ms']:7.2f} {r[i]['train_step_ms']:7.2f} {r[i]['saved_gb']:6.2f}"
            for i in EXPERTS_LAYERS))


def peak_gb(fn) -> float:
    """GB allocated at the peak of fn() above what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 1e9


def print_training(rows):
    print("\nMoE layer training (bf16): ms and GB, torch / gg_runtime, and the ratio x torch "
          "(peak: ours / torch's)")
    head = (f"{'layer':20} {'forward':>15} {'x':>5} {'fwd+bwd':>15} {'x':>5} {'peak GB':>11} "
            f"{'x':>5}")
    print(head + "\n" + "-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['name']:20} {r['error']}")
            continue
        t, g = r["torch"], r["gg_runtime"]
        print(f"{r['name']:20} {t['forward_ms']:7.2f}/{g['forward_ms']:<7.2f} "
              f"{r['forward_vs_torch']:5.2f} {t['train_step_ms']:7.2f}/{g['train_step_ms']:<7.2f} "
              f"{r['train_step_vs_torch']:5.2f} {t['peak_step_gb']:5.2f}/{g['peak_step_gb']:<5.2f} "
              f"{r['peak_vs_torch']:5.2f}")
    plain = [r for r in rows if not r["name"].endswith("(bias)")]
    print("geomeans x torch, layers without bias:",
          json.dumps({k: fmt(geomean(r.get(k) for r in plain))
                      for k in ("forward_vs_torch", "train_step_vs_torch")}))


SM80_PROXY_WORKLOADS = ("mixtral_up_8e_8k", "dsv3_down_32e_8k", "qwen3_up_128e_32k",
                        "balanced_16e_16k")


def sm80_proxy(workloads) -> list:
    """The sm80 kernels on this GPU through the driver-compiled PTX (the path a
    GPU without a cubin of its own takes; on an H100 a proxy for an A100, whose
    own figures this does not measure): the `aligned` flavour (vectorised,
    cp.async loads) against `basic` (masked scalar loads) and a cuBLAS loop."""
    from problems import forced, last_variant
    rows = []
    for w in (w for w in workloads if w["name"] in SM80_PROXY_WORKLOADS):
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
        rows.append(row)
    return rows


def host_us(fn, calls=2000) -> float:
    """Median host-side microseconds per call (GPU work kept tiny so it never throttles)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        samples.append((time.perf_counter() - t0) / (calls // 5) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def shielded_host_us(fn, batch=100, sleep_cycles=40_000_000) -> float:
    """Host microseconds per call of `batch` calls queued behind a GPU sleep
    (tens of milliseconds) that outlasts them: the host never waits for the
    GPU, whatever the calls' own GPU time, and the queue stays far from full
    (a few hundred launches)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    t0 = time.perf_counter()
    for _ in range(batch):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / batch * 1e6


def host_us_in_turns(fns: dict, turns=9) -> dict:
    """{name: median shielded_host_us} of each fn, all timed in each turn, in
    reverse order every other turn (the host's own speed drifts within a
    process, bench/RESULTS.md: timed apart, two calls' ratio moved by a third)."""
    for fn in fns.values():
        for _ in range(50):
            fn()
    times = {name: [] for name in fns}
    for turn in range(turns):
        for name in (list(fns) if turn % 2 == 0 else list(reversed(fns))):
            times[name].append(shielded_host_us(fns[name]))
    return {name: statistics.median(values) for name, values in times.items()}


def host_costs() -> dict:
    """Host time per call on a tiny problem, ours next to torch's, same inputs:
    plain, with autograd recording (weights that require grad), the weight
    gradient (ragged K of a.t() and an output-shaped dy), and the list
    API with 128 groups against a loop of matmuls and torch's fused 128-tensor
    foreach op; moe_experts' whole forward (256 tokens, top-2 of 8 experts, no
    autograd recording), to set against one torch._grouped_mm call, and the
    replay of a CUDA graph that captured it; and that forward against one
    torch._grouped_mm timed in turns behind a GPU sleep (host_us_in_turns),
    the issue's host target.  Where
    ours goes: `op_` rows call the operator torch.ops.gg_runtime.grouped_mm
    directly (no Python wrapper), `empty_op_` rows on meta tensors (dispatch,
    checks, allocation; no launch)."""
    a, b, offs = moe_inputs([32] * 8, 128, 128, torch.bfloat16)
    w = b.detach().requires_grad_()
    dy = torch.randn_like(gg_runtime.grouped_mm(a, b, offs))
    As, Bs = list_inputs([(16, 16, 32)] * 128, torch.float16)
    weights, chosen = torch.rand(256, 8, device="cuda").topk(2, dim=-1)
    w13, w2 = b.new_empty(8, 128, 128).normal_(), b.new_empty(8, 128, 64).normal_()
    ours = {"grouped_mm_us": lambda: gg_runtime.grouped_mm(a, b, offs),
            "grouped_mm_autograd_us": lambda: gg_runtime.grouped_mm(a, w, offs),
            "weight_gradient_us": lambda: gg_runtime.grouped_mm(a.t(), dy, offs),
            "grouped_gemm_128_groups_us": lambda: gg_runtime.grouped_gemm(As, Bs),
            "moe_experts_forward_us": lambda: gg_runtime.moe_experts(a, chosen, weights, w13, w2)}
    op = torch.ops.gg_runtime.grouped_mm.default
    meta = [x.to("meta") for x in (a, b, offs)]
    ours.update(op_grouped_mm_us=lambda: op(a, b, offs, None, None, False),
                op_grouped_mm_autograd_us=lambda: op(a, w, offs, None, None, False),
                empty_op_grouped_mm_us=lambda: op(*meta, None, None, False))
    # The same forward captured in a CUDA graph: what replaying it costs the host.
    forward_graph = torch.cuda.CUDAGraph()
    gg_runtime.moe_experts(a, chosen, weights, w13, w2)  # kernels loaded before the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(forward_graph):
        gg_runtime.moe_experts(a, chosen, weights, w13, w2)
    ours["moe_experts_forward_graph_replay_us"] = forward_graph.replay
    # The issue's host target, moe_experts' forward against one torch._grouped_mm,
    # timed in turns behind a GPU sleep (its forward's own GPU time is as long as
    # its host time here, which host_us's unshielded batches let the GPU throttle).
    turns = host_us_in_turns({
        "moe_experts_forward_in_turns_us": ours["moe_experts_forward_us"],
        "torch_grouped_mm_in_turns_us": lambda: torch._grouped_mm(a, b, offs)})
    costs = {name: host_us(fn) for name, fn in ours.items()}
    costs.update(turns, moe_experts_forward_x_torch=turns["moe_experts_forward_in_turns_us"]
                 / turns["torch_grouped_mm_in_turns_us"])
    costs.update(torch_grouped_mm_us=host_us(lambda: torch._grouped_mm(a, b, offs)),
                 torch_grouped_mm_autograd_us=host_us(lambda: torch._grouped_mm(a, w, offs)),
                 torch_weight_gradient_us=host_us(lambda: torch._grouped_mm(a.t(), dy, offs)),
                 matmul_loop_128_groups_us=host_us(lambda: [x @ y for x, y in zip(As, Bs)], 500),
                 # torch's fastest op with 128 new tensors out (one fused launch): what
                 # torch itself pays to return that many tensors, a floor for the list API
                 torch_foreach_128_groups_us=host_us(lambda: torch._foreach_add(As, 1.0)))
    return costs


def cold_start() -> dict:
    out = subprocess.run([sys.executable, str(HERE / "cold_start.py")], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)


def print_table(results, ceil):
    print(f"\nceilings: dense bf16 {ceil['matmul_tflops']:.0f} TFLOP/s, "
          f"copy {ceil['copy_tbps']:.2f} TB/s")
    head = f"{'workload':24} {'ours':>7} {'torch':>7} {'loop':>7} {'seed':>7} {'dense':>7} " \
           f"{'x torch':>8} {'x dense':>8} {'x loop':>7} {'roof':>6}"
    print(head + "\n" + "-" * len(head))
    for r in results:
        t = {k: v.get("tflops") for k, v in r["runs"].items()}
        rates = " ".join(f"{fmt(t.get(name), '{:.0f}'):>7}" for name in (
            "gg_runtime", "torch_grouped_mm", "cublas_loop", "seed_basic_jit", "dense_same_flops"))
        print(f"{r['name']:24} {rates} {fmt(r.get('vs_torch')):>8} {fmt(r.get('vs_dense')):>8} "
              f"{fmt(r.get('vs_cublas_loop')):>7} {fmt(r.get('roofline_fraction'), '{:.0%}'):>6}")
    print("(TFLOP/s; x = speed ratio of gg_runtime; roof = roofline floor / our time)")


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


FP8_COLUMNS = {"row fast": "gg_fp8_rowwise_fast", "blk fast": "gg_fp8_blockwise_fast",
               "torch fast": "torch_scaled_grouped_mm_fast", "row": "gg_fp8_rowwise",
               "blk": "gg_fp8_blockwise", "torch": "torch_scaled_grouped_mm",
               "ours bf16": "gg_bf16"}
FP8_RATIOS = ("rowwise_fast_vs_bf16", "rowwise_fast_vs_torch_fast",
              "blockwise_fast_vs_rowwise_fast", "rowwise_vs_torch", "blockwise_vs_rowwise")


def print_fp8(rows):
    print(f"\nfp8, TFLOP/s ('fast': use_fast_accum=True, ours and torch's): {'workload':24} "
          + " ".join(f"{c:>10}" for c in FP8_COLUMNS))
    for r in rows:
        t = {k: v.get("tflops") for k, v in r["runs"].items()}
        print(f"{'':14}{r['name']:24} "
              + " ".join(f"{fmt(t.get(run), '{:.0f}'):>10}" for run in FP8_COLUMNS.values()))
    print(" " * 14 + "ratios:", json.dumps({k: {r["name"]: fmt(r[k]) for r in rows}
                                            for k in FP8_RATIOS}))
    print(" " * 14 + "geomeans:", json.dumps({k: fmt(geomean(r[k] for r in rows))
                                              for k in FP8_RATIOS}))


def summary(results) -> dict:
    moe = [r for r in results if r["layout"] == "ragged" and r["dtype"] == "bfloat16"]
    vs_torch = [r["vs_torch"] for r in moe if r.get("vs_torch")]
    roof = [r["roofline_fraction"] for r in moe if r.get("roofline_fraction")]
    return {"moe_bf16_geomean_vs_torch": geomean(vs_torch),
            "moe_bf16_min_vs_torch": min(vs_torch, default=None),
            "moe_bf16_geomean_roofline": geomean(roof),
            "moe_bf16_min_roofline": min(roof, default=None)}


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no chart")
        return
    names = ["gg_runtime", "torch_grouped_mm", "cublas_loop", "seed_basic_jit", "dense_same_flops"]
    fig, ax = plt.subplots(figsize=(14, 5))
    width = 0.16
    for i, name in enumerate(names):
        ys = [r["runs"].get(name, {}).get("tflops", 0) for r in results]
        ax.bar([x + i * width for x in range(len(results))], ys, width, label=name)
    ax.set_xticks([x + 2 * width for x in range(len(results))])
    ax.set_xticklabels([r["name"] for r in results], rotation=30, ha="right")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"grouped GEMM on {torch.cuda.get_device_name()}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


SECTIONS = ("workloads", "wgrad", "training", "experts", "bias", "fp16", "cases", "fp8", "model",
            "proxy", "host")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--workloads", default=str(HERE / "workloads.json"))
    parser.add_argument("--only", default="", help="run workloads whose name contains this")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)}")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    workloads = [w for w in json.loads(Path(args.workloads).read_text())["workloads"]
                 if args.only in w["name"]]
    ragged = [w for w in workloads if w["layout"] == "ragged"]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "gg_runtime_build": gg_runtime.info()["build"], "date": time.strftime("%Y-%m-%d")}
    ceil = report["ceilings"] = ceilings() if sections & {"workloads", "wgrad", "fp8"} else None
    if "workloads" in sections:
        report["results"] = results = [bench_workload(w, ceil, seed_available()) for w in workloads]
        report["summary"] = summary(results)
        plot(results, out / "results.png")
        print_table(results, ceil)
        print("summary:", json.dumps({k: round(v, 3) if v else v
                                      for k, v in report["summary"].items()}))
    if "wgrad" in sections:
        report["wgrad"] = wgrad = [bench_wgrad(w, ceil) for w in ragged]
        print("weight gradient (ragged K), x torch:",
              json.dumps({r["name"]: fmt(r["vs_torch"]) for r in wgrad}),
              "geomean", fmt(geomean(r["vs_torch"] for r in wgrad)))
        print("weight gradient computed transposed (dy^T x, as for w.transpose(1, 2)), x torch's:",
              json.dumps({r["name"]: fmt(r["transposed_vs_torch"]) for r in wgrad}),
              "geomean", fmt(geomean(r["transposed_vs_torch"] for r in wgrad)))
        print("weight gradient, roof (x, dy and the gradient once; FLOPs at the dense rate):",
              json.dumps({r["name"]: fmt(r["roofline_fraction"], "{:.0%}") for r in wgrad}))
    if "training" in sections:
        layers = [(name, shape, False) for name, shape in TRAINING_LAYERS.items()]
        layers += [(name, TRAINING_LAYERS[name], True) for name in TRAINING_WITH_BIAS]
        report["training"] = training = [bench_training(*layer) for layer in layers
                                         if args.only in layer[0]]
        print_training(training)
    if "experts" in sections:
        rows = [(name, shape, {}) for name, shape in TRAINING_LAYERS.items()]
        rows += [(name, TRAINING_LAYERS[layer], options)
                 for name, (layer, options) in EXPERTS_OWN_ACTIVATION.items()]
        report["experts"] = experts = [bench_experts(name, shape, **options)
                                       for name, shape, options in rows if args.only in name]
        print_experts(experts)
    if "bias" in sections:
        report["bias"] = bias = [bench_bias(w) for w in ragged if w["dtype"] == "bfloat16"]
        print("per-group bias, ours with / without:", json.dumps(
            {r["name"]: fmt(r["bias_cost"]) for r in bias}), "geomean",
            fmt(geomean(r["bias_cost"] for r in bias)))
        print("per-group bias, x torch._grouped_mm then add:", json.dumps(
            {r["name"]: fmt(r["vs_torch_then_add"]) for r in bias}), "geomean",
            fmt(geomean(r["vs_torch_then_add"] for r in bias)))
    if "cases" in sections:
        report["cases"] = cases = bench_other_cases()
        print("other cases, TFLOP/s ours / torch (/ ours, output transposed):", json.dumps(
            {r["name"]: "/".join(fmt(run.get("tflops"), "{:.0f}") for run in r["runs"].values())
             for r in cases}))
    if "fp16" in sections:
        report["fp16"] = fp16 = [bench_fp16(w) for w in ragged if w["dtype"] == "bfloat16"]
        print("fp16 / bf16 speed, ours:", json.dumps({r["name"]: fmt(r["fp16_vs_bf16"])
                                                      for r in fp16}),
              "geomean", fmt(geomean(r["fp16_vs_bf16"] for r in fp16)))
    if "fp8" in sections:
        report["fp8"] = fp8 = [bench_fp8(w) for w in ragged if w["dtype"] == "bfloat16"]
        print_fp8(fp8)
        report["fp8_accumulation"] = accumulation = fp8_accumulation_errors()
        print("fp8 rowwise, relative error against float64:",
              json.dumps([{k: f"{v:.2e}" if isinstance(v, float) else v for k, v in row.items()}
                          for row in accumulation]))
        copy_tbps = ceil["copy_tbps"]
        report["quantize"] = quantize = bench_quantize(copy_tbps)
        print(f"quantize_fp8 [16384, 7168] bf16, TB/s (x device copy {copy_tbps:.2f}):",
              json.dumps({g: f"{r['tbps']:.2f} ({r['vs_copy']:.0%})" for g, r in quantize.items()}))
    if "model" in sections:
        report["moe_model"] = model = bench_moe_model()
        print("MoE model forward, x torch:",
              json.dumps({r["tokens"]: fmt(r["vs_torch"]) for r in model}))
    if "proxy" in sections:
        report["sm80_proxy"] = proxy = sm80_proxy(workloads)
        print("sm80 path (PTX through the driver), TFLOP/s aligned / basic / cuBLAS loop:",
              json.dumps({r["name"]: "/".join(fmt(r[k], "{:.0f}") for k in
                                              ("aligned", "basic", "cublas_loop"))
                          for r in proxy}))
    if "host" in sections:
        report["host"] = host_costs()
        report["cold_start"] = cold_start()
        print("host:", json.dumps({k: round(v, 1) if isinstance(v, float) else v
                                   for k, v in report["host"].items()}))
        print("cold start:", json.dumps(report["cold_start"]))
    (out / "results.json").write_text(json.dumps(report, indent=1))


def seed_available() -> bool:
    """The tutorial's kernel runs under Triton's JIT, where triton is importable."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
