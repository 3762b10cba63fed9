"""W4A8 prefill's core (docs/notes/2026-11-29-w4a8-prefill-design.md), one
expert, JIT-compiled by the GPU host's Triton: out[T, N] = x[T, K] @ w[N, K]^T
with the weights as wgmma's A operand from registers (128 weight rows a
program, 64 a warpgroup) and the tokens as B, TMA'd into a ring of shared
memory.  The tokens are fp8 per token, each 32-wide chunk of K stored in the
fragment's slot order (slot 16h + 4q + i holds K 8q + 4h + i), so that a
thread's eight weights of a chunk are one packed MXFP4 word.  Each word is
widened to e4m3 by two `prmt` lookups a half (lab/w4a8_tables_check.py's
tables), each weight row's groups shifted below the row's largest scale
(d = E - e, at most 11 here: the random exponents span 8); the row's scale
2^(E - 133) and the token's after the sum.

Against, in the same run: the same kernel on the weights already e4m3 in
the slot order (A loaded, nothing widened: what the widening costs);
torch._scaled_mm on the same fp8 operands, scaled per row and per token;
and gg_runtime's scaled_grouped_mm on one group, per channel on the same
operands and in 128 x 128 blocks (moe_experts' fp8 serving format): the
issue's reference, "our fp8".
Each output against float64.  Prefill shapes of gpt-oss (H = I = 2880) and
Kimi-K2 (H 7168, I 2048) at T = 4096 and 16384 rows of one expert.

Compiled by Triton 3.9 and 3.6 on a machine without a GPU (the A fragment's
layout conversion is trivial: assert_trivial holds); not yet run on one.
Each MMA is waited for before the next step's A is widened (Triton's wait
cannot keep an fp8 register operand live); at 128 tokens a tile two
programs an SM overlap.

    python lab/w4a8_probe.py [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
from triton.experimental import gluon

import gg_runtime
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from aot.kernels.gluon_api import tma_load
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import dequantize_mxfp4, random_mxfp4
from lab.w4a8_tables_check import SUBNORMAL_TABLES

BN = gl.constexpr(128)  # weight rows a program (two warpgroups of 64)
BK = gl.constexpr(128)
E4M3_MAX = 448.0
# (tokens a tile, ring stages, ptxas's register cap): 128 tokens with two
# programs of 8 warps an SM (128 registers), or 256 with one.
CONFIGS = ((128, 4, 128), (256, 3, 255))

# The widening of one packed word's half (shift 0: values 0 .. 3, 16: 4 ..
# 7) into four e4m3 bytes ($0), lab/w4a8_tables_check.py's `convert`, one
# output.  pack=4 over int32 inputs gives an instance four registers of each
# (the same word four times: fourfold): $1 the word, $5 and $9 the
# magnitude tables.
HALF_ASM = """{{
.reg .b32 w, m, e, o, s;
shr.b32 w, $1, {shift};
and.b32 m, w, 0x7777;
prmt.b32 $0, $5, $9, m;
shl.b32 e, w, 4;
and.b32 e, e, 0x8080;
and.b32 o, w, 0x8080;
prmt.b32 s, e, o, 0x5140;
or.b32 $0, $0, s;
}}"""
FIRST_ASM = gl.constexpr(HALF_ASM.format(shift=0))
SECOND_ASM = gl.constexpr(HALF_ASM.format(shift=16))


@gluon.constexpr_function
def words_layout(warps):
    """The packed words [BN, BK / 8] a thread widens into wgmma's A fragment
    (fp8, k_width 4, BK = 128): word 4c + q of rows r and r + 8, for lane
    4r' + q and the chunk c in its registers."""
    return gl.DistributedLinearLayout([[8, 0], [0, 4], [0, 8]],
                                      [[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                      [[16 * 2 ** i, 0] for i in range(warps.bit_length() - 1)],
                                      [], [BN.value, BK.value // 8])


@gluon.jit
def fourfold(x):
    """x [R, C] as [R, C, 4], each element four times (joins: no moves)."""
    two = gl.join(x, x)
    return gl.reshape(gl.join(two, two), [x.shape[0], x.shape[1], 4])


LOW_12, LOW_13, LOW_14 = (gl.constexpr(SUBNORMAL_TABLES[d][0]) for d in (12, 13, 14))
HIGH_12, HIGH_13, HIGH_14 = (gl.constexpr(SUBNORMAL_TABLES[d][1]) for d in (12, 13, 14))


@gluon.jit
def tables(d):
    """The e4m3 magnitudes of e2m1 codes 0 .. 3 and 4 .. 7 shifted down d
    binades (d <= 14)."""
    low = gl.where(d <= 11, 0x6C686000 - d * 0x08080800,
                   gl.where(d == 12, LOW_12, gl.where(d == 13, LOW_13, LOW_14)))
    high = gl.where(d <= 11, 0x7C787470 - d * 0x08080808,
                    gl.where(d == 12, HIGH_12, gl.where(d == 13, HIGH_13, HIGH_14)))
    return low, high


@gluon.jit
def widened(words, d, A_L: gl.constexpr):
    """words [BN, BK / 8] (words_layout) and their groups' shifts d -> the
    weights [BN, BK] e4m3 in A_L, K in the fragment's slot order."""
    low, high = tables(d)
    args = [fourfold(words), fourfold(low), fourfold(high)]
    constraints: gl.constexpr = "=r" + ",r" * 12
    first = gl.inline_asm_elementwise(FIRST_ASM, constraints, args, dtype=gl.float8e4nv,
                                      is_pure=True, pack=4)
    second = gl.inline_asm_elementwise(SECOND_ASM, constraints, args, dtype=gl.float8e4nv,
                                       is_pure=True, pack=4)
    rows: gl.constexpr = words.shape[0]
    # [rows, words, 2 (half h), 4 (i)]: K 8j + 4h + i, the natural order
    natural = gl.permute(gl.join(first, second), (0, 1, 3, 2))
    # word j = 4c + q: [rows, c, q1, q0, h, i] -> [rows, c, h, q1, q0, i], slot 32c + 16h + 4q + i
    parts = gl.reshape(natural, [rows, BK // 32, 2, 2, 2, 4])
    slots = gl.reshape(gl.permute(parts, (0, 1, 4, 2, 3, 5)), [rows, BK])
    return gl.convert_layout(slots, A_L, assert_trivial=True)


@gluon.jit
def widened_step(w_at, d_at, ok, words, k0, K, A_L: gl.constexpr):
    """Step k0's weights [BN, BK] e4m3 in A_L (widened's), zeros past K."""
    in_k = ok & gl.expand_dims(k0 // 8 + words < K // 8, 0)
    return widened(gl.load(w_at + k0 // 8, mask=in_k, other=0),
                   gl.load(d_at + k0 // 32, mask=in_k, other=0).to(gl.int32), A_L)


@gluon.jit
def w4a8_kernel(w_ptr, d_ptr, x_ptr, out_ptr, w_scale_ptr, x_scale_ptr, N, T, K,
                WIDEN: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr):
    """out [T, N] bf16 = (x [T, K] fp8, slot order) @ w^T, times w_scale[n] and
    x_scale[t].  WIDEN: w packed MXFP4 [N, K / 2] (as int32 words) with d
    [N, K / 32] uint8 each group's shift; else w e4m3 [N, K] in slot order."""
    warps: gl.constexpr = gl.num_warps()
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                                  instr_shape=[16, BT, 32])
    A_L: gl.constexpr = gl.DotOperandLayout(0, ACC, 4)
    W_L: gl.constexpr = words_layout(warps)
    off_n = gl.program_id(0) * BN
    off_t = gl.program_id(1) * BT
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BK], gl.float8e4nv)
    x_desc = tma.make_tensor_descriptor(x_ptr, [T, K], [K, 1], [BT, BK], x_layout)
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BT, BK], x_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    steps = gl.cdiv(K, BK)
    for i in gl.static_range(STAGES - 1):
        mbarrier.expect(ready.index(i), BT * BK, pred=i < steps)
        tma_load(x_desc, [off_t, i * BK], ready.index(i), x_bufs.index(i), pred=i < steps)
    if WIDEN:
        rows = off_n + gl.arange(0, BN, gl.SliceLayout(1, W_L))
        words = gl.arange(0, BK // 8, gl.SliceLayout(0, W_L))
        row_at = gl.expand_dims(rows, 1).to(gl.int64)
        w_at = w_ptr.to(gl.pointer_type(gl.int32)) + row_at * (K // 8) + gl.expand_dims(words, 0)
        d_at = d_ptr + row_at * (K // 32) + gl.expand_dims(words // 4, 0)
        ok = gl.expand_dims(rows < N, 1)
    else:
        rows = off_n + gl.arange(0, BN, gl.SliceLayout(1, A_L))
        cols = gl.arange(0, BK, gl.SliceLayout(0, A_L))
        w_at = w_ptr + gl.expand_dims(rows, 1).to(gl.int64) * K + gl.expand_dims(cols, 0)
        ok = gl.expand_dims(rows < N, 1)
    acc = gl.zeros([BN, BT], gl.float32, ACC)
    for s in range(steps):
        k0 = s * BK
        slot = s % STAGES
        if WIDEN:
            a = widened_step(w_at, d_at, ok, words, k0, K, A_L)
        else:
            a = gl.load(w_at + k0, mask=ok & gl.expand_dims(k0 + cols < K, 0), other=0.0)
        mbarrier.wait(ready.index(slot), s // STAGES & 1)
        # wgmma reads A's registers as it runs, and Triton's wait cannot keep an
        # fp8 tensor live: the MMA is waited for before the next step's A is made.
        # Two programs an SM (CONFIGS) overlap one's widening with the other's MMAs.
        acc = warpgroup_mma(a, x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        ahead = s + STAGES - 1
        refill = ahead % STAGES  # (s - 1) % STAGES: its MMA is done
        mbarrier.expect(ready.index(refill), BT * BK, pred=ahead < steps)
        tma_load(x_desc, [off_t, ahead * BK], ready.index(refill), x_bufs.index(refill),
                 pred=ahead < steps)
    n = off_n + gl.arange(0, BN, gl.SliceLayout(1, ACC))
    t = off_t + gl.arange(0, BT, gl.SliceLayout(0, ACC))
    w_scale = gl.load(w_scale_ptr + n, mask=n < N, other=0.0)
    x_scale = gl.load(x_scale_ptr + t, mask=t < T, other=0.0)
    out = acc * gl.expand_dims(w_scale, 1) * gl.expand_dims(x_scale, 0)
    at = out_ptr + gl.expand_dims(t, 0).to(gl.int64) * N + gl.expand_dims(n, 1)
    gl.store(at, out.to(gl.bfloat16), mask=gl.expand_dims(n < N, 1) & gl.expand_dims(t < T, 0))


def slot_order(k: int) -> torch.Tensor:
    """The natural K of each slot: slot 32c + 16h + 4q + i holds K 32c + 8q + 4h + i."""
    s = torch.arange(k)
    c, h, q, i = s // 32, s // 16 % 2, s // 4 % 4, s % 4
    return 32 * c + 8 * q + 4 * h + i


def mxfp4_rows(n: int, k: int):
    """(packed [N, K/2] uint8, e8m0 exponents [N, K/32] int32, the weights
    float64): gg_runtime.testing.w4's random MXFP4, exponents spanning 8."""
    w = random_mxfp4(1, n, k, exponents=(115, 123))
    weights = dequantize_mxfp4(w.values, w.scales)[0]
    return w.values.view(torch.uint8)[0], w.scales.view(torch.uint8)[0].int(), weights


def run_case(n: int, k: int, tokens: int, bt: int, stages: int, registers: int) -> dict:
    packed, exponents, weights = mxfp4_rows(n, k)
    largest = exponents.amax(dim=1)
    shifts = (largest[:, None] - exponents).to(torch.uint8)
    w_scale = torch.exp2(largest.double() - 133).float()
    # The same weights in e4m3 (exact: shifts <= 14), slot order, for the twin and torch.
    w_fp8 = (weights / w_scale[:, None].double()).float().to(torch.float8_e4m3fn)
    x = torch.randn(tokens, k, device="cuda")
    x_scale = (x.abs().amax(dim=1) / E4M3_MAX).float()
    x_fp8 = (x / x_scale[:, None]).to(torch.float8_e4m3fn)
    order = slot_order(k).cuda()
    x_slots = x_fp8[:, order].contiguous()
    reference = (x_fp8.double() * x_scale[:, None].double()) @ (
        w_fp8.double() * w_scale[:, None].double()).T
    out = {name: torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
           for name in ("w4a8", "fp8_A")}
    grid = (triton.cdiv(n, BN.value), triton.cdiv(tokens, bt))
    options = dict(BT=bt, STAGES=stages, num_warps=8, num_stages=1, maxnreg=registers)

    def w4a8():
        w4a8_kernel[grid](packed, shifts, x_slots, out["w4a8"], w_scale, x_scale, n, tokens, k,
                          WIDEN=True, **options)

    w_slots = w_fp8[:, order].contiguous()

    def fp8_a():
        w4a8_kernel[grid](w_slots, shifts, x_slots, out["fp8_A"], w_scale, x_scale, n, tokens, k,
                          WIDEN=False, **options)

    def scaled_mm():
        return torch._scaled_mm(x_fp8, w_fp8.T, scale_a=x_scale[:, None], scale_b=w_scale[None, :],
                                out_dtype=torch.bfloat16)

    # gg_runtime's fp8 product on one group, the reference: per channel (the same
    # operands) and in 128 x 128 blocks (moe_experts' fp8 serving format), fast accumulation.
    offs = torch.tensor([tokens], dtype=torch.int32, device="cuda")
    w_blocks = gg_runtime.quantize_fp8(weights.float().unsqueeze(0), "128x128")
    x_blocks = gg_runtime.quantize_fp8(x, "1x128")

    def ours_rowwise():
        return gg_runtime.scaled_grouped_mm(x_fp8, w_fp8.unsqueeze(0).transpose(1, 2), x_scale,
                                            w_scale[None, :], offs=offs, use_fast_accum=True)

    def ours_blockwise():
        return gg_runtime.scaled_grouped_mm(x_blocks.values, w_blocks.values.transpose(1, 2),
                                            x_blocks.scales, w_blocks.scales, offs=offs,
                                            use_fast_accum=True)

    errors = {}
    for name, fn in (("w4a8", w4a8), ("fp8_A", fp8_a)):
        out[name].fill_(float("nan"))
        fn()
        errors[name] = rel_error(out[name], reference)
    errors["torch_scaled_mm"] = rel_error(scaled_mm(), reference)
    errors["ours_rowwise"] = rel_error(ours_rowwise(), reference)
    times = time_in_turns({"w4a8": w4a8, "fp8_A": fp8_a, "torch_scaled_mm": scaled_mm,
                           "ours_rowwise": ours_rowwise, "ours_blockwise": ours_blockwise})
    flops = 2 * tokens * n * k
    return {"N": n, "K": k, "T": tokens, "BT": bt, "stages": stages, "errors": errors,
            "us": {name: ms * 1e3 for name, ms in times.items()},
            "tflops": {name: flops / ms / 1e9 for name, ms in times.items()}}


# (N, K) of one expert's products: gpt-oss's up (2I = 5760, H 2880) and down; Kimi-K2's.
SHAPES = ((5760, 2880), (2880, 2880), (4096, 7168), (7168, 2048))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    for n, k in SHAPES:
        for tokens in (4096, 16384):
            for bt, stages, registers in CONFIGS:
                row = run_case(n, k, tokens, bt, stages, registers)
                rows.append(row)
                print(f"N={n} K={k} T={tokens} BT={bt}: "
                      + " ".join(f"{name} {us:.1f} us ({row['tflops'][name]:.0f} TF, "
                                 f"err {row['errors'][name]:.1e})"
                                 for name, us in row["us"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
