"""W4A8 at decode through mma.sync's 8-bit MMAs, against the wheel's W4A16
decode kernel (aot/kernels/w4_decode.py: the weights widened to bfloat16 by
widen4.py's PTX) on the same experts' bytes; measured in
docs/notes/2026-11-29-w4a8-decode-probe.md.

- MXFP4 with e4m3 tokens (per token): an e2m1 value is an e4m3 byte with its
  bits moved (the value times 2^-6, subnormals included), seven instructions
  per eight values; the MMA is m16n8k32 e4m3, which ptxas emulates on Hopper
  (f16 conversions and f16 MMAs).
- INT4 (groups of 32, bfloat16 scales) with int8 tokens (per token): a
  two's complement nibble q becomes int8 16 q by a shift and a mask; the MMA
  is m16n8k32 s8 (native), its sums int32.
- MXFP4 with int8 tokens (mxfp4_s8): e2m1 times 2 as int8 from a prmt table,
  which cannot negate, so each group's positive part multiplies the tokens
  and its negative part their negatives, in two s8 MMAs.

The scales cannot ride in the operands, so each MMA covers one scale group:
the weights are pre-arranged (once, at load) so that byte i of each 64-value
block holds value i of its first group (low nibble) and of its second (high
nibble); the low nibbles are one MMA's operand, the high nibbles the next's,
each against its group's 32 token columns, each partial sum times its
group's scale added to float32 sums.  The weights are the MMA's first operand
(16 rows a tile), the tokens its second (8: T <= 8).  One program: BN rows of
one expert, all of K, PAIRS 64-value blocks a step; w4a8_decode_tma_kernel
brings the (MXFP4) bytes by TMA into a ring of STAGES steps instead.

    python lab/w4a8_decode_probe.py [--formats mxfp4,mxfp4_s8,int4] [--tokens 1,8] [--json OUT]
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

import gg_runtime
from aot.kernels.gluon_api import thread_barrier, tma_load
from aot.kernels.w4 import INT4_G32, MXFP4
from aot.kernels.w4_decode import w4_decode_down_kernel
from bench.measure import graphed
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import dequantize_int4, dequantize_mxfp4, random_int4, random_mxfp4

# The low nibbles of four bytes ($2) to e4m3 ($0: sign to bit 7, the other
# three bits to 4..2), the high nibbles likewise ($1).  lop3 0xE4: c ? a : b.
E2M1_TO_E4M3 = gl.constexpr("{\n.reg .b32 t, u;\n"
                "shl.b32 t, $2, 4;\nshl.b32 u, $2, 2;\nand.b32 u, u, 0x1C1C1C1C;\n"
                "lop3.b32 $0, t, u, 0x80808080, 0xE4;\n"
                "shr.b32 t, $2, 2;\nand.b32 t, t, 0x1C1C1C1C;\n"
                "lop3.b32 $1, $2, t, 0x80808080, 0xE4;\n}")

# Two's complement nibbles q of four bytes ($2) as int8 16 q: the low nibbles
# shifted up ($0), the high ones masked ($1).
INT4_TO_S8 = gl.constexpr("{\n.reg .b32 t;\nshl.b32 t, $2, 4;\nand.b32 $0, t, 0xF0F0F0F0;\n"
                          "and.b32 $1, $2, 0xF0F0F0F0;\n}")

# e2m1 codes ($4: four of the first group in bits 15..0, four of the second
# in 31..16) as int8 twice the value, each group's positive part ($0, $2:
# prmt's table of magnitudes, a set sign bit selecting 0 by sign extension)
# and negative part ($1, $3: the same with the signs flipped).
E2M1_TO_S8_PARTS = gl.constexpr(
    "{\n.reg .b32 f, h, lut0, lut1;\nmov.b32 lut0, 0x03020100;\nmov.b32 lut1, 0x0C080604;\n"
    "prmt.b32 $0, lut0, lut1, $4;\nxor.b32 f, $4, 0x88888888;\nprmt.b32 $1, lut0, lut1, f;\n"
    "shr.b32 h, $4, 16;\nprmt.b32 $2, lut0, lut1, h;\nshr.b32 f, f, 16;\n"
    "prmt.b32 $3, lut0, lut1, f;\n}")
E4M3, S8_INT4, S8_MXFP4 = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2)

# (name, experts, N, K): gpt-oss-20b's up (2I rows) and down over its k = 4
# experts, Kimi-K2 TP8's up and down over k = 8.
PRODUCTS = (("gpt_oss_up", 4, 5760, 2880), ("gpt_oss_down", 4, 2880, 2880),
            ("kimi_tp8_up", 8, 512, 7168), ("kimi_tp8_down", 8, 7168, 256))
# (BN, PAIRS: 64-value blocks a K step, warps, AHEAD: the next step's loads first)
CONFIGS = ((64, 4, 4, 0), (32, 4, 2, 0), (32, 8, 2, 0), (32, 8, 2, 1))
# w4a8_decode_tma_kernel's (BN, PAIRS, STAGES, warps): a TMA box's rows are at
# most 128 bytes (its 128-byte swizzle), so PAIRS <= 4.
MODES = {"mxfp4": E4M3, "int4": S8_INT4, "mxfp4_s8": S8_MXFP4}
TMA_CONFIGS = ((64, 4, 4, 4), (64, 4, 8, 4), (32, 4, 8, 2), (128, 4, 6, 4), (64, 2, 8, 4),
               (32, 4, 12, 2))
BASELINE = (64, 256, 4)  # the wheel's W4A16 decode config: BN, BK, warps (BM 16)


@gluon.constexpr_function
def mma_layout(warps):
    """mma.sync's accumulator [BN, 8]: the warps along the weights' rows."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[warps, 1],
                                     instr_shape=[16, 8])


@gluon.jit
def store_out(acc, out_ptr, xs_ptr, g, off_n, T, N, UNDO: gl.constexpr):
    """out[g, t, off_n + r] = acc[r, t] times token t's scale and UNDO, for t < T."""
    MMA: gl.constexpr = acc.type.layout
    rows = off_n + gl.expand_dims(gl.arange(0, acc.shape[0], gl.SliceLayout(1, MMA)), 1)
    cols = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, MMA)), 0)
    token_scale = gl.load(xs_ptr + cols, mask=cols < T, other=0.0) * UNDO
    gl.store(out_ptr + g * T * N + cols * N + rows, (acc * token_scale).to(gl.bfloat16),
             mask=(rows < N) & (cols < T))


@gluon.jit
def e8m0_to_float(e):
    """e8m0 bytes as float32 2^(e - 127) (e = 0 the subnormal 2^-127, 255 infinity)."""
    e = e.to(gl.int32)
    return gl.where(e == 0, 0x00400000, e << 23).to(gl.float32, bitcast=True)


@gluon.jit
def step_loads(w_at, s_at, k0, K, PAIRS: gl.constexpr):
    """A K step's pre-arranged bytes (a tuple of PAIRS [BN, 32] tensors) and
    raw scales (2 PAIRS [BN]), nothing past K."""
    words = ()
    raw = ()
    for p in gl.static_range(PAIRS):
        k = k0 + 64 * p
        ok = k < K
        words = words + (gl.load(w_at + k // 2, mask=ok, other=0),)
        raw = raw + (gl.load(s_at + k // 32, mask=ok, other=0),
                     gl.load(s_at + k // 32 + 1, mask=ok, other=0))
    return words, raw


@gluon.jit
def w4a8_decode_kernel(w_ptr, s_ptr, x_ptr, xn_ptr, xs_ptr, out_ptr, T, N, K,
                       BN: gl.constexpr, PAIRS: gl.constexpr, AHEAD: gl.constexpr,
                       MODE: gl.constexpr):
    """out [G, T, N] bf16 = (x [T, K] times xs [T]) @ W[g]^T for expert
    g = program_id(1), rows program_id(0) * BN ..: w [G, N, K / 2] the
    pre-arranged bytes, s [G, N, K / 32] their scales.  MODE: E4M3 (MXFP4, x
    e4m3, s e8m0), S8_INT4 (x int8, s bfloat16; two's complement nibbles q
    made int8 16 q) or S8_MXFP4 (x int8 and xn = -x, s e8m0; each e2m1 value
    times 2 as int8, its positive and negative parts in two MMAs, the second
    against -x).  T <= 8; K a multiple of 64."""
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    W_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 4)
    X_L: gl.constexpr = gl.DotOperandLayout(1, MMA, 4)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    g = gl.program_id(1).to(gl.int64)
    off_n = gl.program_id(0) * BN
    n_w = gl.minimum(off_n + gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(1, W_L)), 1), N - 1)
    kb = gl.expand_dims(gl.arange(0, 32, gl.SliceLayout(0, W_L)), 0)
    # Rows of whole 32-byte blocks (K a multiple of 64): a thread's 4-byte runs are one load.
    w_at = gl.multiple_of(w_ptr + g * N * (K // 2) + n_w.to(gl.int64) * (K // 2), [32, 32]) + kb
    kx = gl.expand_dims(gl.arange(0, 32, gl.SliceLayout(1, X_L)), 1)
    t = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, X_L)), 0)
    x_at = gl.multiple_of(x_ptr + t * K, [16, 16]) + kx
    xn_at = gl.multiple_of(xn_ptr + t * K, [16, 16]) + kx
    x_ok = t < T
    n_s = gl.minimum(off_n + gl.arange(0, BN, ROWS), N - 1)
    s_at = s_ptr + g * N * (K // 32) + n_s.to(gl.int64) * (K // 32)
    acc = gl.zeros([BN, 8], gl.float32, MMA)
    INT: gl.constexpr = MODE != E4M3
    zero = gl.zeros([BN, 8], gl.int32 if INT else gl.float32, MMA)
    STEP: gl.constexpr = 64 * PAIRS
    # AHEAD: the next step's bytes and scales loaded first, in flight while this
    # step converts and multiplies (else each step's loads, then its work).
    words, raw = step_loads(w_at, s_at, 0 if AHEAD else K, K, PAIRS)
    for k0 in range(0, K, STEP):
        if AHEAD:
            next_words, next_raw = step_loads(w_at, s_at, k0 + STEP, K, PAIRS)
        else:
            words, raw = step_loads(w_at, s_at, k0, K, PAIRS)
            next_words, next_raw = words, raw
        for p in gl.static_range(PAIRS):
            k = k0 + 64 * p
            ok = k < K
            xa = gl.load(x_at + k, mask=x_ok & ok, other=0 if INT else 0.0)
            xb = gl.load(x_at + k + 32, mask=x_ok & ok, other=0 if INT else 0.0)
            if MODE == S8_MXFP4:
                pa, na, pb, nb = gl.inline_asm_elementwise(
                    E2M1_TO_S8_PARTS, "=r,=r,=r,=r,r", [words[p]], dtype=(gl.int8,) * 4,
                    is_pure=True, pack=4)
                xna = gl.load(xn_at + k, mask=x_ok & ok, other=0)
                xnb = gl.load(xn_at + k + 32, mask=x_ok & ok, other=0)
                sum_a = mma_v2(na, xna, mma_v2(pa, xa, zero))
                sum_b = mma_v2(nb, xnb, mma_v2(pb, xb, zero))
            else:
                low, high = operands(words[p], INT)
                sum_a = mma_v2(low, xa, zero)
                sum_b = mma_v2(high, xb, zero)
            acc += sum_a.to(gl.float32) * group_scale(raw[2 * p], MODE == S8_INT4)
            acc += sum_b.to(gl.float32) * group_scale(raw[2 * p + 1], MODE == S8_INT4)
        words, raw = next_words, next_raw
    # e2m1 as e4m3 is the value times 2^-6; INT4 as int8 times 16; e2m1 as int8 times 2
    UNDO: gl.constexpr = 64.0 if MODE == E4M3 else (0.0625 if MODE == S8_INT4 else 0.5)
    store_out(acc, out_ptr, xs_ptr, g, off_n, T, N, UNDO)


@gluon.jit
def operands(packed, INT: gl.constexpr):
    """Pre-arranged bytes [BN, 32] -> the MMA's first operands (low nibbles,
    high nibbles): e4m3, or with INT int8 16 q."""
    if INT:
        return gl.inline_asm_elementwise(INT4_TO_S8, "=r,=r,r", [packed],
                                         dtype=(gl.int8, gl.int8), is_pure=True, pack=4)
    else:
        return gl.inline_asm_elementwise(E2M1_TO_E4M3, "=r,=r,r", [packed],
                                         dtype=(gl.float8e4nv, gl.float8e4nv), is_pure=True,
                                         pack=4)


@gluon.jit
def group_scale(raw, INT: gl.constexpr):
    """A group's scales [BN] (e8m0 bytes, or with INT bfloat16) as float32 [BN, 1]."""
    if INT:
        return gl.expand_dims(raw.to(gl.float32), 1)
    else:
        return gl.expand_dims(e8m0_to_float(raw), 1)


@gluon.jit
def w4a8_decode_tma_kernel(w_ptr, s_ptr, x_ptr, xs_ptr, out_ptr, T, N, K, G, BN: gl.constexpr,
                           PAIRS: gl.constexpr, STAGES: gl.constexpr):
    """w4a8_decode_kernel's contract, the weights' bytes brought by TMA into a
    ring of STAGES steps (PAIRS 64-value blocks a step), STAGES - 1 steps
    ahead: bytes in flight without registers."""
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    W_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 4)
    X_L: gl.constexpr = gl.DotOperandLayout(1, MMA, 4)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    BYTES: gl.constexpr = 32 * PAIRS  # a step's bytes of a row
    ring_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BYTES], gl.uint8)
    w_desc = tma.make_tensor_descriptor(w_ptr, [G * N, K // 2], [K // 2, 1], [BN, BYTES],
                                        ring_layout)
    ring = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, BYTES], ring_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    g = gl.program_id(1)
    off_n = gl.program_id(0) * BN
    row = g * N + off_n
    steps = gl.cdiv(K, 64 * PAIRS)
    for i in gl.static_range(STAGES - 1):
        mbarrier.expect(ready.index(i), BN * BYTES, pred=i < steps)
        tma_load(w_desc, [row, i * BYTES], ready.index(i), ring.index(i), pred=i < steps)
    kx = gl.expand_dims(gl.arange(0, 32, gl.SliceLayout(1, X_L)), 1)
    t = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, X_L)), 0)
    x_at = gl.multiple_of(x_ptr + t * K, [16, 16]) + kx
    x_ok = t < T
    n_s = gl.minimum(off_n + gl.arange(0, BN, ROWS), N - 1)
    s_at = s_ptr + g.to(gl.int64) * N * (K // 32) + n_s.to(gl.int64) * (K // 32)
    acc = gl.zeros([BN, 8], gl.float32, MMA)
    zero = gl.zeros([BN, 8], gl.float32, MMA)
    for s in range(steps):
        slot = s % STAGES
        mbarrier.wait(ready.index(slot), s // STAGES & 1)
        for p in gl.static_range(PAIRS):
            k = s * 64 * PAIRS + 64 * p
            ok = k < K
            packed = ring.index(slot).slice(32 * p, 32, dim=1).load(W_L)
            low, high = gl.inline_asm_elementwise(
                E2M1_TO_E4M3, "=r,=r,r", [packed], dtype=(gl.float8e4nv, gl.float8e4nv),
                is_pure=True, pack=4)
            xa = gl.load(x_at + k, mask=x_ok & ok, other=0.0)
            xb = gl.load(x_at + k + 32, mask=x_ok & ok, other=0.0)
            sa = e8m0_to_float(gl.load(s_at + k // 32, mask=ok, other=0))
            sb = e8m0_to_float(gl.load(s_at + k // 32 + 1, mask=ok, other=0))
            acc += mma_v2(low, xa, zero) * gl.expand_dims(sa, 1)
            acc += mma_v2(high, xb, zero) * gl.expand_dims(sb, 1)
        thread_barrier()  # every warp is done with slot s - 1 + STAGES's bytes: refill it
        ahead = s + STAGES - 1
        refill = ahead % STAGES
        mbarrier.expect(ready.index(refill), BN * BYTES, pred=ahead < steps)
        tma_load(w_desc, [row, ahead * BYTES], ready.index(refill), ring.index(refill),
                 pred=ahead < steps)
    store_out(acc, out_ptr, xs_ptr, g.to(gl.int64), off_n, T, N, 64.0)  # e2m1 as e4m3: x 2^-6


def pre_arranged(packed: torch.Tensor, words: bool = False) -> torch.Tensor:
    """MXFP4 or INT4 bytes [G, N, K / 2] (value 2c in byte c's low nibble) ->
    the kernel's: byte i of each 64-value block = value i of its first 32
    (low nibble) | value i of its second 32 (high nibble).  With `words`,
    the block's 32-bit word j holds values 4j .. 4j + 3 of its first 32 in
    its low 16 bits and of its second 32 in its high 16 bits (a nibble each,
    in order)."""
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)  # [G, N, K]
    blocks = codes.unflatten(-1, (-1, 2, 32))
    if words:
        pairs = blocks[..., 0::2] | (blocks[..., 1::2] << 4)  # [.., 2, 16]: a byte, two values
        word = torch.cat((pairs[..., 0, :].unflatten(-1, (8, 2)),
                          pairs[..., 1, :].unflatten(-1, (8, 2))), dim=-1)  # [.., 8, 4]
        return word.flatten(-3).contiguous()
    return (blocks[..., 0, :] | (blocks[..., 1, :] << 4)).flatten(-2).contiguous()


def operands_of(fmt, experts, n, k, tokens):
    """(packed as the wheel stores it, scales, the kernel's pre-arranged bytes,
    the float64 weights [G, N, K], tokens x [T, K] float32, the kernel's
    quantized tokens, their negatives and their scales [T]) of a random case
    in `fmt` (mxfp4: e4m3 tokens; mxfp4_s8 and int4: int8 tokens)."""
    x = torch.randn(tokens, k, device="cuda")
    if fmt == "int4":  # groups of 32, stored q + 8; the kernel's nibbles are q (two's complement)
        w = random_int4(experts, n, k)
        packed, scales = w.values, w.scales
        exact = dequantize_int4(packed, scales)
        arranged = pre_arranged(packed ^ 0x88)
    else:
        w = random_mxfp4(experts, n, k, exponents=(115, 123))
        packed, scales = w.values.view(torch.uint8), w.scales.view(torch.uint8)
        exact = dequantize_mxfp4(packed, scales)
        arranged = pre_arranged(packed, words=fmt == "mxfp4_s8")
    if fmt == "mxfp4":
        xq, xs = gg_runtime.quantize_fp8(x, "rowwise")[:2]
        return packed, scales, arranged, exact, x, xq, xq, xs
    xs = x.abs().amax(dim=1) / 127
    xq = (x / xs[:, None]).round().clamp(-127, 127).to(torch.int8)
    return packed, scales, arranged, exact, x, xq, -xq, xs


def run_product(name, fmt, experts, n, k, tokens):
    packed, scales, arranged, exact, x, x_q, x_neg, x_scale = operands_of(fmt, experts, n, k,
                                                                         tokens)
    want = torch.einsum("tk,gnk->gtn", x_q.double() * x_scale.double()[:, None], exact)
    unquantized = torch.einsum("tk,gnk->gtn", x.bfloat16().double(), exact)
    launches, errors, against_bf16_tokens = {}, {}, {}
    for bn, pairs, warps, ahead in CONFIGS:
        out = torch.full((experts, tokens, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        label = f"w4a8_{bn}x{pairs}x{warps}" + ("_ahead" if ahead else "")

        def launch(out=out, bn=bn, pairs=pairs, warps=warps, ahead=ahead):
            w4a8_decode_kernel[(triton.cdiv(n, bn), experts)](
                arranged, scales, x_q, x_neg, x_scale, out, tokens, n, k, BN=bn, PAIRS=pairs,
                AHEAD=ahead, MODE=MODES[fmt], num_warps=warps)

        launch()
        errors[label] = rel_error(out.double(), want)
        against_bf16_tokens[label] = rel_error(out.double(), unquantized)
        launches[label] = graphed(launch)
    for bn, pairs, stages, warps in TMA_CONFIGS if fmt == "mxfp4" else ():
        out = torch.full((experts, tokens, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        label = f"tma_{bn}x{pairs}x{stages}x{warps}"

        def launch(out=out, bn=bn, pairs=pairs, stages=stages, warps=warps):
            w4a8_decode_tma_kernel[(triton.cdiv(n, bn), experts)](
                arranged, scales, x_q, x_scale, out, tokens, n, k, experts, BN=bn,
                PAIRS=pairs, STAGES=stages, num_warps=warps)

        launch()
        errors[label] = rel_error(out.double(), want)
        launches[label] = graphed(launch)
    # The wheel's W4A16 decode kernel on the same bytes: each expert's rows the tokens (bf16).
    x16 = x.bfloat16().repeat(experts, 1)
    rows = experts * tokens
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * tokens
    out16 = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bn, bk, warps = BASELINE
    units = triton.cdiv(n, bn) * min(rows, experts)
    groups = k // scales.shape[-1]

    def baseline():
        w4_decode_down_kernel[(min(units, 3 * 132),)](
            x16, packed, out16, offs, scales, rows, n, k, experts, k, n * (k // 2), k // 2,
            n * (k // groups), k // groups, n, out16, 0,
            FORMAT=INT4_G32 if fmt == "int4" else MXFP4, USE_TMA=False, BM=16, BN=bn, BK=bk,
            CHUNK=0, PRECISION=0, num_warps=warps)

    baseline()
    want16 = torch.einsum("tk,gnk->gtn", x.bfloat16().double(), widened_values(fmt, exact))
    errors["w4a16_wheel"] = rel_error(out16.view(experts, tokens, n).double(), want16)
    launches["w4a16_wheel"] = graphed(baseline)
    for label, error in errors.items():
        assert error < 1e-2, f"{name} {fmt} T={tokens} {label}: relative error {error:.2e}"
    times = time_in_turns(launches)
    weight_bytes = packed.numel() + scales.numel() * scales.element_size()
    against_bf16_tokens["w4a16_wheel"] = rel_error(out16.view(experts, tokens, n).double(),
                                                   unquantized)
    return {"product": name, "format": fmt, "experts": experts, "N": n, "K": k, "T": tokens,
            "errors": errors, "against_bf16_tokens": against_bf16_tokens,
            "us": {label: ms * 1e3 for label, ms in times.items()},
            "TBps": {label: weight_bytes / ms / 1e9 for label, ms in times.items()}}


def widened_values(fmt, exact):
    """The weights as the W4A16 kernel multiplies them: MXFP4's exact, INT4's
    q * scale rounded to bfloat16."""
    return exact.bfloat16().double() if fmt == "int4" else exact


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--tokens", default="1,8")
    parser.add_argument("--formats", default="mxfp4,mxfp4_s8,int4")
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    for (name, experts, n, k), fmt in itertools.product(PRODUCTS, args.formats.split(",")):
        for tokens in map(int, args.tokens.split(",")):
            row = run_product(name, fmt, experts, n, k, tokens)
            rows.append(row)
            base = row["us"]["w4a16_wheel"]
            print(f"{name} {fmt} T={tokens}: " + " ".join(
                f"{label} {us:.1f} us ({base / us:.2f}x, {row['TBps'][label]:.2f} TB/s, "
                f"err {row['errors'][label]:.1e}, "
                f"against bf16 tokens {row['against_bf16_tokens'].get(label, float('nan')):.1e})"
                for label, us in row["us"].items()),
                flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
