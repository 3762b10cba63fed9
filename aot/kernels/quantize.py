"""fp8 (e4m3) quantisation: x [R, C] -> q [R, C] float8_e4m3fn, contiguous,
and float32 scales with x ~ q * scale (torch._scaled_grouped_mm's convention):

    scale = max(amax(|x| over the elements it covers), 1e-12) / 448
    q     = x / scale, clamped to [-448, 448], rounded to nearest even

A NaN stays NaN (e4m3's NaN) and an inf makes its scale inf and its
block's values NaN (to_e4m3's correction step: 0 x inf), so that a
non-finite token's products are non-finite rather than finite and wrong;
the amax skips NaNs, so that they reach no other block's scale.

Both are what float32 torch computes on CUDA (a -0 input aside: it gives
+0): torch divides by the scalar 448 as a product with its float32 reciprocal,
and divides tensors with IEEE rounding.  MODE picks what one scale covers:

WHOLE_ROW      a row                 scale [R]
BLOCK_1X128    128 columns of a row  scale [R, cdiv(C, 128)]
BLOCK_128X128  128 x 128             scale [R // group_rows * cdiv(group_rows, 128),
                                            cdiv(C, 128)]
               R is made of groups of group_rows rows (weights [G, N, K] as
               [G * N, K]): blocks start afresh at every group.

x is read as stored, X_T saying how:

row-major      element (r, c) at x_ptr + r * ldx + c: rows of unit stride,
               groups stacked (the runtime copies x where they are not)
column-major   (X_T) element (r, c) of group g, whose rows are
               g * N .. g * N + N (N = contiguous_rows), at
               x_ptr + g * group_stride + c * ldx + r - g * N: a transposed
               view of row-major [G, C, N] (a weight's w.transpose(1, 2)),
               read in place.  Tiles are loaded along the rows and q stored
               along its columns (Triton converts the tile between the two,
               in shared memory); each group's rows are tiled afresh, as the
               address jumps between groups.

A column-major x's BLOCK_128X128 can also store each block transposed
(TRANSPOSED): q^T [G, C, N] contiguous beside q, with scales [G, cdiv(C,
128), cdiv(N, 128)] (N = qt_columns, each group's rows): the same blocks, so
the same values as quantizing the transposed x, from one read of x.  Its
tile is loaded along x's rows, as q^T stores it: only q's stores convert it
(a row-major x's transposed stores would convert theirs, which ran slower
than two reads; the runtime passes a row-major x as its transposed view).

Memory-bound: every tile moves several KiB per load (the aligned flavour's
16-divisible x_ptr, q_ptr, C, ldx, group_stride and contiguous_rows let
Triton use 16-byte vectors along x's rows or columns, whichever are
contiguous, and along q's rows), and q,
written once and never read here, is stored streaming (.cs) so that it does
not evict input lines a rowwise tile reads again.
"""
import triton
import triton.language as tl

WHOLE_ROW = tl.constexpr(0)
BLOCK_1X128 = tl.constexpr(1)
BLOCK_128X128 = tl.constexpr(2)
BLOCK = tl.constexpr(128)  # columns (and, 128x128, rows) one block scale covers
E4M3_MAX = tl.constexpr(448.0)  # largest finite float8_e4m3fn
E4M3_MAX_RECIPROCAL = tl.constexpr(1 / 448)  # rounded to float32 where used, as torch does
AMAX_FLOOR = tl.constexpr(1e-12)  # an all-zero block gets a tiny scale and q = 0, not NaN


@triton.jit
def scale_of(amax):
    return tl.maximum(amax, AMAX_FLOOR) * E4M3_MAX_RECIPROCAL


@triton.jit
def to_e4m3(x, scale):
    """x / scale saturated to e4m3's finite range.  The quotient is x times the
    reciprocal (one division per row or block: scale has that shape) plus one
    residual correction, div.rn's own fast path (Markstein): correctly rounded
    for every quotient in float32's normal range (smaller ones are 0 in e4m3
    either way), in three instructions an element instead of div.rn's ten."""
    inv = tl.div_rn(1.0, scale)
    q = x * inv
    q = tl.fma(tl.fma(-q, scale, x), inv, q)
    return tl.clamp(q, -E4M3_MAX, E4M3_MAX, propagate_nan=tl.PropagateNan.ALL).to(tl.float8e4nv)


@triton.jit
def quantize_blocks(x, scale_ptr, rows, row_ok, block, blocks_per_row):
    """x [R, 128] float32, each row one 1x128 block (its columns past the
    matrix's zero): x quantized to e4m3, its rows' scales stored at
    scale_ptr[rows, block] (rows in row_ok; scale [*, blocks_per_row])."""
    scale = scale_of(tl.max(tl.abs(x), axis=1))
    tl.store(scale_ptr + rows.to(tl.int64) * blocks_per_row + block, scale, mask=row_ok)
    return to_e4m3(x, scale[:, None])


@triton.jit
def store_transposed(qt_ptr, qt_scale_ptr, q, scale, group, row_block, col_block, local, cols,
                     mask, C, N):
    """A 128 x 128 block of group `group` (its rows `local` within the group,
    row block `row_block` there, columns `cols`, q [128, 128] and its scale)
    stored again as q^T's: group g's [C, N] at qt_ptr + g * C * N, its
    scales [cdiv(C, 128), cdiv(N, 128)] after the groups before it."""
    row_blocks = tl.cdiv(N, BLOCK)
    g = group.to(tl.int64)
    tl.store(qt_scale_ptr + (g * tl.cdiv(C, BLOCK) + col_block) * row_blocks + row_block, scale)
    tl.store(qt_ptr + g * C * N + cols.to(tl.int64)[:, None] * N + local[None, :], tl.trans(q),
             mask=tl.trans(mask), cache_modifier=".cs")


@triton.jit
def rowwise_tile(x_ptr, q_ptr, scale_ptr, row0, R, C, ldx, BM: tl.constexpr, BN: tl.constexpr):
    """Rows row0 .. row0 + BM, BN columns at a time: an amax pass, then a
    quantising pass whose loads should hit the cache the first pass filled
    (evict_last keeps those lines, evict_first drops them after their last use)."""
    rows = row0 + tl.arange(0, BM)
    cols = tl.arange(0, BN)
    in_rows = rows[:, None] < R
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * ldx
    q_rows = q_ptr + rows.to(tl.int64)[:, None] * C
    amax = tl.zeros((BM, BN), dtype=tl.float32)
    for c0 in range(0, C, BN):
        mask = in_rows & (c0 + cols[None, :] < C)
        x = tl.load(x_rows + c0 + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last")
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = scale_of(tl.max(amax, axis=1))
    tl.store(scale_ptr + rows, scale, mask=rows < R)
    for c0 in range(0, C, BN):
        mask = in_rows & (c0 + cols[None, :] < C)
        x = tl.load(x_rows + c0 + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first")
        tl.store(q_rows + c0 + cols[None, :], to_e4m3(x.to(tl.float32), scale[:, None]),
                 mask=mask, cache_modifier=".cs")


@triton.jit
def block_1x128_tile(x_ptr, q_ptr, scale_ptr, tile, R, C, ldx,
                     BM: tl.constexpr, BN: tl.constexpr):
    """BM rows x BN columns, read once, held as BM * BN / 128 segments of one
    block each, so that a block's amax is one row's reduction."""
    PER_ROW: tl.constexpr = BN // BLOCK
    col_tiles = tl.cdiv(C, BN)
    blocks_per_row = tl.cdiv(C, BLOCK)
    segment = tl.arange(0, BM * PER_ROW)
    rows = (tile // col_tiles) * BM + segment // PER_ROW
    blocks = (tile % col_tiles) * PER_ROW + segment % PER_ROW
    cols = blocks[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (rows[:, None] < R) & (cols < C)
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * ldx + cols, mask=mask, other=0.0).to(tl.float32)
    scale = scale_of(tl.max(tl.abs(x), axis=1))
    tl.store(scale_ptr + rows64 * blocks_per_row + blocks, scale,
             mask=(rows < R) & (blocks < blocks_per_row))
    tl.store(q_ptr + rows64[:, None] * C + cols, to_e4m3(x, scale[:, None]), mask=mask,
             cache_modifier=".cs")


@triton.jit
def block_128x128_tile(x_ptr, q_ptr, scale_ptr, tile, C, ldx, group_rows):
    """One 128 x 128 block, read once; row blocks are numbered group by group."""
    col_blocks = tl.cdiv(C, BLOCK)
    row_block = tile // col_blocks
    col_block = tile % col_blocks
    per_group = tl.cdiv(group_rows, BLOCK)
    group_start = (row_block // per_group) * group_rows
    rows = group_start + (row_block % per_group) * BLOCK + tl.arange(0, BLOCK)
    cols = col_block * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < group_start + group_rows) & (cols[None, :] < C)
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * ldx + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    scale = scale_of(tl.max(tl.max(tl.abs(x), axis=1), axis=0))
    tl.store(scale_ptr + tile, scale)  # scales are row-major in the tiles' order
    tl.store(q_ptr + rows64[:, None] * C + cols[None, :], to_e4m3(x, scale), mask=mask,
             cache_modifier=".cs")


@triton.jit
def column_rows(row_tile, N, group_stride, BM: tl.constexpr):
    """Row tile `row_tile` of a column-major x, cdiv(N, BM) tiles a group:
    the element offset of its group's first element, its rows within the
    group ([BM], int32: where they are contiguous) and among R ([BM], int64)."""
    per_group = tl.cdiv(N, BM)
    group = (row_tile // per_group).to(tl.int64)
    local = (row_tile % per_group) * BM + tl.arange(0, BM)
    return group * group_stride, local, group * N + local


@triton.jit
def column_rowwise_tile(x_ptr, q_ptr, scale_ptr, row_tile, C, N, ldx, group_stride,
                        BM: tl.constexpr, BN: tl.constexpr):
    """rowwise_tile for a column-major x: BM rows of one group, BN columns
    at a time, an amax pass then a quantising pass, each column's BM rows
    one contiguous run."""
    group_start, local, rows = column_rows(row_tile, N, group_stride, BM)
    in_rows = local[:, None] < N
    x_rows = x_ptr + group_start + local[:, None]
    q_rows = q_ptr + rows[:, None] * C
    cols = tl.arange(0, BN)
    x_tile = x_rows + cols.to(tl.int64)[None, :] * ldx
    amax = tl.zeros((BM, BN), dtype=tl.float32)
    for c0 in range(0, C, BN):
        mask = in_rows & (c0 + cols[None, :] < C)
        x = tl.load(x_tile + c0 * ldx, mask=mask, other=0.0, eviction_policy="evict_last")
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = scale_of(tl.max(amax, axis=1))
    tl.store(scale_ptr + rows, scale, mask=local < N)
    for c0 in range(0, C, BN):
        mask = in_rows & (c0 + cols[None, :] < C)
        x = tl.load(x_tile + c0 * ldx, mask=mask, other=0.0, eviction_policy="evict_first")
        tl.store(q_rows + c0 + cols[None, :], to_e4m3(x.to(tl.float32), scale[:, None]),
                 mask=mask, cache_modifier=".cs")


@triton.jit
def column_block_tile(x_ptr, q_ptr, scale_ptr, qt_ptr, qt_scale_ptr, tile, C, N, ldx,
                      group_stride, qt_columns, MODE: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, TRANSPOSED: tl.constexpr):
    """A BM x 128 tile of a column-major x (tiles numbered row tile by row
    tile, columns fastest), read once: BLOCK_1X128, BM one-row blocks;
    BLOCK_128X128 (BM = 128), one block, its scale at the tile's number as
    block_128x128_tile's, and with TRANSPOSED (qt_columns is N then) also
    stored transposed."""
    col_blocks = tl.cdiv(C, BLOCK)
    col_block = tile % col_blocks
    row_tile = tile // col_blocks
    group_start, local, rows = column_rows(row_tile, N, group_stride, BM)
    cols = col_block * BLOCK + tl.arange(0, BLOCK)
    mask = (local[:, None] < N) & (cols[None, :] < C)
    x = tl.load(x_ptr + group_start + cols.to(tl.int64)[None, :] * ldx + local[:, None],
                mask=mask, other=0.0).to(tl.float32)
    if MODE == BLOCK_1X128:
        q = quantize_blocks(x, scale_ptr, rows, local < N, col_block, col_blocks)
    else:
        scale = scale_of(tl.max(tl.max(tl.abs(x), axis=1), axis=0))
        tl.store(scale_ptr + tile, scale)
        q = to_e4m3(x, scale)
        if TRANSPOSED:
            per_group = tl.cdiv(N, BM)
            store_transposed(qt_ptr, qt_scale_ptr, q, scale, row_tile // per_group,
                             row_tile % per_group, col_block, local, cols, mask, C, qt_columns)
    tl.store(q_ptr + rows[:, None] * C + cols[None, :], q, mask=mask, cache_modifier=".cs")


@triton.jit
def quantize_column_major(pid, programs, x_ptr, q_ptr, scale_ptr, qt_ptr, qt_scale_ptr, R, C, N,
                          ldx, group_stride, qt_columns, MODE: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, TRANSPOSED: tl.constexpr):
    """quantize_fp8_kernel's X_T tiling: each group's N rows in tiles of BM
    rows (WHOLE_ROW: BN columns at a time; else by 128 columns, BN = 128)."""
    row_tiles = R // N * tl.cdiv(N, BM)
    if MODE == WHOLE_ROW:
        for row_tile in range(pid, row_tiles, programs):
            column_rowwise_tile(x_ptr, q_ptr, scale_ptr, row_tile, C, N, ldx, group_stride,
                                BM, BN)
    else:
        tl.static_assert(BN == BLOCK, "a column-major tile's columns are one 128-column block")
        tl.static_assert((MODE != BLOCK_128X128) | (BM == BLOCK), "a 128x128 tile is one block")
        for tile in range(pid, row_tiles * tl.cdiv(C, BLOCK), programs):
            column_block_tile(x_ptr, q_ptr, scale_ptr, qt_ptr, qt_scale_ptr, tile, C, N, ldx,
                              group_stride, qt_columns, MODE, BM, BN, TRANSPOSED)


@triton.jit
def quantize_fp8_kernel(x_ptr, q_ptr, scale_ptr, R, C, group_rows, ldx, group_stride,
                        contiguous_rows, qt_ptr, qt_scale_ptr, qt_columns, MODE: tl.constexpr,
                        X_T: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                        PRECISION: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Persistent: program p takes tiles p, p + P, ... of its MODE's tiling
    (BM rows; BM x BN; one 128 x 128 block, BM = BN = 128; X_T:
    quantize_column_major's).  The runtime launches min(the family's
    `tiles`, one wave) programs, `tiles` being an upper bound of every MODE's
    count: a program past its MODE's count exits at once.  group_stride and
    contiguous_rows are X_T's (the runtime passes 0 for a row-major x), which
    reads no group_rows: contiguous_rows is its value there.  qt_ptr,
    qt_scale_ptr and qt_columns: BLOCK_128X128's transposed copy, stored
    where TRANSPOSED (a variant of its own: the other's registers stay
    few), the runtime passing qt_columns > 0 for it.  BK, CHUNK and
    PRECISION (GEMM constexprs every variant receives) are unused."""
    tl.static_assert(not USE_TMA, "quantize_fp8 has no TMA path")
    tl.static_assert(BN % BLOCK == 0, "a tile must hold whole 128-column blocks")
    tl.static_assert(((MODE == BLOCK_128X128) & X_T) | (not TRANSPOSED),
                     "only a column-major x's 128x128 blocks are stored transposed too")
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if X_T:
        quantize_column_major(pid, programs, x_ptr, q_ptr, scale_ptr, qt_ptr, qt_scale_ptr, R, C,
                              contiguous_rows, ldx, group_stride, qt_columns, MODE, BM, BN,
                              TRANSPOSED)
    elif MODE == WHOLE_ROW:
        for tile in range(pid, tl.cdiv(R, BM), programs):
            rowwise_tile(x_ptr, q_ptr, scale_ptr, tile * BM, R, C, ldx, BM, BN)
    elif MODE == BLOCK_1X128:
        for tile in range(pid, tl.cdiv(R, BM) * tl.cdiv(C, BN), programs):
            block_1x128_tile(x_ptr, q_ptr, scale_ptr, tile, R, C, ldx, BM, BN)
    else:
        tl.static_assert(MODE == BLOCK_128X128, "MODE is WHOLE_ROW, BLOCK_1X128 or BLOCK_128X128")
        tl.static_assert((BM == BLOCK) & (BN == BLOCK), "a 128x128 tile is one block")
        row_blocks = R // group_rows * tl.cdiv(group_rows, BLOCK)
        for tile in range(pid, row_blocks * tl.cdiv(C, BLOCK), programs):
            block_128x128_tile(x_ptr, q_ptr, scale_ptr, tile, C, ldx, group_rows)
