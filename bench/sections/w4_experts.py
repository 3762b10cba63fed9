"""MoE experts with 4-bit weights for serving (issue 82): moe_experts with
MXFP4 or INT4 weights (W4A16; MXFP4's prefill W4A8), with the same weights in fp8 (128 x 128
blocks, quantize_fp8) and widened to bf16 (as the kernels widen them), on
the expert shapes of gpt-oss (MXFP4), Kimi-K2 (INT4, groups of 32) and
Qwen3-30B-A3B's INT4 checkpoints (groups of 128) at decode and prefill
token counts.  GPU time; the decode rows' fraction of the time to read the
touched experts' weights once at this GPU's copy bandwidth; the first call
on a new token count.  Random 4-bit weights (every byte uniform; MXFP4's
scales 2^-9 .. 2^-3, INT4's bfloat16 in [2^-7, 2^-5)); every output checked
against the bf16 moe_experts on the widened weights before it is timed.

The anchor on the MXFP4 shapes, where GG_VLLM_SRC names a folder
bench/vendor_vllm.py filled from a vLLM wheel: OpenAI's triton_kernels as
vLLM runs gpt-oss on Hopper (bench/triton_kernels_moe.py), from the router's
logits (its routing included) and its two matmul_ogs launches alone, on the
same MXFP4 values and scales; its first call on each token count compiles it
(a fresh Triton cache for the section)."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime import Quantized
from gg_runtime.testing import rel_error
from gg_runtime.testing.w4 import random_int4, random_mxfp4, widened

from .. import triton_kernels_moe, vendor_vllm
from ..markdown import fmt, ms_cells, not_timed, table
from ..measure import SETTLED_WITHIN, measure, ratio
from .fp8_experts import first_call_ms
from .vllm_fp8 import fresh_triton_cache, vendored_folder

TITLE = "MoE experts with 4-bit weights (serving)"
ROWS = "cases"  # a filter's run (--only) merges its models into the last run's
# (H, I, E, k, gate_up, activation, format) of each model's MoE layers; the
# format: MXFP4, or INT4 with a bfloat16 scale a group of 32 or 128.
MODELS = {"gpt_oss_20b": (2880, 2880, 32, 4, "interleaved", "gpt_oss", "mxfp4"),
          "gpt_oss_120b": (2880, 2880, 128, 4, "interleaved", "gpt_oss", "mxfp4"),
          "kimi_k2_tp8": (7168, 256, 384, 8, "concatenated", "swiglu", "int4_g32"),
          "kimi_k2": (7168, 2048, 384, 8, "concatenated", "swiglu", "int4_g32"),
          "qwen3_30b_a3b": (2048, 768, 128, 8, "concatenated", "swiglu", "int4_g128")}
DECODE_TOKENS, PREFILL_TOKENS = (1, 8, 64, 256), (4096, 16384)
# Format -> bytes a weight element the 4-bit forward reads: half a byte and
# its share of a scale (MXFP4's byte a 32 values, INT4's bfloat16 a group).
FORMAT_BYTES = {"mxfp4": 0.5 + 1 / 32, "int4_g32": 0.5 + 2 / 32, "int4_g128": 0.5 + 2 / 128}
# The other implementations' bytes a weight element.
REFERENCE_BYTES = {"gg_fp8": 1 + 1 / 128 ** 2 * 4, "gg_bf16": 2}
IMPLEMENTATIONS = ("gg_w4", "gg_fp8", "gg_bf16")
# The anchor's two timings: from the router's logits, and its GEMMs alone.
ANCHOR = ("tk", "tk_gemms")
ANCHOR_FORMAT = "mxfp4"
REFERENCE = "gg_bf16"
COLUMNS = ["T", "experts touched", "4-bit ms", "fp8 ms", "bf16 ms", "x fp8", "x bf16",
           "4-bit of bound", "fp8 of bound", "bf16 of bound", "1st 4-bit ms"]
ANCHOR_COLUMNS = ["tk ms", "tk GEMMs ms", "x tk", "x tk GEMMs", "1st tk ms"]
# 4-bit against bf16 on the same widened weights: the same math rounded
# alike; fp8's tokens and activations rounded to e4m3 (about 5%).
TOLERANCE = 8e-2


def run(context) -> dict:
    copy_tbps = context.ceilings()["copy_tbps"]
    with fresh_triton_cache(), torch.no_grad():
        tk, anchor = triton_kernels_anchor()
        return {"copy_tbps": copy_tbps, "anchor": anchor,
                "cases": [bench_model(model, copy_tbps, tk) for model in MODELS
                          if context.only in model]}


def triton_kernels_anchor() -> tuple:
    """(triton_kernels' modules or None, what ran: its provenance and
    Triton's version, or why it did not run)."""
    folder, reason = vendored_folder()
    if reason:
        return None, {"skipped": reason}
    package = vendor_vllm.load_triton_kernels(folder)
    if package is None:
        return None, {"skipped": f"{folder} has no triton_kernels (vLLM's wheels ship it; "
                                 "`python3 -m bench.vendor_vllm WHEEL`)"}
    import triton

    provenance = vendor_vllm.load_provenance(folder)
    return triton_kernels_moe.modules(package), {
        "vllm": {key: provenance[key] for key in ("kind", "version") if key in provenance},
        "triton": triton.__version__}


def bench_model(model: str, copy_tbps: float, tk) -> dict:
    hidden, inter, experts, top_k, gate_up, activation, fmt = MODELS[model]
    weights = expert_weights(hidden, inter, experts, fmt)
    anchor = (tk, triton_kernels_moe.load_experts(tk, weights["w13"], weights["w2"])
              ) if tk and fmt == ANCHOR_FORMAT else None
    options = {"gate_up": gate_up, "activation": activation}
    bytes_per_element = {"gg_w4": FORMAT_BYTES[fmt], **REFERENCE_BYTES,
                         **dict.fromkeys(ANCHOR, FORMAT_BYTES[fmt])}
    rows = [bench_tokens(f"{model}, T={tokens}", tokens, top_k, weights, options,
                         bytes_per_element, copy_tbps, anchor)
            for tokens in DECODE_TOKENS + PREFILL_TOKENS]
    del weights, anchor
    torch.cuda.empty_cache()
    return {"name": model, "format": fmt,
            "shape": {"H": hidden, "I": inter, "E": experts, "k": top_k}, "rows": rows}


def random_w4(experts: int, rows: int, cols: int, fmt: str) -> Quantized:
    """Random 4-bit weights [E, rows, cols] in `fmt`, a Quantized."""
    if fmt == "mxfp4":
        return random_mxfp4(experts, rows, cols)
    return random_int4(experts, rows, cols, group=int(fmt.removeprefix("int4_g")))


def expert_weights(hidden: int, inter: int, experts: int, fmt: str) -> dict:
    """Random 4-bit w13 [E, 2I, H] and w2 [E, H, I] in `fmt`, and the same
    weights in bf16 (as the kernels widen them) and in fp8 with 128 x 128
    block scales (4-bit and fp8 each a Quantized), an expert at a time."""
    weights = {}
    for name, rows, cols in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
        w4 = random_w4(experts, rows, cols, fmt)
        bf16 = torch.empty(experts, rows, cols, dtype=torch.bfloat16, device="cuda")
        fp8 = torch.empty(experts, rows, cols, dtype=torch.float8_e4m3fn, device="cuda")
        fp8_scales = []
        for e in range(experts):
            bf16[e] = widened(w4._replace(values=w4.values[e:e + 1],
                                          scales=w4.scales[e:e + 1]))[0]
            q, scale, _ = gg_runtime.quantize_fp8(bf16[e], "128x128")
            fp8[e] = q
            fp8_scales.append(scale)
        weights.update({name: w4, f"{name}_bf16": bf16,
                        f"{name}_fp8": Quantized(fp8, torch.stack(fp8_scales), "128x128")})
    return weights


def routed_tokens(tokens: int, hidden: int, experts: int, top_k: int) -> tuple:
    """(x [T, H] bf16, logits [T, E] bf16, topk_ids [T, k], topk_weights [T, k]
    float32): random normal tokens; a router's logits, each token's a random
    order of the values 0, 1/16, .., (E - 1)/16 (no ties where E <= 256,
    bf16 holding them exactly, so that every implementation picks the same
    experts); routed as gpt-oss routes, to the top k, their weights a softmax
    over the k."""
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    ranks = torch.rand(tokens, experts, device="cuda").argsort(dim=1)
    logits = (ranks / 16).to(torch.bfloat16)
    top, topk_ids = logits.float().topk(top_k, dim=-1)
    return x, logits, topk_ids, torch.softmax(top, dim=-1)


def bench_tokens(name: str, tokens: int, top_k: int, w: dict, options: dict,
                 bytes_per_element: dict, copy_tbps: float, anchor) -> dict:
    experts, _, hidden = w["w13_bf16"].shape
    inter = w["w2_bf16"].shape[2]
    x, logits, ids, weights = routed_tokens(tokens, hidden, experts, top_k)
    candidates = {
        "gg_w4": lambda: gg_runtime.moe_experts(x, ids, weights, w["w13"], w["w2"], **options),
        "gg_fp8": lambda: gg_runtime.moe_experts(x, ids, weights, w["w13_fp8"], w["w2_fp8"],
                                                 **options),
        "gg_bf16": lambda: gg_runtime.moe_experts(x, ids, weights, w["w13_bf16"], w["w2_bf16"],
                                                  **options)}
    first = first_call_ms(candidates["gg_w4"])
    first_anchor = add_anchor(candidates, anchor, x, logits, top_k) if anchor else None
    ref = candidates[REFERENCE]().float()
    decode = tokens in DECODE_TOKENS
    runs = measure(candidates, lambda out: rel_error(out, ref), TOLERANCE,
                   2 * tokens * top_k * 3 * hidden * inter, settle=True, graphs=decode)
    touched = ids.unique().numel()
    elements = touched * 3 * hidden * inter
    return {"name": name, "T": tokens, "decode": decode, "touched_experts": touched,
            "runs": runs, "first_call_ms": first, "anchor_first_call_ms": first_anchor,
            "vs_fp8": ratio(runs, "gg_w4", "gg_fp8"),
            "vs_bf16": ratio(runs, "gg_w4", "gg_bf16"),
            **{f"vs_{impl}": ratio(runs, "gg_w4", impl) for impl in ANCHOR if impl in runs},
            "of_bound": {impl: elements * bytes_per_element[impl] / copy_tbps / 1e9 / run["ms"]
                         for impl, run in runs.items() if "ms" in run} if decode else {}}


def add_anchor(candidates: dict, anchor: tuple, x, logits, top_k: int):
    """Adds triton_kernels' forward from the logits and its GEMMs alone (on
    routing made here, once) to candidates; returns its first call's ms (the
    compile of this token count's kernels)."""
    tk, experts = anchor
    candidates["tk"] = lambda: triton_kernels_moe.forward(tk, x, logits, top_k, experts)
    first = first_call_ms(candidates["tk"])
    routed = triton_kernels_moe.route(tk, logits, top_k)
    candidates["tk_gemms"] = lambda: triton_kernels_moe.experts_forward(tk, x, experts, routed)
    return first


def report(data) -> list:
    lines = [
        "Forward ms: `4-bit`, moe_experts with 4-bit weights, in the format named beside "
        "each model (MXFP4; INT4 with a bf16 scale a group of 32 or 128 values): W4A16 (the "
        "values widened to bf16 in the K loop), or, for MXFP4 at prefill (at least 64 slots "
        "an expert, sm90), W4A8 (the weights widened to fp8 blocks once a call, then fp8's "
        "products); `fp8`, moe_experts on the same weights quantized "
        "to fp8 (128 x 128 blocks); `bf16`, moe_experts on them widened to bf16 as the kernels "
        "widen them. x fp8 / x bf16: that time / the 4-bit one's. of bound (decode rows): the "
        "time to read the touched experts' weights (and scales) once at this run's "
        f"device-copy bandwidth, {data['copy_tbps']:.2f} TB/s, / the time. 1st: the 4-bit "
        "forward's first call on that token count, wall-clock, host included. Bf16 tokens, "
        "random top-k routing; each output "
        f"within {TOLERANCE:.0e} (relative) of bf16's before it is timed; times in turns, "
        f"repeated until two runs agree within {SETTLED_WITHIN:.0%}. Decode rows replayed "
        "from CUDA graphs (called directly where one cannot be captured: marked *). "
        "Routing: each token's top k of random logits with no ties, their weights a softmax "
        "over the k (gpt-oss's).", "", anchor_line(data.get("anchor"))]
    for case in data["cases"]:
        shape = ", ".join(f"{axis} {value}" for axis, value in case["shape"].items())
        anchored = any("tk" in row["runs"] for row in case["rows"])
        lines += ["", f"{case['name']}, {case['format']} ({shape}):", ""]
        lines += table(COLUMNS + ANCHOR_COLUMNS * anchored,
                       [row_cells(row, anchored) for row in case["rows"]])
    return lines + not_timed([row for case in data["cases"] for row in case["rows"]])


def anchor_line(anchor) -> str:
    """What the section says of triton_kernels' run, or why it did not run."""
    if not anchor or "skipped" in anchor:
        reason = anchor["skipped"] if anchor else "this run predates it"
        return f"OpenAI's triton_kernels (the anchor) did not run: {reason}."
    vllm = anchor["vllm"]
    return (f"tk: OpenAI's triton_kernels as vLLM {vllm.get('version', '')} ({vllm.get('kind')}) "
            "ships it in vllm/third_party and runs gpt-oss's MXFP4 experts on Hopper, "
            f"JIT-compiled by Triton {anchor['triton']}, on the same MXFP4 values and scales "
            "(swizzled once into its Hopper layouts, as vLLM does at load), from the router's "
            "logits (its routing kernels included; ours take the routing made from them); "
            "tk GEMMs: its two matmul_ogs launches alone. x tk: its time / the 4-bit one's. "
            "1st tk: its first call on that token count, the compile of its kernels included "
            "(the section's Triton cache starts empty).")


def row_cells(row: dict, anchored: bool) -> list:
    bound = [row["of_bound"].get(impl) for impl in IMPLEMENTATIONS]
    cells = [row["T"], row["touched_experts"], *ms_cells(row["runs"], IMPLEMENTATIONS),
             fmt(row["vs_fp8"]), fmt(row["vs_bf16"]),
             *(fmt(b, "{:.0%}") for b in bound), fmt(row["first_call_ms"], "{:.1f}")]
    if anchored:
        cells += [*ms_cells(row["runs"], ANCHOR), fmt(row.get("vs_tk")),
                  fmt(row.get("vs_tk_gemms")), fmt(row.get("anchor_first_call_ms"), "{:.1f}")]
    return cells
