"""MoE experts with MXFP4 weights for serving (issue 82): moe_experts with
4-bit weights (W4A16), with the same weights in fp8 (128 x 128 blocks,
quantize_fp8) and dequantized to bf16, on gpt-oss's and Kimi-K2's expert
shapes at decode and prefill token counts.  GPU time; the decode rows'
fraction of the time to read the touched experts' weights once at this GPU's
copy bandwidth; the first call on a new token count.  Random MXFP4 weights
(every byte uniform, scales 2^-9 .. 2^-3); every output checked against the
bf16 moe_experts on the dequantized weights before it is timed."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime.testing import rel_error
from gg_runtime.testing.w4 import dequantize_mxfp4, random_mxfp4

from ..markdown import fmt, ms_cells, not_timed, table
from ..measure import SETTLED_WITHIN, measure, ratio
from .fp8_experts import first_call_ms, routed_tokens

TITLE = "MoE experts with MXFP4 weights (serving)"
# (H, I, E, k, gate_up, activation) of each model's MoE layers.
MODELS = {"gpt_oss_20b": (2880, 2880, 32, 4, "interleaved", "gpt_oss"),
          "gpt_oss_120b": (2880, 2880, 128, 4, "interleaved", "gpt_oss"),
          "kimi_k2_tp8": (7168, 256, 384, 8, "concatenated", "swiglu")}
DECODE_TOKENS, PREFILL_TOKENS = (1, 8, 64, 256), (4096, 16384)
# Implementation -> bytes a weight element it reads (MXFP4: half a byte and
# a scale byte a 32).
IMPLEMENTATIONS = {"gg_mxfp4": 0.5 + 1 / 32, "gg_fp8": 1 + 1 / 128 ** 2 * 4, "gg_bf16": 2}
REFERENCE = "gg_bf16"
COLUMNS = ["T", "experts touched", "mxfp4 ms", "fp8 ms", "bf16 ms", "x fp8", "x bf16",
           "mxfp4 of bound", "fp8 of bound", "bf16 of bound", "1st mxfp4 ms"]
# MXFP4 against bf16 on the same (exactly dequantized) weights: the same math
# rounded alike; fp8's tokens and activations rounded to e4m3 (about 5%).
TOLERANCE = 8e-2


def run(context) -> dict:
    copy_tbps = context.ceilings()["copy_tbps"]
    with torch.no_grad():
        return {"copy_tbps": copy_tbps,
                "cases": [bench_model(model, copy_tbps) for model in MODELS
                          if context.only in model]}


def bench_model(model: str, copy_tbps: float) -> dict:
    hidden, inter, experts, top_k, gate_up, activation = MODELS[model]
    weights = expert_weights(hidden, inter, experts)
    options = {"gate_up": gate_up, "activation": activation}
    rows = [bench_tokens(f"{model}, T={tokens}", tokens, top_k, weights, options, copy_tbps)
            for tokens in DECODE_TOKENS + PREFILL_TOKENS]
    del weights
    torch.cuda.empty_cache()
    return {"name": model, "shape": {"H": hidden, "I": inter, "E": experts, "k": top_k},
            "rows": rows}


def expert_weights(hidden: int, inter: int, experts: int) -> dict:
    """Random MXFP4 w13 [E, 2I, H] and w2 [E, H, I], and the same weights in
    bf16 (exact) and in fp8 with 128 x 128 block scales, an expert at a time."""
    weights = {}
    for name, rows, cols in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
        values, scales = random_mxfp4(experts, rows, cols)
        bf16 = torch.empty(experts, rows, cols, dtype=torch.bfloat16, device="cuda")
        fp8 = torch.empty(experts, rows, cols, dtype=torch.float8_e4m3fn, device="cuda")
        fp8_scales = []
        for e in range(experts):
            bf16[e] = dequantize_mxfp4(values[e:e + 1], scales[e:e + 1])[0]
            q, scale = gg_runtime.quantize_fp8(bf16[e], "128x128")
            fp8[e] = q
            fp8_scales.append(scale)
        weights.update({name: values, f"{name}_scale": scales, f"{name}_bf16": bf16,
                        f"{name}_fp8": fp8, f"{name}_fp8_scale": torch.stack(fp8_scales)})
    return weights


def bench_tokens(name: str, tokens: int, top_k: int, w: dict, options: dict,
                 copy_tbps: float) -> dict:
    experts, _, hidden = w["w13_bf16"].shape
    inter = w["w2_bf16"].shape[2]
    x, ids, weights = routed_tokens(tokens, hidden, experts, top_k)
    candidates = {
        "gg_mxfp4": lambda: gg_runtime.moe_experts(x, ids, weights, w["w13"], w["w2"],
                                                   w13_scale=w["w13_scale"],
                                                   w2_scale=w["w2_scale"], **options),
        "gg_fp8": lambda: gg_runtime.moe_experts(x, ids, weights, w["w13_fp8"], w["w2_fp8"],
                                                 w13_scale=w["w13_fp8_scale"],
                                                 w2_scale=w["w2_fp8_scale"], **options),
        "gg_bf16": lambda: gg_runtime.moe_experts(x, ids, weights, w["w13_bf16"], w["w2_bf16"],
                                                  **options)}
    first = first_call_ms(candidates["gg_mxfp4"])
    ref = candidates[REFERENCE]().float()
    decode = tokens in DECODE_TOKENS
    runs = measure(candidates, lambda out: rel_error(out, ref), TOLERANCE,
                   2 * tokens * top_k * 3 * hidden * inter, settle=True, graphs=decode)
    touched = ids.unique().numel()
    elements = touched * 3 * hidden * inter
    return {"name": name, "T": tokens, "decode": decode, "touched_experts": touched,
            "runs": runs, "first_call_ms": first,
            "vs_fp8": ratio(runs, "gg_mxfp4", "gg_fp8"),
            "vs_bf16": ratio(runs, "gg_mxfp4", "gg_bf16"),
            "of_bound": {impl: elements * IMPLEMENTATIONS[impl] / copy_tbps / 1e9 / run["ms"]
                         for impl, run in runs.items() if "ms" in run} if decode else {}}


def report(data) -> list:
    lines = [
        "Forward ms: `mxfp4`, moe_experts with MXFP4 weights (W4A16: e2m1 values widened to "
        "bf16 in the K loop); `fp8`, moe_experts on the same weights quantized to fp8 (128 x "
        "128 blocks); `bf16`, moe_experts on them dequantized (exactly) to bf16. x fp8 / x "
        "bf16: that time / mxfp4's. of bound (decode rows): the time to read the touched "
        "experts' weights (and scales) once at this run's device-copy bandwidth, "
        f"{data['copy_tbps']:.2f} TB/s, / the time. 1st: mxfp4's first call on that token "
        "count, wall-clock, host included. Bf16 tokens, random top-k routing; each output "
        f"within {TOLERANCE:.0e} (relative) of bf16's before it is timed; times in turns, "
        f"repeated until two runs agree within {SETTLED_WITHIN:.0%}. Decode rows replayed "
        "from CUDA graphs (called directly where one cannot be captured: marked *). "
        "OpenAI's triton_kernels (the issue's anchor) is not in this run."]
    for case in data["cases"]:
        shape = ", ".join(f"{axis} {value}" for axis, value in case["shape"].items())
        lines += ["", f"{case['name']} ({shape}):", ""]
        lines += table(COLUMNS, [row_cells(row) for row in case["rows"]])
    return lines + not_timed([row for case in data["cases"] for row in case["rows"]])


def row_cells(row: dict) -> list:
    bound = [row["of_bound"].get(impl) for impl in IMPLEMENTATIONS]
    return [row["T"], row["touched_experts"], *ms_cells(row["runs"], IMPLEMENTATIONS),
            fmt(row["vs_fp8"]), fmt(row["vs_bf16"]),
            *(fmt(b, "{:.0%}") for b in bound), fmt(row["first_call_ms"], "{:.1f}")]
