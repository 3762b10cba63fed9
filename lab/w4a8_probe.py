"""W4A8 prefill's core (docs/notes/2026-11-29-w4a8-prefill-design.md), one
expert, JIT-compiled by the GPU host's Triton: out[T, N] = x[T, K] @ w[N, K]^T,
the weights packed MXFP4 widened to e4m3 in the kernel, the tokens fp8 per
token, TMA'd into a ring of shared memory.  Each packed word is widened by
two `prmt` lookups a half (lab/w4a8_tables_check.py's tables), each weight
row's groups shifted below the row's largest scale (d = E - e, at most 11
here: the random exponents span 8); the row's scale 2^(E - 133) and the
token's after the sum.  Three kernels:

- w4a8_kernel: the weights as wgmma's A operand from registers, 128 rows a
  program, all 8 warps widening then multiplying in turn.  The tokens' K is
  stored in the fragment's slot order (each 32-wide chunk's slot
  16h + 4q + i holds K 8q + 4h + i), so that a thread's eight weights of a
  chunk are one packed word.
- w4a8_ws_kernel: the same A from registers, warp-specialised: PARTS
  warpgroups of 64 rows each, apart (one widens while another's MMAs run),
  and a one-warp TMA loader.  GROUPED: each thread's words of a step are one
  scale group's (the tokens in grouped_slot_order), so that a row's tables
  are built once a step; REPLICATED: the signs placed by prmt's
  sign-replicating selectors.  w4a8_ragged_kernel runs its program over
  routed experts' groups (lab/w4a8_experts_probe.py).
- w4a8_ss_kernel: a widening partition stores the weights into shared
  memory (tokens in K's natural order); the MMA partition's two
  warpgroups take both operands from shared memory, one MMA in flight.

Against, in the same run: torch._scaled_mm on the same fp8 operands, scaled
per row and per token; gg_runtime's scaled_grouped_mm on one group, per
channel on the same operands and in 128 x 128 blocks (moe_experts' fp8
serving format: the issue's reference, "our fp8").  Each output against
float64 (the blockwise one against the unquantized product).  Prefill
shapes of gpt-oss (H = I = 2880) and Kimi-K2 (H 7168, I 2048) at T = 4096
and 16384 rows of one expert.  docs/notes/2026-11-29-w4a8-prefill-probe.md
has the measurements.

    python lab/w4a8_probe.py [--json OUT] [--bk 128|256] [--only NAME_PREFIX]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
from triton.experimental import gluon

import gg_runtime
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from aot.kernels.gluon_api import thread_barrier, tma_load
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import dequantize_mxfp4, random_mxfp4
from lab.w4a8_tables_check import SUBNORMAL_TABLES

BN = gl.constexpr(128)  # weight rows a program (two warpgroups of 64)
# K a step (--bk sets it before the kernels compile: 128 or 256).
BK = gl.constexpr(128)
# (tokens a tile, ring stages, ptxas's register cap): 128 tokens with two
# programs of 8 warps an SM (128 registers), or 256 with one.
CONFIGS = ((128, 4, 128), (256, 3, 255))
# The warp-specialised kernel's (tokens a tile, ring stages, MMA partitions):
# one program an SM (the kernel's cap 65536 / (32 x (4 PARTS + 4)), as
# aot/kernels/ws.max_registers; the partitions take what the loader gives back).
# (GROUPED, REPLICATED: widen_mma's; a 128-deep step only.)
WS_CONFIGS = ((128, 4, 2, False, False), (256, 4, 2, False, False), (128, 4, 3, False, False),
              (256, 4, 2, False, True), (256, 4, 2, True, False), (256, 4, 2, True, True))
# The shared-memory kernel's (tokens a tile, ring stages, widening warps).
SS_CONFIGS = ((256, 3, 4), (256, 4, 4), (128, 4, 4), (128, 4, 8))


@gluon.constexpr_function
def widener_registers(warps):
    """The widening partition's registers: what the MMA partition's 8 warps leave."""
    return min((65536 - 256 * 200) // (32 * warps) // 8 * 8, 160)


@gluon.constexpr_function
def ws_registers(parts):
    """An MMA partition's registers: the SM's 64K less the loader warpgroup's 40 each."""
    return min((65536 - 128 * 40) // (128 * parts) // 8 * 8, 240)

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
# The same with the signs by prmt's sign-replicating selectors (bit 3 of a
# selector nibble: the selected byte's top bit in all eight bits): byte j's
# sign is nibble j's top bit, at bit 7 of a byte of the word (odd j) or of
# the word shifted left 4 (even j); one AND-OR (LOP3) puts the signs in.
REPLICATED_ASM = """{{
.reg .b32 w, m, e, s;
shr.b32 w, $1, {shift};
and.b32 m, w, 0x7777;
prmt.b32 $0, $5, $9, m;
shl.b32 e, $1, 4;
prmt.b32 s, e, $1, {signs};
and.b32 s, s, 0x80808080;
or.b32 $0, $0, s;
}}"""
FIRST_REPLICATED_ASM = gl.constexpr(REPLICATED_ASM.format(shift=0, signs="0xD9C8"))
SECOND_REPLICATED_ASM = gl.constexpr(REPLICATED_ASM.format(shift=16, signs="0xFBEA"))


@gluon.constexpr_function
def words_layout(warps):
    """The packed words [16 x warps, BK / 8] a thread widens into wgmma's A fragment
    (fp8, k_width 4): word 4c + q of rows r and r + 8, for lane 4r' + q and
    each chunk c in its registers."""
    words = BK.value // 8
    chunks = [[0, 4 << i] for i in range(words.bit_length() - 3)]
    return gl.DistributedLinearLayout([[8, 0]] + chunks,
                                      [[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                      [[16 * 2 ** i, 0] for i in range(warps.bit_length() - 1)],
                                      [], [16 * warps, words])


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
def halves(words, low, high, REPLICATED: gl.constexpr):
    """Fourfold words and tables (fourfold's) -> each word's e4m3 values
    [..., 4 (i), 2 (half h)]: half h holds values 4h + i.  REPLICATED: the
    signs by prmt's sign mode (REPLICATED_ASM), else HALF_ASM's."""
    args = [words, low, high]
    constraints: gl.constexpr = "=r" + ",r" * 12
    first_asm: gl.constexpr = FIRST_REPLICATED_ASM if REPLICATED else FIRST_ASM
    second_asm: gl.constexpr = SECOND_REPLICATED_ASM if REPLICATED else SECOND_ASM
    first = gl.inline_asm_elementwise(first_asm, constraints, args, dtype=gl.float8e4nv,
                                      is_pure=True, pack=4)
    second = gl.inline_asm_elementwise(second_asm, constraints, args, dtype=gl.float8e4nv,
                                       is_pure=True, pack=4)
    return gl.join(first, second)


@gluon.jit
def widened(words, d, A_L: gl.constexpr, REPLICATED: gl.constexpr = False):
    """words [BN, BK / 8] (words_layout) and their groups' shifts d -> the
    weights [BN, BK] e4m3 in A_L, K in the fragment's slot order."""
    low, high = tables(d)
    rows: gl.constexpr = words.shape[0]
    # [rows, words, 2 (half h), 4 (i)]: K 8j + 4h + i, the natural order
    natural = gl.permute(halves(fourfold(words), fourfold(low), fourfold(high), REPLICATED),
                         (0, 1, 3, 2))
    # word j = 4c + q: [rows, c, q1, q0, h, i] -> [rows, c, h, q1, q0, i], slot 32c + 16h + 4q + i
    parts = gl.reshape(natural, [rows, BK // 32, 2, 2, 2, 4])
    slots = gl.reshape(gl.permute(parts, (0, 1, 4, 2, 3, 5)), [rows, BK])
    return gl.convert_layout(slots, A_L, assert_trivial=True)


@gluon.jit
def word_pointers(w_ptr, d_ptr, first_row, N, K, ROWS: gl.constexpr, W_L: gl.constexpr):
    """(words' addresses [ROWS, BK / 8] in W_L, their groups' shift addresses,
    the rows' mask [ROWS, 1], the words' indices) of weight rows first_row .. at k = 0."""
    rows = first_row + gl.arange(0, ROWS, gl.SliceLayout(1, W_L))
    words = gl.arange(0, BK // 8, gl.SliceLayout(0, W_L))
    row_at = gl.expand_dims(rows, 1).to(gl.int64)
    w_at = w_ptr.to(gl.pointer_type(gl.int32)) + row_at * (K // 8) + gl.expand_dims(words, 0)
    d_at = d_ptr + row_at * (K // 32) + gl.expand_dims(words // 4, 0)
    return w_at, d_at, gl.expand_dims(rows < N, 1), words


@gluon.jit
def packed_step(w_at, d_at, ok, words, k0, K):
    """Step k0's packed words [BN, BK / 8] and their groups' shifts (int32:
    kept live across the MMA's wait), zeros past K."""
    in_k = ok & gl.expand_dims(k0 // 8 + words < K // 8, 0)
    return (gl.load(w_at + k0 // 8, mask=in_k, other=0),
            gl.load(d_at + k0 // 32, mask=in_k, other=0).to(gl.int32))


@gluon.jit
def store_scaled(acc, out_ptr, w_scale_ptr, x_scale_ptr, off_n, off_t, N, T):
    """out[t, n] = acc [rows, tokens] at (off_n, off_t) times w_scale[n] and x_scale[t], bf16."""
    ACC: gl.constexpr = acc.type.layout
    n = off_n + gl.arange(0, acc.shape[0], gl.SliceLayout(1, ACC))
    t = off_t + gl.arange(0, acc.shape[1], gl.SliceLayout(0, ACC))
    w_scale = gl.load(w_scale_ptr + n, mask=n < N, other=0.0)
    x_scale = gl.load(x_scale_ptr + t, mask=t < T, other=0.0)
    out = acc * gl.expand_dims(w_scale, 1) * gl.expand_dims(x_scale, 0)
    at = out_ptr + gl.expand_dims(t, 0).to(gl.int64) * N + gl.expand_dims(n, 1)
    gl.store(at, out.to(gl.bfloat16), mask=gl.expand_dims(n < N, 1) & gl.expand_dims(t < T, 0))


@gluon.jit
def w4a8_kernel(w_ptr, d_ptr, x_ptr, out_ptr, w_scale_ptr, x_scale_ptr, N, T, K,
                BT: gl.constexpr, STAGES: gl.constexpr):
    """out [T, N] bf16 = (x [T, K] fp8, slot order) @ w^T, times w_scale[n] and
    x_scale[t]: w packed MXFP4 [N, K / 2] (read as int32 words) with d
    [N, K / 32] uint8 each group's shift.  All 8 warps widen, then MMA, in turn."""
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
    w_at, d_at, ok, words = word_pointers(w_ptr, d_ptr, off_n, N, K, BN, W_L)
    acc = gl.zeros([BN, BT], gl.float32, ACC)
    # The weights are loaded a step ahead in registers: the load's latency
    # overlaps this step's MMA (the wait below would otherwise expose it).
    next_words, next_d = packed_step(w_at, d_at, ok, words, 0, K)
    for s in range(steps):
        slot = s % STAGES
        a = widened(next_words, next_d, A_L)
        next_words, next_d = packed_step(w_at, d_at, ok, words, (s + 1) * BK, K)
        mbarrier.wait(ready.index(slot), s // STAGES & 1)
        # wgmma reads A's registers as it runs, and Triton's wait cannot keep an
        # fp8 tensor live (nor does ptxas order a later write to them after the
        # MMA): the MMA is waited for before the next step's A is made.
        acc = warpgroup_mma(a, x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        ahead = s + STAGES - 1
        refill = ahead % STAGES  # (s - 1) % STAGES: its MMA is done
        mbarrier.expect(ready.index(refill), BT * BK, pred=ahead < steps)
        tma_load(x_desc, [off_t, ahead * BK], ready.index(refill), x_bufs.index(refill),
                 pred=ahead < steps)
    store_scaled(acc, out_ptr, w_scale_ptr, x_scale_ptr, off_n, off_t, N, T)

@gluon.jit
def x_loader(x_desc, x_bufs, ready, empty, off_t, K, BT: gl.constexpr, STAGES: gl.constexpr):
    """The warp-specialised kernel's loader: the tokens' K blocks into the
    ring, each slot once both MMA partitions have freed it."""
    for s in range(gl.cdiv(K, BK)):
        slot = s % STAGES
        mbarrier.wait(empty.index(slot), (s // STAGES & 1) ^ 1)
        mbarrier.expect(ready.index(slot), BT * BK)
        tma_load(x_desc, [off_t, s * BK], ready.index(slot), x_bufs.index(slot))


@gluon.constexpr_function
def grouped_words_layout(warps):
    """The packed words [16 x warps, 4 groups, 4 words] of a 128-deep step
    (GROUPED): lane 4r' + q holds group q's four words (natural K 32q ..
    32q + 31) of rows r and r + 8, one group's scale for all of them."""
    return gl.DistributedLinearLayout([[0, 0, 1], [0, 0, 2], [8, 0, 0]],
                                      [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
                                      [[16 * 2 ** i, 0, 0] for i in range(warps.bit_length() - 1)],
                                      [], [16 * warps, 4, 4])


@gluon.jit
def widened_grouped(words, d, A_L: gl.constexpr, REPLICATED: gl.constexpr):
    """words [R, 4, 4] (grouped_words_layout) and d [R, 4] -> the weights [R, 128]
    e4m3 in A_L: slot 32c + 16h + 4q + i holds natural K 32q + 8c + 4h + i."""
    low, high = tables(d)
    low, _ = gl.broadcast(gl.expand_dims(low, 2), words)
    high, _ = gl.broadcast(gl.expand_dims(high, 2), words)
    rows: gl.constexpr = words.shape[0]
    # [rows, q, c, h, i] -> [rows, c, h, q, i]
    natural = gl.permute(halves(fourfold3(words), fourfold3(low), fourfold3(high), REPLICATED),
                         (0, 1, 2, 4, 3))
    slots = gl.reshape(gl.permute(natural, (0, 2, 3, 1, 4)), [rows, 128])
    return gl.convert_layout(slots, A_L, assert_trivial=True)


@gluon.jit
def fourfold3(x):
    """x [R, G, W] as [R, G, W, 4], each element four times (joins: no moves)."""
    two = gl.join(x, x)
    return gl.reshape(gl.join(two, two), [x.shape[0], x.shape[1], x.shape[2], 4])


@gluon.jit
def widen_mma(part: gl.constexpr, w_ptr, d_ptr, x_bufs, ready, empty, out_ptr, w_scale_ptr,
              x_scale_ptr, N, T, K, off_n, off_t, BT: gl.constexpr, STAGES: gl.constexpr,
              GROUPED: gl.constexpr, REPLICATED: gl.constexpr):
    """One warpgroup's 64 weight rows (off_n + 64 part ..) of the program's
    tile: widen, MMA, wait, free the slot; the other warpgroup's MMAs run
    while this one widens (no CTA-wide barrier between them).  GROUPED: each
    thread's words of a step are one scale group's (widened_grouped's slot
    order); else words_layout's.  REPLICATED: the signs by prmt's sign mode."""
    warps: gl.constexpr = gl.num_warps()
    ROWS: gl.constexpr = 16 * warps
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                                  instr_shape=[16, BT, 32])
    A_L: gl.constexpr = gl.DotOperandLayout(0, ACC, 4)
    if GROUPED:
        gl.static_assert(BK == 128, "a thread's 32 values of a row are one group")
        W3: gl.constexpr = grouped_words_layout(warps)
        D_L: gl.constexpr = gl.SliceLayout(2, W3)
        rows = off_n + part * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, D_L))
        groups = gl.arange(0, 4, gl.SliceLayout(0, D_L))
        words = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, W3)))
        row_at = gl.expand_dims(rows, 1).to(gl.int64)
        d_at = d_ptr + row_at * (K // 32) + gl.expand_dims(groups, 0)
        d_ok = gl.expand_dims(rows < N, 1) & gl.expand_dims(groups >= 0, 0)
        group_at = row_at * (K // 8) + gl.expand_dims(groups * 4, 0)
        w_at = (w_ptr.to(gl.pointer_type(gl.int32)) + gl.expand_dims(group_at, 2)
                + gl.expand_dims(gl.expand_dims(words, 0), 1))
        w_ok = gl.expand_dims(d_ok, 2)
        group_k = gl.expand_dims(groups * 32, 0)
        next_words = gl.load(w_at, mask=w_ok & gl.expand_dims(group_k < K, 2), other=0)
        next_d = gl.load(d_at, mask=d_ok & (group_k < K), other=0).to(gl.int32)
    else:
        W_L: gl.constexpr = words_layout(warps)
        w_at, d_at, ok, words = word_pointers(w_ptr, d_ptr, off_n + part * ROWS, N, K, ROWS, W_L)
        next_words, next_d = packed_step(w_at, d_at, ok, words, 0, K)
    acc = gl.zeros([ROWS, BT], gl.float32, ACC)
    for s in range(gl.cdiv(K, BK)):
        slot = s % STAGES
        k_next = (s + 1) * BK
        if GROUPED:
            a = widened_grouped(next_words, next_d, A_L, REPLICATED)
            in_k = k_next + group_k < K
            next_words = gl.load(w_at + k_next // 8, mask=w_ok & gl.expand_dims(in_k, 2), other=0)
            next_d = gl.load(d_at + k_next // 32, mask=d_ok & in_k, other=0).to(gl.int32)
        else:
            a = widened(next_words, next_d, A_L, REPLICATED)
            next_words, next_d = packed_step(w_at, d_at, ok, words, k_next, K)
        mbarrier.wait(ready.index(slot), s // STAGES & 1)
        acc = warpgroup_mma(a, x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index(slot))
    store_scaled(acc, out_ptr, w_scale_ptr, x_scale_ptr, off_n + part * ROWS, off_t, N, T)


@gluon.jit
def ws_tile(w_ptr, d_ptr, x_ptr, out_ptr, w_scale_ptr, x_scale_ptr, N, T, end, K, off_n, off_t,
            BT: gl.constexpr, STAGES: gl.constexpr, PARTS: gl.constexpr,
            GROUPED: gl.constexpr, REPLICATED: gl.constexpr):
    """The warp-specialised program of weight rows off_n .. and token rows
    off_t .. end (x [T, cdiv(K, BK) BK], its rows padded with zeros to whole
    steps): PARTS warpgroups of 64 weight rows each (num_warps = 4 a
    partition) and a one-warp TMA loader.  GROUPED, REPLICATED: widen_mma's."""
    KX = gl.cdiv(K, BK) * BK
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BK], gl.float8e4nv)
    x_desc = tma.make_tensor_descriptor(x_ptr, [T, KX], [KX, 1], [BT, BK], x_layout)
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BT, BK], x_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=PARTS)
    gl.warp_specialize(
        [(widen_mma, (p, w_ptr, d_ptr, x_bufs, ready, empty, out_ptr, w_scale_ptr, x_scale_ptr,
                      N, end, K, off_n, off_t, BT, STAGES, GROUPED, REPLICATED))
         if p < PARTS else
         (x_loader, (x_desc, x_bufs, ready, empty, off_t, K, BT, STAGES))
         for p in ((0, 1, 2) if PARTS == 2 else (0, 1, 2, 3))],
        [4] * (PARTS - 1) + [1], [ws_registers(PARTS)] * (PARTS - 1) + [40])


@gluon.jit
def w4a8_ws_kernel(w_ptr, d_ptr, x_ptr, out_ptr, w_scale_ptr, x_scale_ptr, N, T, K,
                   BT: gl.constexpr, STAGES: gl.constexpr, PARTS: gl.constexpr,
                   GROUPED: gl.constexpr = False, REPLICATED: gl.constexpr = False):
    """w4a8_kernel's contract, warp-specialised (ws_tile's), x's rows padded
    with zeros to whole steps (x [T, cdiv(K, BK) BK])."""
    ws_tile(w_ptr, d_ptr, x_ptr, out_ptr, w_scale_ptr, x_scale_ptr, N, T, T, K,
            gl.program_id(0) * (64 * PARTS), gl.program_id(1) * BT, BT, STAGES, PARTS, GROUPED,
            REPLICATED)


@gluon.jit
def w4a8_ragged_kernel(w_ptr, d_ptr, x_ptr, out_ptr, w_scale_ptr, x_scale_ptr, tiles_ptr,
                       ends_ptr, N, T, K, BT: gl.constexpr, STAGES: gl.constexpr,
                       PARTS: gl.constexpr, GROUPED: gl.constexpr,
                       REPLICATED: gl.constexpr):
    """The experts' products over ragged groups: x [T, cdiv(K, BK) BK] fp8, its
    rows grouped by expert (group g's end ends_ptr[g]), w [G, N, K / 2]
    packed MXFP4, d [G, N, K / 32] shifts, w_scale [G, N]; program (n, i)
    takes weight rows 64 PARTS n .. of tile i = (group, first row) of
    tiles_ptr [tiles, 2] (a tile's rows past its group's end are read, not
    written)."""
    tile = gl.program_id(1)
    g = gl.load(tiles_ptr + 2 * tile)
    off_t = gl.load(tiles_ptr + 2 * tile + 1)
    end = gl.load(ends_ptr + g)
    expert = g.to(gl.int64)
    ws_tile(w_ptr + expert * N * (K // 2), d_ptr + expert * N * (K // 32), x_ptr, out_ptr,
            w_scale_ptr + expert * N, x_scale_ptr, N, T, end, K, gl.program_id(0) * (64 * PARTS),
            off_t, BT, STAGES, PARTS, GROUPED, REPLICATED)


@gluon.jit
def widened_natural(words, d):
    """words [R, BK / 8] int32 and their groups' shifts d -> the weights [R, BK]
    e4m3 in K's natural order (word j's eight values are K 8j .. 8j + 7)."""
    low, high = tables(d)
    natural = gl.permute(halves(fourfold(words), fourfold(low), fourfold(high), False),
                         (0, 1, 3, 2))  # [R, words, half, i]
    return gl.reshape(natural, [words.shape[0], BK])


@gluon.jit
def widen_into_ring(w_ptr, d_ptr, x_desc, a_bufs, x_bufs, ready, empty, N, K, off_n, off_t,
                    BT: gl.constexpr, STAGES: gl.constexpr):
    """The shared-memory kernel's producer: for each K block, once the MMA
    partition has freed the slot, TMA the tokens' block into it and widen
    the weights' block into its A buffer (stores, a proxy fence, the
    partition's barrier, then one arrival: the MMAs read it by the async proxy)."""
    W_L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [gl.num_warps(), 1], [1, 0])
    w_at, d_at, ok, words = word_pointers(w_ptr, d_ptr, off_n, N, K, BN, W_L)
    next_words, next_d = packed_step(w_at, d_at, ok, words, 0, K)
    for s in range(gl.cdiv(K, BK)):
        slot = s % STAGES
        mbarrier.wait(empty.index(slot), (s // STAGES & 1) ^ 1)
        mbarrier.expect(ready.index(slot), BT * BK)
        tma_load(x_desc, [off_t, s * BK], ready.index(slot), x_bufs.index(slot))
        a = widened_natural(next_words, next_d)
        next_words, next_d = packed_step(w_at, d_at, ok, words, (s + 1) * BK, K)
        a_bufs.index(slot).store(a)
        fence_async_shared()
        thread_barrier()
        mbarrier.arrive(ready.index(slot))


@gluon.jit
def mma_from_ring(a_bufs, x_bufs, ready, empty, out_ptr, w_scale_ptr, x_scale_ptr, N, T, K,
                  off_n, off_t, BT: gl.constexpr, STAGES: gl.constexpr):
    """The shared-memory kernel's MMAs, one in flight, and its epilogue."""
    warps: gl.constexpr = gl.num_warps()
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                                  instr_shape=[16, BT, 32])
    acc = gl.zeros([BN, BT], gl.float32, ACC)
    steps = gl.cdiv(K, BK)
    for s in range(steps):
        slot = s % STAGES
        mbarrier.wait(ready.index(slot), s // STAGES & 1)
        fence_async_shared()
        acc = warpgroup_mma(a_bufs.index(slot), x_bufs.index(slot).permute((1, 0)), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(1, deps=(acc, ))  # the MMA before is done with its slot
        mbarrier.arrive(empty.index((s + STAGES - 1) % STAGES), pred=s > 0)
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    store_scaled(acc, out_ptr, w_scale_ptr, x_scale_ptr, off_n, off_t, N, T)


@gluon.jit
def w4a8_ss_kernel(w_ptr, d_ptr, x_ptr, out_ptr, w_scale_ptr, x_scale_ptr, N, T, K,
                   BT: gl.constexpr, STAGES: gl.constexpr, WIDENERS: gl.constexpr):
    """w4a8_kernel's contract but the tokens in K's natural order: a
    partition of WIDENERS warps widens each weight block into shared memory
    (and has TMA bring the tokens' block); the program's 8 warps (two
    warpgroups, 128 weight rows) take both as wgmma's shared operands."""
    off_n = gl.program_id(0) * BN
    off_t = gl.program_id(1) * BT
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BK], gl.float8e4nv)
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.float8e4nv)
    x_desc = tma.make_tensor_descriptor(x_ptr, [T, K], [K, 1], [BT, BK], x_layout)
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BT, BK], x_layout)
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], a_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=2)  # the expect's arrival and the wideners'
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [(mma_from_ring, (a_bufs, x_bufs, ready, empty, out_ptr, w_scale_ptr, x_scale_ptr, N, T,
                          K, off_n, off_t, BT, STAGES)),
         (widen_into_ring, (w_ptr, d_ptr, x_desc, a_bufs, x_bufs, ready, empty, N, K, off_n,
                            off_t, BT, STAGES))],
        [WIDENERS], [widener_registers(WIDENERS)])


def slot_order(k: int) -> torch.Tensor:
    """The natural K of each slot: slot 32c + 16h + 4q + i holds K 32c + 8q + 4h + i."""
    s = torch.arange(k)
    c, h, q, i = s // 32, s // 16 % 2, s // 4 % 4, s % 4
    return 32 * c + 8 * q + 4 * h + i


def grouped_slot_order(k: int) -> torch.Tensor:
    """widened_grouped's: in each 128-deep step (k a multiple of 128), slot
    32c + 16h + 4q + i holds K 32q + 8c + 4h + i."""
    s = torch.arange(k)
    b, c, h, q, i = s // 128, s // 32 % 4, s // 16 % 2, s // 4 % 4, s % 4
    return 128 * b + 32 * q + 8 * c + 4 * h + i


def mxfp4_rows(n: int, k: int):
    """(packed [N, K/2] uint8, e8m0 exponents [N, K/32] int32, the weights
    float64): gg_runtime.testing.w4's random MXFP4, exponents spanning 8."""
    w = random_mxfp4(1, n, k, exponents=(115, 123))
    weights = dequantize_mxfp4(w.values, w.scales)[0]
    return w.values.view(torch.uint8)[0], w.scales.view(torch.uint8)[0].int(), weights


def ws_kernel_registers(parts: int) -> int:
    """ptxas's cap for the warp-specialised kernels: PARTS warpgroups and the
    loader's within 64K registers (as aot/kernels/ws.max_registers)."""
    return 65536 // (32 * (4 * parts + 4)) // 8 * 8


def padded_tokens(x_fp8: torch.Tensor, order) -> torch.Tensor:
    """x_fp8 [T, K] padded with zeros to whole 128-deep steps and its
    columns in `order` (slot_order or grouped_slot_order): the
    warp-specialised kernels' tokens."""
    padded = torch.nn.functional.pad(x_fp8, (0, -x_fp8.shape[1] % 128))
    return padded[:, order(padded.shape[1]).cuda()].contiguous()


def run_case(n: int, k: int, tokens: int, only: str) -> dict:
    packed, exponents, weights = mxfp4_rows(n, k)
    largest = exponents.amax(dim=1)
    shifts = (largest[:, None] - exponents).to(torch.uint8)
    w_scale = torch.exp2(largest.double() - 133).float()
    # The same weights in e4m3 (exact: shifts <= 14) for torch and per-channel ours.
    w_fp8 = (weights / w_scale[:, None].double()).float().to(torch.float8_e4m3fn)
    x = torch.randn(tokens, k, device="cuda")
    x_fp8, x_scale = gg_runtime.quantize_fp8(x, "rowwise")[:2]
    x_slots = x_fp8[:, slot_order(k).cuda()].contiguous()
    reference = (x_fp8.double() * x_scale[:, None].double()) @ (
        w_fp8.double() * w_scale[:, None].double()).T
    args = (packed, shifts, x_slots)
    scales = (w_scale, x_scale, n, tokens, k)
    ours = {}
    for bt, stages, registers in CONFIGS:
        ours[f"w4a8_{bt}"] = (
            lambda out, bt=bt, stages=stages, registers=registers: w4a8_kernel[
                (triton.cdiv(n, BN.value), triton.cdiv(tokens, bt))](
                *args, out, *scales, BT=bt, STAGES=stages, num_warps=8, num_stages=1,
                maxnreg=registers))
    x_padded_slots = padded_tokens(x_fp8, slot_order)
    x_grouped = padded_tokens(x_fp8, grouped_slot_order)
    for bt, stages, parts, grouped, replicated in WS_CONFIGS:
        name = f"w4a8_ws_{bt}x{parts}" + ("_grouped" if grouped else "") + (
            "_replicated" if replicated else "")
        ours[name] = (
            lambda out, bt=bt, stages=stages, parts=parts, grouped=grouped, replicated=replicated:
            w4a8_ws_kernel[(triton.cdiv(n, 64 * parts), triton.cdiv(tokens, bt))](
                packed, shifts, x_grouped if grouped else x_padded_slots, out, *scales, BT=bt,
                STAGES=stages, PARTS=parts, GROUPED=grouped, REPLICATED=replicated, num_warps=4,
                num_stages=1, maxnreg=ws_kernel_registers(parts)))
    for bt, stages, wideners in SS_CONFIGS:
        ours[f"w4a8_ss_{bt}s{stages}w{wideners}"] = (
            lambda out, bt=bt, stages=stages, wideners=wideners: w4a8_ss_kernel[
                (triton.cdiv(n, BN.value), triton.cdiv(tokens, bt))](
                packed, shifts, x_fp8, out, *scales, BT=bt, STAGES=stages, WIDENERS=wideners,
                num_warps=8, num_stages=1, maxnreg=65536 // (32 * (8 + wideners)) // 8 * 8))
    errors, timed = {}, {}
    for name, launch in ((name, launch) for name, launch in ours.items() if name.startswith(only)):
        out = torch.full((tokens, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch(out)
        errors[name] = rel_error(out, reference)
        timed[name] = lambda launch=launch, out=out: launch(out)

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

    errors["torch_scaled_mm"] = rel_error(scaled_mm(), reference)
    errors["ours_rowwise"] = rel_error(ours_rowwise(), reference)
    # Blockwise quantizes the float weights and tokens itself: its error is against their product.
    errors["ours_blockwise"] = rel_error(ours_blockwise(), x.double() @ weights.T)
    times = time_in_turns({**timed, "torch_scaled_mm": scaled_mm, "ours_rowwise": ours_rowwise,
                           "ours_blockwise": ours_blockwise})
    flops = 2 * tokens * n * k
    return {"N": n, "K": k, "T": tokens, "errors": errors,
            "us": {name: ms * 1e3 for name, ms in times.items()},
            "tflops": {name: flops / ms / 1e9 for name, ms in times.items()}}


# (N, K) of one expert's products: gpt-oss's up (2I = 5760, H 2880) and down; Kimi-K2's.
SHAPES = ((5760, 2880), (2880, 2880), (4096, 7168), (7168, 2048))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--bk", type=int, default=128)
    parser.add_argument("--only", default="", help="time only our kernels whose names start so")
    args = parser.parse_args()
    global BK, WS_CONFIGS
    BK = gl.constexpr(args.bk)
    if args.bk == 256:  # a ring of 256-deep token blocks: fewer stages fit
        WS_CONFIGS = ((128, 4, 2, False, False), (256, 2, 2, False, False))
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    for n, k in SHAPES:
        for tokens in (4096, 16384):
            row = run_case(n, k, tokens, args.only)
            rows.append(row)
            print(f"N={n} K={k} T={tokens}: "
                  + " ".join(f"{name} {us:.1f} us ({row['tflops'][name]:.0f} TF, "
                             f"err {row['errors'][name]:.1e})"
                             for name, us in row["us"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
