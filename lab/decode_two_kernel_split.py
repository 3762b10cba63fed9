"""The split decode forward as the wheel ran it until the one-launch kernel
(aot/kernels/experts_decode_split.py) replaced it, kept for the probes that
measured it (lab/decode_split_probe.py): moe_experts' fp8 forward for few
slots with H spread over programs, then the scaled_decode_up and
scaled_decode_down families: the units of
kernels/experts_decode.py (a tile of an expert's slots and a 128-column
chunk of h), each cut into `splits` parts of H, in two kernels:

    up:   gu[split, slot] = the unit's gate and up rows of w13[g] over
          split's part of H (its K) times q(x[token])   float32 [S, 2I] a split
    down: h = act(sum over splits of gu) quantized per slot over the chunk;
          part[slot, chunk] = w2[g][split's part of H (its rows), chunk] @ h

combine.combine_parts_kernel then sums each token's slots' chunks, as after
the one-kernel forward.  Why: at decode a call has few units (DeepSeek-V3's
tensor-parallel shards, I = 128 or 256, have one chunk: a token's k units),
and one unit a program leaves most SMs idle while k of them read every
weight byte; here a unit's bytes are read by `splits` programs.  The up
projection's sum over H needs every split before the activation: gu goes
through memory between the two kernels.

The quantities are the one-kernel forward's (x quantized per token per 128
columns, or given per token; h per slot per 128 columns): only the order of
the up projection's sum over H differs.  gu's columns: gate j at j, up j at
I + j whatever w13's gate/up layout.  Persistent: program p takes units
p, p + programs, ... of units x splits; BM, BN, BK as the one-kernel
forward's; CHUNK and PRECISION are unused.
"""
import triton
import triton.language as tl

from aot.kernels.experts_decode import (CHUNK_COLUMNS, down_parts, locate_unit, quantized_h,
                                        slot_groups, token_rows, w2_descriptor, w13_descriptor,
                                        w13_product)
from aot.kernels.scaled import SCALE_BLOCK


@triton.jit
def scaled_decode_up_kernel(x_ptr, xq_ptr, x_scale_ptr, ids_ptr, k, w13_ptr, w13_scale_ptr, gu_ptr,
                            S, H, N, G, splits, w13_group_stride, ld13, SCALING: tl.constexpr,
                            GLU: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                            BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                            PRECISION: tl.constexpr):
    """x, xq, x_scale, ids, k, w13 and its scales as
    scaled_experts_decode_kernel's; gu [splits, S, N = 2I] float32 (a dropped
    slot's rows left as they are)."""
    tl.static_assert(BK == SCALE_BLOCK, "one K step a scale block")
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    w13_desc = w13_descriptor(w13_ptr, G, inter, H, w13_group_stride, ld13, GLU, BK)
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    per_split = tl.cdiv(tl.cdiv(H, BK), splits) * BK
    for t in range(tl.program_id(0), tl.sum(groups[2]) * splits, tl.num_programs(0)):
        g, slots, row_ok, column = locate_unit(t // splits, groups, chunks, BM)
        split = t % splits
        k_lo = split * per_split
        x = token_rows(x_ptr, xq_ptr, x_scale_ptr, k, slots, row_ok, H, SCALING)
        w13 = (w13_desc, w13_scale_ptr, g, column * CHUNK_COLUMNS, inter)
        k_range = (k_lo, tl.minimum(k_lo + per_split, H), H)
        gate = w13_product(w13, 0, x, k_range, SCALING, GLU, BM, BK).T
        up = w13_product(w13, 1, x, k_range, SCALING, GLU, BM, BK).T
        j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
        rows = gu_ptr + (split * S + slots.to(tl.int64))[:, None] * N + j[None, :]
        mask = row_ok[:, None] & (j < inter)[None, :]
        tl.store(rows, gate, mask=mask)
        tl.store(rows + inter, up, mask=mask)


@triton.jit
def part_sums(rows, mask, step, inter, splits):
    """(gate, up): the unit's rows of gu (rows: pointers into the first part's
    gate columns, mask [BM, 128], parts `step` elements apart) summed over
    the splits, four parts' loads in flight at a time: one after another,
    their latency was most of what the sum cost (lab/decode_split_probe.py
    --down)."""
    gate = tl.zeros(rows.shape, dtype=tl.float32)
    up = tl.zeros(rows.shape, dtype=tl.float32)
    for s0 in range(0, splits, 4):
        at = rows + s0 * step
        g0 = tl.load(at, mask=mask, other=0.0)
        u0 = tl.load(at + inter, mask=mask, other=0.0)
        g1 = tl.load(at + step, mask=mask & (s0 + 1 < splits), other=0.0)
        u1 = tl.load(at + step + inter, mask=mask & (s0 + 1 < splits), other=0.0)
        g2 = tl.load(at + 2 * step, mask=mask & (s0 + 2 < splits), other=0.0)
        u2 = tl.load(at + 2 * step + inter, mask=mask & (s0 + 2 < splits), other=0.0)
        g3 = tl.load(at + 3 * step, mask=mask & (s0 + 3 < splits), other=0.0)
        u3 = tl.load(at + 3 * step + inter, mask=mask & (s0 + 3 < splits), other=0.0)
        gate += (g0 + g1) + (g2 + g3)
        up += (u0 + u1) + (u2 + u3)
    return gate, up


@triton.jit
def scaled_decode_down_kernel(gu_ptr, ids_ptr, w2_ptr, w2_scale_ptr, b13_ptr, has_b13, b2_ptr,
                              has_b2, activation, parts_ptr, S, H, N, G, splits, w2_group_stride,
                              ld2, SCALING: tl.constexpr, GLU: tl.constexpr,
                              USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                              BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """gu [splits, S, N = 2I] float32, scaled_decode_up_kernel's; ids, w2
    and its scales, b13, b2, activation and parts [S, C, H] as
    scaled_experts_decode_kernel's (GLU: b13's gate/up layout)."""
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    w2 = (w2_descriptor(w2_ptr, G, inter, H, w2_group_stride, ld2, BN), w2_scale_ptr,
          (b13_ptr, has_b13, b2_ptr, has_b2, activation))
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    per_split = tl.cdiv(tl.cdiv(H, BN), splits) * BN
    for t in range(tl.program_id(0), tl.sum(groups[2]) * splits, tl.num_programs(0)):
        g, slots, row_ok, column = locate_unit(t // splits, groups, chunks, BM)
        n_lo = (t % splits) * per_split
        j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
        mask = row_ok[:, None] & (j < inter)[None, :]
        gate, up = part_sums(gu_ptr + slots.to(tl.int64)[:, None] * N + j[None, :], mask,
                             S.to(tl.int64) * N, inter, splits)
        h, h_scale = quantized_h(gate, up, w2[2], g, column, inter, GLU)
        down_parts(w2, h, h_scale, parts_ptr, g, slots, row_ok, column, chunks,
                   (n_lo, tl.minimum(n_lo + per_split, H), H), SCALING, BN)
