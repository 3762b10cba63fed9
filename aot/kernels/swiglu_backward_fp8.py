"""SwiGLU's backward for fp8 training with 1x128 blocks (DeepSeek-V3's
recipe): swiglu.py's backward with its outputs quantized as the backward's
fp8 products read them, in one pass over gu and the gradient instead of a
16-bit write and three quantizing reads.

Inputs as swiglu.py's backward: gu [R, 2C] (gate and up halves, concatenated
or INTERLEAVED), grad [R, C] (the gradient of h before the routing weight),
scale [R] float32; and offs int32 [G], the groups of rows (ragged.py's
group_row_ranges reads them).  Rows past the last group (dropped slots) are
not read and nothing of theirs is written.  Outputs:

dgu_q [R, 2C] fp8, dgu_scale [R, 2C / 128]   d(gu) quantized along its rows
                                               (quantize.py's BLOCK_1X128): the
                                               input gradient's operand
dgu_cols [2C, W] fp8, dgu_cols_scale          d(gu) quantized along T within
[R // 128 + G, 2C]                             the groups (quantize_columns.py's
                                               BLOCK_1X128 layout, W = 128 (R //
                                               128 + G)): w13's gradient's operand
h_cols [C, W] fp8, h_cols_scale               h scaled by the routing weight,
[R // 128 + G, C]                              the same way: w2's gradient's operand
dot [cdiv(C, 128), R] float32                 row r's sum of grad * h over
                                               columns 128 p .. 128 p + 128 at
                                               [p, r]: summed over p, swiglu.py's dot

Each value is rounded to gu's dtype before it is quantized, as swiglu.py
stores it: the fp8 outputs are quantize_fp8's and quantize_fp8_columns' of
swiglu_backward's outputs.  Concatenated halves need C to be a multiple of
128 (each half's 1x128 blocks then start at a half's block boundary).

A tile is one 128-row block of a group by 128 of h's columns (two 1x128
blocks of d(gu) along its rows: one of each half, or two of gate/up pairs),
taken BK columns at a time in two passes.  The first stores
the column-quantized outputs (a column's 128 rows are all in the tile) and
the dot partials and takes each row's amax per block; the second recomputes
the values from the same loads (cache hits) and stores them quantized along
the rows.  Memory-bound.
"""
import triton
import triton.language as tl

from .quantize import BLOCK, scale_of, to_e4m3
from .quantize_columns import quantize_block_columns, tile_place
from .ragged import group_row_ranges
from .swiglu import activate, gate_and_up
from .tiles import first_step_past


@triton.jit
def gradients(gu_ptr, grad_ptr, scale, rows, row_ok, c0, C, INTERLEAVED: tl.constexpr,
              GPT_OSS: tl.constexpr, SUB: tl.constexpr):
    """(d gate, d up, h * scale) of rows x h's columns c0 .. c0 + SUB, each
    rounded to gu's dtype, as float32 [BLOCK, SUB]; and each row's sum of
    grad * h over them (h rounded as the forward rounds it)."""
    cols = c0 + tl.arange(0, SUB)
    dtype = gu_ptr.dtype.element_ty
    gate, up = gate_and_up(gu_ptr, rows, c0, row_ok, C, INTERLEAVED, BLOCK, SUB)
    h, d_gate, d_up = activate(gate, up, GPT_OSS)
    h = h.to(dtype).to(tl.float32)
    grad = tl.load(grad_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :],
                   mask=row_ok[:, None] & (cols < C)[None, :], other=0.0).to(tl.float32)
    dh = grad * scale[:, None]
    return ((dh * d_gate).to(dtype).to(tl.float32), (dh * d_up).to(dtype).to(tl.float32),
            (h * scale[:, None]).to(dtype).to(tl.float32), tl.sum(grad * h, axis=1))


@triton.jit
def halves_columns(c, C, INTERLEAVED: tl.constexpr, SUB: tl.constexpr):
    """d(gu)'s columns of the gate and the up of h's columns c .. c + SUB."""
    cols = c + tl.arange(0, SUB)
    if INTERLEAVED:
        return 2 * cols, 2 * cols + 1
    return cols, C + cols


@triton.jit
def store_rows(q_ptr, x, scale, rows, row_ok, cols, width):
    """x [BLOCK, SUB] quantized by its rows' scales, at columns `cols` of q's
    rows (q [R, width])."""
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * width + cols[None, :],
             to_e4m3(x, scale[:, None]), mask=row_ok[:, None] & (cols < width)[None, :],
             cache_modifier=".cs")


@triton.jit
def block_tile(gu_ptr, grad_ptr, scale_ptr, dgu_q_ptr, dgu_scale_ptr, dgu_cols_ptr,
               dgu_cols_scale_ptr, h_cols_ptr, h_cols_scale_ptr, dot_ptr, start, end, block, j,
               c0, R, C, W, INTERLEAVED: tl.constexpr, GPT_OSS: tl.constexpr,
               SUB: tl.constexpr):
    """Block j of a group (the column-quantized outputs' block `block`), h's
    columns c0 .. c0 + BLOCK.  Along its rows d(gu) has two 1x128 blocks
    here, a and b: the gate's and the up's (concatenated), or the pairs of
    h's columns c0 .. c0 + 64 and c0 + 64 .. c0 + 128 (interleaved)."""
    PAIRS_STEPS: tl.constexpr = BLOCK // 2 // SUB  # steps of one interleaved 1x128 block
    rows = start + j * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < end
    scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    amax_a = tl.zeros((BLOCK,), dtype=tl.float32)
    amax_b = tl.zeros((BLOCK,), dtype=tl.float32)
    dot = tl.zeros((BLOCK,), dtype=tl.float32)
    # Runtime loops, not static ones: the second pass's loads must not be
    # merged with the first's (the whole tile would stay in registers).
    for step in range(0, BLOCK // SUB):
        c = c0 + step * SUB
        d_gate, d_up, hs, dot_step = gradients(gu_ptr, grad_ptr, scale, rows, row_ok, c, C,
                                               INTERLEAVED, GPT_OSS, SUB)
        dot += dot_step
        quantize_block_columns(hs, h_cols_ptr, h_cols_scale_ptr, block, c + tl.arange(0, SUB), C,
                               W)
        gate_cols, up_cols = halves_columns(c, C, INTERLEAVED, SUB)
        quantize_block_columns(d_gate, dgu_cols_ptr, dgu_cols_scale_ptr, block, gate_cols, 2 * C,
                               W)
        quantize_block_columns(d_up, dgu_cols_ptr, dgu_cols_scale_ptr, block, up_cols, 2 * C, W)
        amax_gate = tl.max(tl.abs(d_gate), axis=1)
        amax_up = tl.max(tl.abs(d_up), axis=1)
        if INTERLEAVED:
            amax = tl.maximum(amax_gate, amax_up)
            in_a = step < PAIRS_STEPS
            amax_a = tl.where(in_a, tl.maximum(amax_a, amax), amax_a)
            amax_b = tl.where(in_a, amax_b, tl.maximum(amax_b, amax))
        else:
            amax_a = tl.maximum(amax_a, amax_gate)
            amax_b = tl.maximum(amax_b, amax_up)
    tl.store(dot_ptr + (c0 // BLOCK) * R + rows, dot, mask=row_ok)
    scale_a = scale_of(amax_a)
    scale_b = scale_of(amax_b)
    row_scales = dgu_scale_ptr + rows.to(tl.int64) * tl.cdiv(2 * C, BLOCK)
    if INTERLEAVED:
        tl.store(row_scales + 2 * c0 // BLOCK, scale_a, mask=row_ok)
        has_b = c0 + SUB * PAIRS_STEPS < C
        tl.store(row_scales + 2 * c0 // BLOCK + 1, scale_b, mask=row_ok & has_b)
    else:
        tl.store(row_scales + c0 // BLOCK, scale_a, mask=row_ok)
        tl.store(row_scales + (C + c0) // BLOCK, scale_b, mask=row_ok)
    for step in range(0, BLOCK // SUB):
        c = c0 + step * SUB
        d_gate, d_up, _, _ = gradients(gu_ptr, grad_ptr, scale, rows, row_ok, c, C, INTERLEAVED,
                                       GPT_OSS, SUB)
        gate_cols, up_cols = halves_columns(c, C, INTERLEAVED, SUB)
        if INTERLEAVED:
            scale_gate = tl.where(step < PAIRS_STEPS, scale_a, scale_b)
            scale_up = scale_gate
        else:
            scale_gate = scale_a
            scale_up = scale_b
        store_rows(dgu_q_ptr, d_gate, scale_gate, rows, row_ok, gate_cols, 2 * C)
        store_rows(dgu_q_ptr, d_up, scale_up, rows, row_ok, up_cols, 2 * C)


@triton.jit
def swiglu_backward_fp8_kernel(gu_ptr, grad_ptr, scale_ptr, offs_ptr, dgu_q_ptr, dgu_scale_ptr,
                               dgu_cols_ptr, dgu_cols_scale_ptr, h_cols_ptr, h_cols_scale_ptr,
                               dot_ptr, R, C, G, INTERLEAVED: tl.constexpr,
                               GPT_OSS: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                               BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                               PRECISION: tl.constexpr):
    """Persistent: program p takes tiles p, p + P, ... of every group's
    block tiles in group order, columns fastest (quantize_columns.py's
    scan of the groups, CHUNK at a time).  The runtime launches min(the
    family's `tiles`, one wave) programs.  USE_TMA and PRECISION (GEMM
    constexprs every variant receives) are unused; BK is the columns a step takes."""
    tl.static_assert(not USE_TMA, "swiglu_backward_fp8 has no TMA path")
    tl.static_assert(BK <= BLOCK // 2, "a step's columns are within one interleaved block")
    tl.static_assert(BM == BLOCK, "a tile's rows are one 128-row block")
    tl.static_assert(BN == BLOCK, "a tile's columns are 128 of h's")
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    col_tiles = tl.cdiv(C, BN)
    W = (R // BLOCK + G) * BLOCK
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G, CHUNK):
        starts, ends = group_row_ranges(offs_ptr, chunk, G, R, rows_before, CHUNK)
        group_tiles = tl.cdiv(ends - starts, BLOCK) * col_tiles
        tiles_end = tiles_before + tl.cumsum(group_tiles, 0)
        chunk_end = tiles_before + tl.sum(group_tiles)
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            g, start, end, in_group = tile_place(t, chunk, starts, ends, group_tiles, tiles_end,
                                                 CHUNK)
            j = in_group // col_tiles
            block_tile(gu_ptr, grad_ptr, scale_ptr, dgu_q_ptr, dgu_scale_ptr, dgu_cols_ptr,
                       dgu_cols_scale_ptr, h_cols_ptr, h_cols_scale_ptr, dot_ptr, start, end,
                       start // BLOCK + g + j, j, (in_group % col_tiles) * BN, R, C, W,
                       INTERLEAVED, GPT_OSS, BK)
        tiles_before = chunk_end
        rows_before = tl.max(ends)
