"""4-bit prefill as two passes: MXFP4 weights widened to e4m3 in 128 x 128
blocks by one Triton kernel, then gg_runtime's fp8 moe_experts on them (its
tokens quantized per 1 x 128, fp8 MMAs): W4A8 whose 4-bit values are mapped
to fp8 before the products rather than inside them.

The widening is exact where a block's scale groups lie within 14 binades of
its largest: a group of shift d below the block's largest exponent holds
e2m1 * 2^(6 - d) in e4m3 (the largest, 6 * 2^6 = 384, within e4m3's 448; the
smallest, 0.5 * 2^(6 - d), on e4m3's subnormal grid of 2^-9 while d <= 14),
the block's scale 2^(largest - 127 - 6); further below, rounded to nearest
even.  The probe checks the widened bytes against torch's rounding of the bf16
weights over the block scale (on weights whose scales span 21 binades, and
on the layers' own), times the widening of every
expert's w13 and w2, the fp8 layer on them, the two together, the W4A16
layer and (where GG_VLLM_SRC names bench/vendor_vllm.py's folder)
triton_kernels as vLLM runs gpt-oss, on gpt-oss's shapes at prefill, in one
process, times in turns.  Every layer output checked against bf16
moe_experts on the widened weights first.

    python lab/w4_widen_fp8_probe.py [--tokens 4096,16384] [--models gpt_oss_20b,...]
"""
from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

import gg_runtime
from gg_runtime import Quantized
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import random_mxfp4, widened

BLOCK = 128  # the fp8 format's block, rows and K
MODELS = {"gpt_oss_20b": (2880, 2880, 32, 4), "gpt_oss_120b": (2880, 2880, 128, 4)}
OPTIONS = {"gate_up": "interleaved", "activation": "gpt_oss"}


@triton.jit
def e4m3_byte(nibble, shift):
    """The e4m3 byte of an e2m1 nibble times 2^(6 - shift) (int32 in, int32
    out), rounded to nearest even (exact for shift <= 14)."""
    sign = (nibble & 8) << 4
    e = (nibble >> 1) & 3
    m = nibble & 1
    # A value (2 + m) * 2^(E - 8), E its e4m3 exponent field where >= 1; e2m1's
    # subnormal 0.5 (e = 0, m = 1) as 2 * 2^(E - 8), E = 12 - shift.
    field = tl.where(e > 0, e + 12 - shift, 12 - shift)
    mant = tl.where(e > 0, m, 0)
    normal = (field << 3) | (mant << 2)
    # field <= 0: e4m3's subnormal M * 2^-9, M = (2 + mant) * 2^(field + 1)
    sub = tl.where(field >= -1, (2 + mant) << tl.maximum(field + 1, 0), 0)
    sub = tl.where(field == -2, tl.where(mant == 0, 1, 2), sub)  # 1.5 rounds to even
    sub = tl.where(field == -3, mant, sub)  # 0.5 rounds to 0, 0.75 to 1; less: 0
    byte = tl.where(field >= 1, normal, sub)
    byte = tl.where((nibble & 7) == 0, 0, byte)
    return sign | byte


# One PTX instance: word $2 (eight e2m1 nibbles, element 2i the low nibble of
# byte i) -> $0, $1 (their eight e4m3 bytes in order), $3 and $4 the table
# of the eight magnitudes' e4m3 bytes at this word's shift.  The nibbles less
# their sign are prmt's selectors into the table; the signs are placed by
# prmt's sign mode (a selector with bit 3 set copies its byte's top bit into
# all eight): the low nibbles' signs are bit 7 of (word << 4)'s bytes, the
# high nibbles' bit 7 of the word's.
WIDEN_WORD_ASM = tl.constexpr("""{
.reg .b32 m, h, t, s0, s1;
and.b32 m, $2, 0x77777777;
shr.b32 h, m, 16;
prmt.b32 $0, $3, $4, m;
prmt.b32 $1, $3, $4, h;
shl.b32 t, $2, 4;
prmt.b32 s0, t, $2, 0xD9C8;
prmt.b32 s1, t, $2, 0xFBEA;
and.b32 s0, s0, 0x80808080;
and.b32 s1, s1, 0x80808080;
or.b32 $0, $0, s0;
or.b32 $1, $1, s1;
}""")
# The table where no field underflows (shift <= 11): magnitudes 0, 0.5, 1,
# 1.5 and 2, 3, 4, 6 at exponent fields 12, 13, 14, 15 less the shift.
TABLE_LOW, TABLE_HIGH = tl.constexpr(0x6C686000), tl.constexpr(0x7C787470)
TABLE_STEP_LOW, TABLE_STEP_HIGH = tl.constexpr(0x08080800), tl.constexpr(0x08080808)


@triton.jit
def table(shift, FAST: tl.constexpr):
    """(low, high): the e4m3 bytes of magnitudes 0-3 and 4-7 at `shift`."""
    if FAST:
        return TABLE_LOW - shift * TABLE_STEP_LOW, TABLE_HIGH - shift * TABLE_STEP_HIGH
    low = e4m3_byte(1, shift) << 8 | e4m3_byte(2, shift) << 16 | e4m3_byte(3, shift) << 24
    high = (e4m3_byte(4, shift) | e4m3_byte(5, shift) << 8 | e4m3_byte(6, shift) << 16
            | e4m3_byte(7, shift) << 24)
    return low, high


@triton.jit
def widen_words(words, shift, FAST: tl.constexpr):
    low, high = table(shift, FAST)
    return tl.inline_asm_elementwise(WIDEN_WORD_ASM, "=r,=r,r,r,r", [words, low, high],
                                     dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def widen_kernel(v_ptr, s_ptr, q_ptr, bs_ptr, N, K, BLOCK: tl.constexpr):
    """Expert program_id(2)'s block (program_id(0), program_id(1)) of MXFP4
    values v [E, N, K / 2] (read as int32 words, eight values each) and e8m0
    scales s [E, N, K / 32] -> e4m3 q [E, N, K] (int32 words, four values
    each) and the block's float32 scale bs [E, cdiv(N, 128), cdiv(K, 128)]."""
    WORDS: tl.constexpr = BLOCK // 8
    e = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    words = tl.program_id(1) * WORDS + tl.arange(0, WORDS)
    ok = (rows < N)[:, None] & (words < K // 8)[None, :]
    # each word's scale (four words a group: the same byte, from L1)
    s = tl.load(s_ptr + e * N * (K // 32) + rows[:, None] * (K // 32) + words[None, :] // 4,
                mask=ok, other=0).to(tl.int32)
    top = tl.max(tl.max(s, 1), 0)
    shift = tl.where(ok, top - s, 0)
    b = tl.load(v_ptr + e * N * (K // 8) + rows[:, None] * (K // 8) + words[None, :], mask=ok,
                other=0)
    if tl.max(tl.max(shift, 1), 0) <= 11:
        first, second = widen_words(b, shift, True)
    else:
        first, second = widen_words(b, shift, False)
    out = tl.join(first, second).reshape(BLOCK, 2 * WORDS)
    out_words = tl.program_id(1) * 2 * WORDS + tl.arange(0, 2 * WORDS)
    tl.store(q_ptr + e * N * (K // 4) + rows[:, None] * (K // 4) + out_words[None, :], out,
             mask=(rows < N)[:, None] & (out_words < K // 4)[None, :])
    blocks_n = tl.cdiv(N, BLOCK)
    blocks_k = tl.cdiv(K, BLOCK)
    tl.store(bs_ptr + (e * blocks_n + tl.program_id(0)) * blocks_k + tl.program_id(1),
             tl.exp2((top - 127 - 6).to(tl.float32)))


def widen_into(w: Quantized, out: Quantized) -> Quantized:
    """w (MXFP4 [E, N, K]) widened into out's buffers (e4m3 in 128 x 128 blocks)."""
    experts, n, k = out.values.shape
    grid = (triton.cdiv(n, BLOCK), triton.cdiv(k, BLOCK), experts)
    widen_kernel[grid](w.values.view(torch.int32), w.scales.view(torch.uint8),
                       out.values.view(torch.int32), out.scales, n, k, BLOCK=BLOCK)
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
