"""MoE experts with fp8 e4m3 weights for serving (issue 48): moe_experts with
fp8 weights, moe_experts on the same weights dequantized to bf16, and the
experts written with torch around torch._scaled_grouped_mm, on three models'
expert shapes at decode and prefill token counts.  GPU time; the decode
rows' fraction of the time to read the touched experts' weights once at this
GPU's copy bandwidth; each implementation's first call on a new token count.
Weights quantized by quantize_fp8, 128 x 128 blocks for every model and per
output channel for two of them; every output checked against the bf16
moe_experts before it is timed."""
from __future__ import annotations

import time

import torch

import gg_runtime
from gg_runtime import Quantized
from gg_runtime.testing import (dequantize_ref, gated_activation, quantize_ref, rel_error,
                                sorted_by_expert)

from ..markdown import fmt, ms_cells, not_timed, table
from ..measure import SETTLED_WITHIN, measure, ratio

TITLE = "MoE experts with fp8 weights (serving)"
# (H, I, E, k) of each model's MoE layers.
MODELS = {"mixtral": (4096, 14336, 8, 2), "deepseek_v3": (7168, 2048, 256, 8),
          "qwen3_30b_a3b": (2048, 768, 128, 8)}
# Weight scales -> quantize_fp8's granularity for them (the weights' format).
SCALES = {"blockwise": "128x128", "channelwise": "rowwise"}
CASES = [(model, "blockwise") for model in MODELS] + [
    (model, "channelwise") for model in ("mixtral", "qwen3_30b_a3b")]
DECODE_TOKENS, PREFILL_TOKENS = (1, 8, 64, 256), (4096, 16384)
# Implementation -> bytes per weight element it reads.
IMPLEMENTATIONS = {"gg_fp8": 1, "gg_bf16": 2, "torch_fp8": 1}
REFERENCE = "gg_bf16"
COLUMNS = ["T", "experts touched", "fp8 ms", "bf16 ms", "torch fp8 ms", "x bf16",
           "x torch fp8", "fp8 of bound", "bf16 of bound", "torch fp8 of bound",
           "1st fp8 ms", "1st bf16 ms", "1st torch fp8 ms"]
# fp8 against bf16 on the same (dequantized) weights: the activations are
# rounded to e4m3 (3 mantissa bits: up to 2^-4 of each value) twice, x and
# SwiGLU's output, which leaves the output about 5% (relative, random normal
# inputs, one token included) from bf16's; a wrong scale or expert is off by
# far more.
TOLERANCE = 8e-2


def run(context) -> dict:
    copy_tbps = context.ceilings()["copy_tbps"]
    cases = [(model, scales) for model, scales in CASES if context.only in f"{model}_{scales}"]
    with torch.no_grad():
        return {"copy_tbps": copy_tbps,
                "cases": [bench_case(model, scales, copy_tbps) for model, scales in cases]}


def bench_case(model: str, scales: str, copy_tbps: float) -> dict:
    """One model's experts with one kind of weight scales, every token count;
    the weights freed before the next case."""
    hidden, inter, experts, top_k = MODELS[model]
    name = f"{model}_{scales}"
    weights = expert_weights(hidden, inter, experts, SCALES[scales])
    rows = [bench_tokens(f"{name}, T={tokens}", tokens, top_k, weights, scales, copy_tbps)
            for tokens in DECODE_TOKENS + PREFILL_TOKENS]
    del weights
    torch.cuda.empty_cache()
    return {"name": name, "model": model, "scales": scales,
            "shape": {"H": hidden, "I": inter, "E": experts, "k": top_k}, "rows": rows}


def expert_weights(hidden: int, inter: int, experts: int, granularity: str,
                   bf16: bool = True) -> dict:
    """Random w13 [E, 2I, H] and w2 [E, H, I] quantized to fp8 with scales of
    `granularity` (each a Quantized in that format), and the bf16 weights they
    dequantize to (None unless bf16)."""
    w13, w13_bf16 = quantized_experts(experts, 2 * inter, hidden, granularity, bf16)
    w2, w2_bf16 = quantized_experts(experts, hidden, inter, granularity, bf16)
    return {"w13": w13, "w13_bf16": w13_bf16, "w2": w2, "w2_bf16": w2_bf16}


def quantized_experts(experts: int, rows: int, cols: int, granularity: str,
                      bf16: bool = True) -> tuple:
    """(Quantized(q [E, rows, cols] float8_e4m3fn, its float32 scales [E, ...],
    granularity), q * scale in bf16 or, unless bf16, None) of random normal
    weights of std cols ** -0.5 (products of O(1) inputs stay O(1)), made and
    quantized one expert at a time: no full-size 16-bit original or float32
    copy (DeepSeek-V3's experts are 22.5 GB in bf16)."""
    q = torch.empty(experts, rows, cols, dtype=torch.float8_e4m3fn, device="cuda")
    dequantized = (torch.empty(experts, rows, cols, dtype=torch.bfloat16, device="cuda")
                   if bf16 else None)
    scales = []
    for e in range(experts):
        w = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda") * cols ** -0.5
        q_e, scale, _ = gg_runtime.quantize_fp8(w, granularity)
        q[e] = q_e
        if bf16:
            dequantized[e] = dequantize_ref(q_e, scale, granularity)
        scales.append(scale)
    return Quantized(q, torch.stack(scales), granularity), dequantized


def bench_tokens(name: str, tokens: int, top_k: int, weights: dict, scales: str,
                 copy_tbps: float) -> dict:
    """Every implementation on `tokens` random tokens, random top-k routing
    (softmax of random logits): first call, check, time in turns; ratios and,
    for decode, the fraction of the weight-read bound."""
    experts, _, hidden = weights["w13"].values.shape
    inter = weights["w2"].values.shape[2]
    x, topk_ids, topk_weights = routed_tokens(tokens, hidden, experts, top_k)
    candidates = implementations(x, topk_ids, topk_weights, weights, scales)
    first_call = {impl: first_call_ms(fn) for impl, fn in candidates.items()}
    ref = candidates[REFERENCE]().float()
    flops = 2 * tokens * top_k * 3 * hidden * inter
    decode = tokens in DECODE_TOKENS
    runs = measure(candidates, lambda out: rel_error(out, ref), TOLERANCE, flops, settle=True,
                   graphs=decode)
    touched = topk_ids.unique().numel()
    return {"name": name, "T": tokens, "decode": decode, "touched_experts": touched,
            "runs": runs, "first_call_ms": first_call,
            "vs_bf16": ratio(runs, "gg_fp8", "gg_bf16"),
            "vs_torch_fp8": ratio(runs, "gg_fp8", "torch_fp8"),
            "of_bound": bound_fractions(runs, touched * 3 * hidden * inter, copy_tbps)
            if decode else {}}


def routed_tokens(tokens: int, hidden: int, experts: int, top_k: int) -> tuple:
    """(x [T, H] bf16, topk_ids [T, k] int64, topk_weights [T, k] float32):
    random normal tokens, routed to the top k of a softmax of random logits."""
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    logits = torch.randn(tokens, experts, device="cuda")
    topk_weights, topk_ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    return x, topk_ids, topk_weights


def implementations(x, topk_ids, topk_weights, weights: dict, scales: str) -> dict:
    """name -> fn() of the experts' forward on these inputs.  torch_fp8 with
    per-channel scales only: torch._scaled_grouped_mm takes row-wise scales,
    not 128 x 128 blocks."""
    w = weights
    candidates = {
        "gg_fp8": lambda: gg_runtime.moe_experts(x, topk_ids, topk_weights, w["w13"], w["w2"]),
        "gg_bf16": lambda: gg_runtime.moe_experts(x, topk_ids, topk_weights, w["w13_bf16"],
                                                  w["w2_bf16"])}
    if scales == "channelwise":
        candidates["torch_fp8"] = lambda: torch_fp8_experts(x, topk_ids, topk_weights, w["w13"],
                                                            w["w2"])
    return candidates


def torch_fp8_experts(x, topk_ids, topk_weights, w13: Quantized, w2: Quantized):
    """The experts with fp8 weights written with torch, as moe_experts
    computes them: token slots sorted by expert, the tokens' rows gathered,
    quantized per row (float32 torch ops), torch._scaled_grouped_mm with
    per-channel weight scales and tensor-core accumulation
    (use_fast_accum=True, as moe_experts), SwiGLU, quantized, the down
    projection, then each token's k outputs weighted and summed (put back in
    slot order by the inverse permutation: no atomics)."""
    tokens, top_k = topk_ids.shape
    order, offs = sorted_by_expert(topk_ids, w13.values.shape[0])
    rows = x.index_select(0, order // top_k)
    h = gated_activation(torch_scaled_product(rows, w13, offs))
    ys = torch_scaled_product(h, w2, offs)
    ys = ys.index_select(0, order.argsort()).view(tokens, top_k, -1)
    return (ys * topk_weights.to(ys.dtype).unsqueeze(-1)).sum(1)


def torch_scaled_product(rows, w: Quantized, offs):
    """rows [S, K] (bf16, sorted by expert) times each expert's w [E, N, K]
    (per-channel scales): rows quantized per row, [S, N] in bf16."""
    q, scale = quantize_ref(rows, "rowwise")
    return torch._scaled_grouped_mm(q, w.values.transpose(1, 2), scale, w.scales, offs=offs,
                                    out_dtype=torch.bfloat16, use_fast_accum=True)


def first_call_ms(fn):
    """Wall-clock ms of fn() synchronized, host time included: its first call
    on a new token count.  None if it raises (measure then says why)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        fn()
        torch.cuda.synchronize()
    except Exception:
        return None
    return (time.perf_counter() - start) * 1e3


def bound_fractions(runs: dict, weight_elements: int, copy_tbps: float) -> dict:
    """impl -> the time to read weight_elements of its weights once at
    copy_tbps (TB/s) / its time, for each implementation timed."""
    return {impl: weight_elements * IMPLEMENTATIONS[impl] / copy_tbps / 1e9 / run["ms"]
            for impl, run in runs.items() if "ms" in run}


def report(data) -> list:
    lines = [
        "Forward ms: `fp8`, moe_experts with float8_e4m3fn weights; `bf16`, moe_experts "
        "on the same weights dequantized to bf16; `torch fp8`, the experts written with "
        "torch (slots sorted, rows gathered and quantized per row, torch._scaled_grouped_mm "
        "with use_fast_accum=True as ours, SwiGLU, quantized, down projection, weighted sum). "
        "torch._scaled_grouped_mm has row-wise scales only (no 128 x 128 blocks on sm90): "
        "`-` in the blockwise tables. x bf16 / x torch fp8: that time / fp8's. "
        f"of bound (decode rows): the time to read the touched experts' weights once at this "
        f"run's device-copy bandwidth, {data['copy_tbps']:.2f} TB/s, / the time. 1st: the "
        "first call on that token count, wall-clock, host included. Bf16 tokens, random top-k "
        f"routing; each output within {TOLERANCE:.0e} (relative) of bf16's before it is timed; "
        f"times in turns, the turns repeated until two runs of them agree within "
        f"{SETTLED_WITHIN:.0%}. Decode rows: each forward replayed from a CUDA graph, as "
        "servers run decode steps, so that a time is the GPU's without the host's launches "
        "(called directly where it cannot be captured: marked *)."]
    for case in data["cases"]:
        shape = ", ".join(f"{axis} {value}" for axis, value in case["shape"].items())
        scales = "128 x 128 blocks" if case["scales"] == "blockwise" else "per output channel"
        lines += ["", f"{case['model']} ({shape}), weight scales {scales}:", ""]
        lines += table(COLUMNS, [row_cells(row) for row in case["rows"]])
    return lines + not_timed([row for case in data["cases"] for row in case["rows"]])


def row_cells(row: dict) -> list:
    bound = [row["of_bound"].get(impl) for impl in IMPLEMENTATIONS]
    first = [row["first_call_ms"].get(impl) for impl in IMPLEMENTATIONS]
    return [row["T"], row["touched_experts"], *ms_cells(row["runs"], IMPLEMENTATIONS),
            fmt(row["vs_bf16"]), fmt(row["vs_torch_fp8"]), *(fmt(b, "{:.0%}") for b in bound),
            *(fmt(t, "{:.1f}") for t in first)]
