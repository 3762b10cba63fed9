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

WHOLE_ROW      a column of a group          scale [G, C]; an empty group's
                                            is the all-zero one, 1e-12 / 448
BLOCK_1X128    a column of a 128-row block  scale [T // 128 + G, C], at
                                            [b_g + j, c] for block j of g

Scales are stored block by block (a row per group or block), so that a
GEMM tile's scales of one block are contiguous: the weight gradient's
pipeline loads a tile's scales of one block in one contiguous run.

Memory-bound: a tile is BM = 128 rows (one block) by BN columns, loaded
along x's rows and stored along q's, its scales one per column.  In Gluon,
for its layout: a thread holds several rows by 8 columns of the tile, so
that it loads 8 columns of a row in a vector and stores its rows of a column
(contiguous bytes of q's row) in one, the tile transposed in registers,
where Triton's own layouts moved it through shared memory a byte at a time.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .quantize import BLOCK, BLOCK_1X128, WHOLE_ROW, scale_of, to_e4m3
from .ws import chunk_groups, first_step_past, pick, plus


@gluon.constexpr_function
def tile_layout(BN, warps, q_order):
    """The [BLOCK, BN] tile: a warp's lanes BN / 8 across a row, 8 columns
    each (one load of a row's BN columns), the rest of the lanes and the warps
    down the rows, which leaves each thread BLOCK / (those) rows (8 at BN =
    64 and 4 warps).  Ordered along x's rows (loads), or along q's (q_order:
    the same elements in every thread, so converting between the two moves
    no data)."""
    lanes_c = BN // 8
    lanes_r = 32 // lanes_c
    rows = BLOCK // (lanes_r * warps)
    return gl.BlockedLayout([rows, 8], [lanes_r, lanes_c], [warps, 1],
                            [0, 1] if q_order else [1, 0])


@gluon.jit
def load_block(x_ptr, start, end, j, col0, C, ldx, rows_ptr, rows_div, BN: gl.constexpr,
               EVICTION: gl.constexpr):
    """Block j of the group [start, end), columns col0 .. col0 + BN, in x's
    dtype: zeros past the group's end and past C.  Row r is x's row
    rows_ptr[r] // rows_div where rows_div is not 0."""
    layout: gl.constexpr = tile_layout(BN, gl.num_warps(), False)
    rows = start + j * BLOCK + gl.arange(0, BLOCK, gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, BN, gl.SliceLayout(0, layout))
    in_group = rows < end
    if rows_div != 0:
        # int32: the operator refuses an x whose slots (rows x k) int32 cannot
        # count, and an int64 division is a subroutine call a row.
        index = gl.load(rows_ptr + rows, mask=in_group, other=0).to(gl.int32)
        source = (index // rows_div).to(gl.int64)
    else:
        source = rows.to(gl.int64)
    mask = gl.expand_dims(in_group, 1) & gl.expand_dims(cols < C, 0)
    return gl.load(x_ptr + gl.expand_dims(source * ldx, 1) + gl.expand_dims(cols, 0), mask=mask,
                   other=0.0, eviction_policy=EVICTION)


@gluon.jit
def store_block(q_ptr, q, block, col0, C, W, BN: gl.constexpr):
    """q [BLOCK, BN] (rows of x, its columns col0 ..) as columns 128 * block ..
    of q's rows col0 .. (q [C, W]); all 128, so a cut block's rest is its zeros."""
    layout: gl.constexpr = tile_layout(BN, gl.num_warps(), True)
    q = gl.convert_layout(q, layout)
    rows = gl.arange(0, BLOCK, gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, BN, gl.SliceLayout(0, layout))
    at = gl.expand_dims(cols.to(gl.int64) * W, 0) + block * BLOCK + gl.expand_dims(rows, 1)
    gl.store(q_ptr + at, q, mask=gl.expand_dims(cols < C, 0), cache_modifier=".cs")


@gluon.jit
def store_scales(scale_ptr, scale, row, col0, C, BN: gl.constexpr):
    """A tile's column scales, at scale_ptr[row, col0 ..] (scale [*, C])."""
    cols = col0 + gl.arange(0, BN, scale.type.layout)
    gl.store(scale_ptr + row.to(gl.int64) * C + cols, scale, mask=cols < C)


@gluon.jit
def block_tile(x_ptr, q_ptr, scale_ptr, start, end, block, j, col0, C, ldx, W, rows_ptr,
               rows_div, BN: gl.constexpr):
    """Block j of a group (q's column block `block`), BN columns: read once."""
    x = load_block(x_ptr, start, end, j, col0, C, ldx, rows_ptr, rows_div, BN, "")
    scale = scale_of(gl.max(gl.abs(x), 0).to(gl.float32))
    store_scales(scale_ptr, scale, block, col0, C, BN)
    store_block(q_ptr, to_e4m3(x.to(gl.float32), gl.expand_dims(scale, 0)), block, col0, C, W, BN)


@gluon.jit
def group_tile(x_ptr, q_ptr, scale_ptr, g, start, end, first_block, col0, C, ldx, W, rows_ptr,
               rows_div, BN: gl.constexpr):
    """A whole group, BN columns: an amax pass over its blocks, then a
    quantising pass whose loads should hit the cache the first pass filled
    (as quantize.py's rowwise_tile)."""
    blocks = (end - start + BLOCK - 1) // BLOCK
    layout: gl.constexpr = tile_layout(BN, gl.num_warps(), False)
    amax = gl.zeros((BN, ), gl.float32, gl.SliceLayout(0, layout))
    for j in range(0, blocks):
        x = load_block(x_ptr, start, end, j, col0, C, ldx, rows_ptr, rows_div, BN, "evict_last")
        amax = gl.maximum(amax, gl.max(gl.abs(x.to(gl.float32)), 0))
    scale = scale_of(amax)
    store_scales(scale_ptr, scale, g, col0, C, BN)
    for j in range(0, blocks):
        x = load_block(x_ptr, start, end, j, col0, C, ldx, rows_ptr, rows_div, BN, "evict_first")
        store_block(q_ptr, to_e4m3(x.to(gl.float32), gl.expand_dims(scale, 0)), first_block + j,
                    col0, C, W, BN)


@gluon.jit
def quantize_fp8_columns_kernel(x_ptr, q_ptr, scale_ptr, offs_ptr, T, C, G, ldx, rows_ptr,
                                rows_div, MODE: gl.constexpr, USE_TMA: gl.constexpr,
                                BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                                CHUNK: gl.constexpr, PRECISION: gl.constexpr):
    """x [T, C] (rows ldx apart, unit column stride), offs int32 [G] (G >= 1);
    where rows_div is not 0, row r is x's row rows[r] // rows_div (int64
    rows [T]; x has its own number of rows).

    Persistent: program p takes tiles p, p + P, ... of the list made of
    every group's tiles in group order (WHOLE_ROW: one per BN columns, the
    whole group; BLOCK_1X128: one per block and BN columns, columns
    fastest, so that the programs running together read neighbouring
    pieces of the same rows).  Groups are scanned CHUNK at a time
    (ws.chunk_groups' ranges; its pseudo-group of the rows past the last
    group takes no tile here).  The runtime launches min(the family's
    `tiles`, one wave) programs, `tiles` bounding both MODEs' counts.  BK
    and PRECISION (GEMM constexprs every variant receives) are unused."""
    gl.static_assert(not USE_TMA, "quantize_fp8_columns has no TMA path")
    gl.static_assert(BM == BLOCK, "a tile's rows are one 128-row block")
    gl.static_assert((MODE == WHOLE_ROW) | (MODE == BLOCK_1X128), "MODE: WHOLE_ROW or BLOCK_1X128")
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    col_tiles = (C + BN - 1) // BN
    W = (T // BLOCK + G) * BLOCK
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G, CHUNK):
        starts, ends, _, _ = chunk_groups(offs_ptr, chunk, T, G, rows_before, tiles_before, 1,
                                          BLOCK, 1, CHUNK, gl.num_warps())
        in_range = chunk + gl.arange(0, CHUNK, starts.type.layout) < G
        if MODE == WHOLE_ROW:
            group_tiles = gl.where(in_range, col_tiles, 0)
        else:
            group_tiles = gl.where(in_range, (ends - starts + BLOCK - 1) // BLOCK * col_tiles, 0)
        tiles_end = tiles_before + gl.associative_scan(group_tiles, 0, plus)
        chunk_end = tiles_before + gl.sum(group_tiles, 0)
        # The start is derived from tiles_before rather than carried (ragged.py's
        # ragged_m_program says why).
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            local = gl.sum((tiles_end <= t).to(gl.int32), 0)
            g = chunk + local
            start = pick(starts, local)
            end = pick(ends, local)
            in_group = t - (pick(tiles_end, local) - pick(group_tiles, local))
            first_block = start // BLOCK + g
            col0 = (in_group % col_tiles) * BN
            if MODE == WHOLE_ROW:
                group_tile(x_ptr, q_ptr, scale_ptr, g, start, end, first_block, col0, C, ldx, W,
                           rows_ptr, rows_div, BN)
            else:
                j = in_group // col_tiles
                block_tile(x_ptr, q_ptr, scale_ptr, start, end, first_block + j, j, col0, C, ldx,
                           W, rows_ptr, rows_div, BN)
        tiles_before = chunk_end
        rows_before = gl.max(ends, 0)
