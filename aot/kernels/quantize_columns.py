"""fp8 (e4m3) quantisation of x [T, C] along its columns, within groups of
rows: the operands of a ragged-K fp8 product (a weight gradient, whose sum
runs over each group's rows) quantised along that sum, stored K-major.

Group g's rows are [s_g, e_g), the offsets read as ragged.py's
group_row_range reads them.  Its 128-row blocks start at its first row and
are columns 128 * b_g .. of q, b_g = s_g // 128 + g: every group's blocks
fit in W = 128 * (T // 128 + G) columns without overlap (b_g plus the
group's block count is at most b_{g+1}), the last block of a group is cut at
its end and padded with zeros, and no block spans two groups.

q [C, W] float8_e4m3fn, row-major: q[c, 128 * b_g + i] = x[s_g + i, c]
quantised; columns in no group's blocks are not written.  Scales float32,
quantize.py's rule (scale_of, to_e4m3), MODE saying what one covers:

ROWWISE        a column of a group          scale [G, C]; an empty group's
                                            is the all-zero one, 1e-12 / 448
BLOCK_1X128    a column of a 128-row block  scale [T // 128 + G, C], at
                                            [b_g + j, c] for block j of g

Scales are stored block by block (a row per group or block), so that a
GEMM tile's scales of one block are contiguous: the weight gradient's
pipeline loads a tile's scales of one block in one contiguous run.

Memory-bound: a tile is BM = 128 rows (one block) by BN columns, loaded
along x's rows and stored along q's, its scales one per column.
"""
import triton
import triton.language as tl

from .quantize import BLOCK, BLOCK_1X128, ROWWISE, scale_of, to_e4m3
from .ragged import group_row_ranges
from .tiles import first_step_past, pick


@triton.jit
def load_block(x_ptr, start, end, j, col0, C, ldx, gather, BN: tl.constexpr,
               EVICTION: tl.constexpr):
    """Block j of the group [start, end), columns col0 .. col0 + BN, as
    float32 [BLOCK, BN]: zeros past the group's end and past C.  gather =
    (rows_ptr, rows_div): row r is x's row rows_ptr[r] // rows_div where
    rows_div is not 0."""
    rows = start + j * BLOCK + tl.arange(0, BLOCK)
    cols = col0 + tl.arange(0, BN)
    in_group = rows < end
    rows_ptr, rows_div = gather
    if rows_div != 0:
        source = tl.load(rows_ptr + rows, mask=in_group, other=0) // rows_div
    else:
        source = rows.to(tl.int64)
    mask = in_group[:, None] & (cols < C)[None, :]
    x = tl.load(x_ptr + source[:, None] * ldx + cols[None, :], mask=mask, other=0.0,
                eviction_policy=EVICTION)
    return x.to(tl.float32)


@triton.jit
def store_block(q_ptr, q, block, col0, C, W, BN: tl.constexpr):
    """q [BLOCK, BN] (rows of x, its columns col0 ..) as columns 128 * block ..
    of q's rows col0 .. (q [C, W]); all 128, so a cut block's rest is its zeros."""
    cols = col0 + tl.arange(0, BN)
    at = cols.to(tl.int64)[None, :] * W + block * BLOCK + tl.arange(0, BLOCK)[:, None]
    tl.store(q_ptr + at, q, mask=(cols < C)[None, :], cache_modifier=".cs")


@triton.jit
def block_tile(x_ptr, q_ptr, scale_ptr, start, end, block, j, col0, C, ldx, W, gather,
               BN: tl.constexpr):
    """Block j of a group (q's column block `block`), BN columns: read once."""
    x = load_block(x_ptr, start, end, j, col0, C, ldx, gather, BN, "")
    scale = scale_of(tl.max(tl.abs(x), axis=0))
    cols = col0 + tl.arange(0, BN)
    tl.store(scale_ptr + block.to(tl.int64) * C + cols, scale, mask=cols < C)
    store_block(q_ptr, to_e4m3(x, scale[None, :]), block, col0, C, W, BN)


@triton.jit
def group_tile(x_ptr, q_ptr, scale_ptr, g, start, end, first_block, col0, C, ldx, W, gather,
               BN: tl.constexpr):
    """A whole group, BN columns: an amax pass over its blocks, then a
    quantising pass whose loads should hit the cache the first pass filled
    (as quantize.py's rowwise_tile)."""
    blocks = tl.cdiv(end - start, BLOCK)
    amax = tl.zeros((BLOCK, BN), dtype=tl.float32)
    for j in range(0, blocks):
        x = load_block(x_ptr, start, end, j, col0, C, ldx, gather, BN, "evict_last")
        amax = tl.maximum(amax, tl.abs(x))
    scale = scale_of(tl.max(amax, axis=0))
    cols = col0 + tl.arange(0, BN)
    tl.store(scale_ptr + g.to(tl.int64) * C + cols, scale, mask=cols < C)
    for j in range(0, blocks):
        x = load_block(x_ptr, start, end, j, col0, C, ldx, gather, BN, "evict_first")
        store_block(q_ptr, to_e4m3(x, scale[None, :]), first_block + j, col0, C, W, BN)


@triton.jit
def quantize_fp8_columns_kernel(x_ptr, q_ptr, scale_ptr, offs_ptr, T, C, G, ldx, rows_ptr,
                                rows_div, MODE: tl.constexpr, USE_TMA: tl.constexpr,
                                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                                CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """x [T, C] (rows ldx apart, unit column stride), offs int32 [G] (G >= 1);
    where rows_div is not 0, row r is x's row rows[r] // rows_div (int64
    rows [T]; x has its own number of rows).

    Persistent: program p takes tiles p, p + P, ... of the list made of
    every group's tiles in group order (ROWWISE: one per BN columns, the
    whole group; BLOCK_1X128: one per block and BN columns, columns
    fastest).  Groups are scanned CHUNK at a time, as ragged.py's
    ragged_m_program does: a prefix sum over their tile counts finds a
    tile's group without a per-group loop.  The runtime launches min(the
    family's `tiles`, one wave) programs, `tiles` bounding both MODEs'
    counts.  BK and PRECISION (GEMM constexprs every variant receives) are
    unused."""
    tl.static_assert(not USE_TMA, "quantize_fp8_columns has no TMA path")
    tl.static_assert(BM == BLOCK, "a tile's rows are one 128-row block")
    tl.static_assert((MODE == ROWWISE) | (MODE == BLOCK_1X128), "MODE is ROWWISE or BLOCK_1X128")
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    col_tiles = tl.cdiv(C, BN)
    W = (T // BLOCK + G) * BLOCK
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G, CHUNK):
        starts, ends = group_row_ranges(offs_ptr, chunk, G, T, rows_before, CHUNK)
        if MODE == ROWWISE:
            group_tiles = tl.where(chunk + tl.arange(0, CHUNK) < G, col_tiles, 0)
        else:
            group_tiles = tl.cdiv(ends - starts, BLOCK) * col_tiles
        tiles_end = tiles_before + tl.cumsum(group_tiles, 0)
        chunk_end = tiles_before + tl.sum(group_tiles)
        # The start is derived from tiles_before rather than carried (ragged.py's
        # ragged_m_program says why).
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            local_group = tl.sum((tiles_end <= t).to(tl.int32))
            g = chunk + local_group
            start = pick(starts, local_group, CHUNK)
            end = pick(ends, local_group, CHUNK)
            in_group = t - (pick(tiles_end, local_group, CHUNK) -
                            pick(group_tiles, local_group, CHUNK))
            first_block = start // BLOCK + g
            col0 = (in_group % col_tiles) * BN
            if MODE == ROWWISE:
                group_tile(x_ptr, q_ptr, scale_ptr, g, start, end, first_block, col0, C, ldx,
                           W, (rows_ptr, rows_div), BN)
            else:
                j = in_group // col_tiles
                block_tile(x_ptr, q_ptr, scale_ptr, start, end, first_block + j, j, col0, C,
                           ldx, W, (rows_ptr, rows_div), BN)
        tiles_before = chunk_end
        rows_before = tl.max(ends)
