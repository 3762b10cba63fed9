"""4-bit prefill as two passes: MXFP4 weights widened to e4m3 in 128 x 128
blocks (aot/kernels/widen_fp8.py's kernel, its rule and its exactness;
JIT-compiled here), then gg_runtime's fp8 moe_experts on them: W4A8 whose
4-bit values become fp8 before the products rather than inside them.  The
runs of docs/notes/2026-12-01-w4-prefill-widened-to-fp8.md ran this probe's
own earlier copies of the kernel, one program a block (git's history).

It checks the widened bytes against torch's rounding of the bf16 weights
over the block scale (on weights whose scales span 21 binades, and on the
layers' own), then times, on gpt-oss's shapes at prefill, in one process,
in turns: the widening of every expert's w13 and w2, the fp8 layer on them,
the two together, the W4A16 layer and, where GG_VLLM_SRC names
bench/vendor_vllm.py's folder, triton_kernels as vLLM runs gpt-oss.  Every
layer's output is checked against bf16 moe_experts on the widened weights
first.

    python lab/w4_widen_fp8_probe.py [--tokens 4096,16384] [--models gpt_oss_20b,...]
"""
from __future__ import annotations

import argparse
import os

import torch
import triton

import gg_runtime
from gg_runtime import Quantized
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import random_mxfp4, widened

from aot.kernels.widen_fp8 import widen_mxfp4_kernel

BLOCK = 128  # the fp8 format's block, rows and K
MODELS = {"gpt_oss_20b": (2880, 2880, 32, 4), "gpt_oss_120b": (2880, 2880, 128, 4)}
OPTIONS = {"gate_up": "interleaved", "activation": "gpt_oss"}


def widen_into(w: Quantized, out: Quantized) -> Quantized:
    """w (MXFP4 [E, N, K]) widened into out's buffers (e4m3 in 128 x 128 blocks)."""
    experts, n, k = out.values.shape
    grid = (experts * triton.cdiv(n, BLOCK) * triton.cdiv(k, BLOCK),)
    widen_mxfp4_kernel[grid](w.values.view(torch.uint8), w.scales.view(torch.uint8),
                             out.values, out.scales, experts, n, k, w.values.stride(0),
                             w.values.stride(1), w.scales.stride(0), w.scales.stride(1),
                             USE_TMA=False, BM=BLOCK, BN=BLOCK, BK=16, CHUNK=1,
                             PRECISION="ieee", num_warps=8)
    return out


def fp8_buffers(w: Quantized) -> Quantized:
    experts, n, half_k = w.values.shape
    k = 2 * half_k
    return Quantized(torch.empty(experts, n, k, dtype=torch.float8_e4m3fn, device="cuda"),
                     torch.empty(experts, triton.cdiv(n, BLOCK), triton.cdiv(k, BLOCK),
                                 device="cuda"), "128x128")


def rounded(bf16: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [N, K] over its blocks' scales [cdiv(N, 128), cdiv(K, 128)],
    rounded to e4m3 by torch (nearest even)."""
    full = scales.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return (bf16.float() / full[:bf16.shape[0], :bf16.shape[1]]).to(torch.float8_e4m3fn)


def check_widening() -> bool:
    """The widened bytes of weights whose scales span 21 binades (2^-23 ..
    2^-3: blocks past the table's shift of 11 too), N not a multiple of the
    block, against torch's rounding."""
    w = random_mxfp4(3, 200, 2880, exponents=(104, 124))
    f = widen_into(w, fp8_buffers(w))
    return all(torch.equal(rounded(widened(w._replace(values=w.values[e:e + 1],
                                                      scales=w.scales[e:e + 1]))[0],
                                   f.scales[e]).view(torch.uint8), f.values[e].view(torch.uint8))
               for e in range(3))


def anchor():
    """(triton_kernels' modules, bench.triton_kernels_moe) where GG_VLLM_SRC
    names a vendored folder with triton_kernels, else None."""
    if not os.environ.get("GG_VLLM_SRC"):
        return None
    from bench import triton_kernels_moe, vendor_vllm
    package = vendor_vllm.load_triton_kernels(vendor_vllm.ROOT / os.environ["GG_VLLM_SRC"])
    return (triton_kernels_moe.modules(package), triton_kernels_moe) if package else None


def run_model(model: str, token_counts, tk) -> None:
    hidden, inter, experts, top_k = MODELS[model]
    w13, w2 = random_mxfp4(experts, 2 * inter, hidden), random_mxfp4(experts, hidden, inter)
    f13, f2 = widen_into(w13, fp8_buffers(w13)), widen_into(w2, fp8_buffers(w2))
    b13 = torch.empty(experts, 2 * inter, hidden, dtype=torch.bfloat16, device="cuda")
    b2 = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
    exact = True
    for e in range(experts):
        for w, f, b in ((w13, f13, b13), (w2, f2, b2)):
            one = w._replace(values=w.values[e:e + 1], scales=w.scales[e:e + 1])
            b[e] = widened(one)[0]
            exact &= torch.equal(rounded(b[e], f.scales[e]).view(torch.uint8),
                                 f.values[e].view(torch.uint8))
    print(f"{model}: widened bytes equal to torch's rounding: {exact}", flush=True)
    experts_tk = tk[1].load_experts(tk[0], w13, w2) if tk else None
    from bench.sections.w4_experts import routed_tokens
    for tokens in token_counts:
        x, logits, ids, weights = routed_tokens(tokens, hidden, experts, top_k)
        fns = {
            "w4a16": lambda: gg_runtime.moe_experts(x, ids, weights, w13, w2, **OPTIONS),
            "widen": lambda: (widen_into(w13, f13), widen_into(w2, f2)),
            "fp8 on widened": lambda: gg_runtime.moe_experts(x, ids, weights, f13, f2, **OPTIONS),
            "widen + fp8": lambda: gg_runtime.moe_experts(
                x, ids, weights, widen_into(w13, f13), widen_into(w2, f2), **OPTIONS)}
        if tk:
            fns["tk"] = lambda: tk[1].forward(tk[0], x, logits, top_k, experts_tk)
        ref = gg_runtime.moe_experts(x, ids, weights, b13, b2, **OPTIONS).float()
        errors = {name: rel_error(fn(), ref) for name, fn in fns.items() if name != "widen"}
        times = time_in_turns(fns)
        cells = ", ".join(f"{name} {ms:.3f} ms" for name, ms in times.items())
        print(f"{model} T={tokens}: {cells}; errors "
              + ", ".join(f"{name} {err:.1e}" for name, err in errors.items()), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    tk = anchor()
    print(f"wide scales: widened bytes equal to torch's rounding: {check_widening()}", flush=True)
    with torch.no_grad():
        for model in args.models.split(","):
            run_model(model, [int(t) for t in args.tokens.split(",")], tk)
            torch.cuda.empty_cache()  # the model's weights, freed on return


if __name__ == "__main__":
    main()
