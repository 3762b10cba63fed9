"""MoE layout kernels: groups are contiguous row ranges of one tensor, given by
int32 cumulative END offsets that live on the device (no host sync).

Offsets are read as e_g = clamp(max(offs[0..g]), 0, T): a running maximum,
clamped to the T rows that exist.  Group g owns rows [e_{g-1}, e_g) (e_{-1} = 0).
For valid offsets this is the usual meaning; for decreasing or out-of-range
offsets it keeps every access in bounds and every output row owned by at most
one group.

ragged_m: out[T, N], rows of group g = a[rows] @ b[g] (+ bias[g])   (forward, dA; fp8 with scales;
          the up projection with its activation, 16-bit or fp8)
ragged_k: out[G, M, N], out[g] = a[:, rows] @ b[rows]   (dB)
"""
import triton
import triton.language as tl

from .glu import CONCATENATED, NO_GLU, glu_epilogue, glu_tile, quantized_h
from .scaled import NO_SCALES, gathered_scaled_tile, scaled_tile_tma
from .tiles import (first_step_past, k_group_tiles, k_tile_origin, locate_tile, tile_mma_basic,
                    tile_store, tile_store_transposed, walk_groups)


# Row ranges clipped by the hardware through one descriptor (the scheme of
# Triton's tools/ragged_tma.py): a row-major [R, C] matrix is seen as 4-D
# [MAX, MAX, 2**30, C] with strides [2**34 - ld, ld, ld, 1].  Coordinates
# (2**30, end, 2**30 - (end - start) + r, col) address row start + r (64-bit
# wraparound cancels the first two terms), and r >= end - start falls past
# 2**30 in the third dimension, where TMA loads zeros and stores nothing.
RAGGED_ROWS = tl.constexpr(2 ** 30)
RAGGED_MAX = tl.constexpr(0x7FFF0000)


@triton.jit
def ragged_descriptor(ptr, cols, ld, BR: tl.constexpr, BC: tl.constexpr):
    return tl.make_tensor_descriptor(ptr, shape=[RAGGED_MAX, RAGGED_MAX, RAGGED_ROWS, cols],
                                     strides=[2 ** 34 - ld, ld, ld, 1],
                                     block_shape=[1, 1, BR, BC])


@triton.jit
def ragged_load(desc, start, end, row, col, BR: tl.constexpr, BC: tl.constexpr):
    """Rows row .. row + BR of [start, end) (zeros past end), columns col .. col + BC."""
    block = desc.load([RAGGED_ROWS, end, RAGGED_ROWS - (end - start) + (row - start), col])
    return block.reshape(BR, BC)


@triton.jit
def ragged_store(desc, tile, start, end, row, col, BR: tl.constexpr, BC: tl.constexpr):
    """Store a [BR, BC] tile at (row, col), keeping only rows < end (row >= start)."""
    out = tile.to(desc.dtype).reshape(1, 1, BR, BC)
    desc.store([RAGGED_ROWS, end, RAGGED_ROWS - (end - start) + (row - start), col], out)


@triton.jit
def ragged_m_descriptors(a_ptr, b_ptr, T, N, K, G, lda, b_group_stride, ldb,
                         A_T: tl.constexpr, B_T: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr):
    k_dim = tl.maximum(K, 1)  # K = 0: a valid descriptor that is never loaded
    if A_T:  # read through pointers (ragged_m_tile_tma)
        a_desc = a_ptr
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[T, k_dim], strides=[lda, 1],
                                           block_shape=[BM, BK])
    if B_T:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G, N, k_dim],
                                           strides=[b_group_stride, ldb, 1],
                                           block_shape=[1, BN, BK])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G, k_dim, N],
                                           strides=[b_group_stride, ldb, 1],
                                           block_shape=[1, BK, BN])
    return a_desc, b_desc


@triton.jit
def ragged_m_tile_tma(a_desc, b_desc, g, off_m, off_n, k_end, T, lda, A_T: tl.constexpr,
                      B_T: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      PRECISION: tl.constexpr):
    """A tile of ragged_m through TMA, but for a stored [K, T] A (A_T; a_desc
    is then its pointer): TMA reads a box only from a 16-byte step along the
    contiguous dimension, where a group's rows start anywhere."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    rows = off_m + tl.arange(0, BM)
    for k0 in range(0, k_end, BK):
        if A_T:
            ks = k0 + tl.arange(0, BK)
            at = ks.to(tl.int64)[None, :] * lda + rows[:, None]
            a = tl.load(a_desc + at, mask=(rows < T)[:, None] & (ks < k_end)[None, :], other=0.0)
        else:
            a = a_desc.load([off_m, k0])
        if B_T:
            b = b_desc.load([g, off_n, k0]).reshape(BN, BK).T
        else:
            b = b_desc.load([g, k0, off_n]).reshape(BK, BN)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def add_bias(acc, bias, g, G, off_n, N, BN: tl.constexpr):
    """acc + bias_ptr[g, off_n:off_n + BN] (bias_ptr [G, N] row-major) for
    bias = (bias_ptr, has_bias), where has_bias; the rows past the last group
    (g == G) get none."""
    bias_ptr, has_bias = bias
    if has_bias != 0:
        cols = off_n + tl.arange(0, BN)
        group_bias = tl.load(bias_ptr + g.to(tl.int64) * N + cols, mask=(cols < N) & (g < G),
                             other=0.0)
        acc = acc + group_bias.to(tl.float32)[None, :]
    return acc


@triton.jit
def ragged_m_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                    bias_ptr, has_bias, A_T: tl.constexpr, B_T: tl.constexpr, C_T: tl.constexpr,
                    USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """a [T, K] row-major (A_T=0) or stored as row-major [K, T] (A_T=1, as
    3-D x 2-D's transposed b: a group's rows are then a range along the
    contiguous dimension, which the TMA flavour reads through pointers), b
    [G, K, N] (B_T=0) or [G, N, K] (B_T=1), c [T, N] row-major (C_T=0) or
    stored as row-major [N, T] (C_T=1, rows ldc apart: 3-D x 2-D's output,
    whose groups are column ranges; stored through pointers, a TMA box
    cannot end at a group's last column); bias [G, N] row-major, read where
    has_bias is 1."""
    ragged_m_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                     (bias_ptr, has_bias), A_T, B_T, C_T, USE_TMA, BM, BN, BK, CHUNK, PRECISION)


@triton.jit
def ragged_glu_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                      bias_ptr, has_bias, gu_ptr, save_gu, activation, rows_ptr, rows_div,
                      B_T: tl.constexpr, GLU: tl.constexpr, USE_TMA: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                      PRECISION: tl.constexpr):
    """The up projection of moe_experts with its activation (kernels/glu.py):
    row r < T of the product is a[rows[r] // rows_div] (a row-major, rows lda
    apart; rows int64) times b [G, K, N] (N = 2I, w13's gate and up columns as
    GLU says) plus bias[g] [G, N] (where has_bias); c [T, I] (rows ldc apart)
    = act(gate, up); gu [T, N] row-major = the product plus bias, written
    where save_gu is 1; activation: ACTIVATION's code (aot/axes.py).  GLU = UNGATED: c
    [T, N] = the product plus bias (gu, save_gu and activation not read).  Rows
    of the group offsets' pseudo-group (past the last group) are written zero."""
    ragged_m_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                     (bias_ptr, has_bias), False, B_T, False, USE_TMA, BM, BN, BK, CHUNK,
                     PRECISION, gather=(a_ptr, lda, rows_ptr, rows_div), GLU=GLU,
                     glu=(gu_ptr, save_gu, activation))


@triton.jit
def scaled_ragged_m_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, T, N, K, G,
                           lda, b_group_stride, ldb, ldc, bias_ptr, has_bias,
                           SCALING: tl.constexpr, FAST_ACCUM: tl.constexpr,
                           USE_TMA: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                           PRECISION: tl.constexpr):
    """ragged_m for fp8: a [T, K] row-major, b [G, N, K] (K-major, as fp8 wgmma
    wants both operands), c [T, N] = (a @ b[g]) scaled as scaled.py's SCALING says
    (+ bias[g] where has_bias), FAST_ACCUM as scaled.py says."""
    ragged_m_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                     (bias_ptr, has_bias), False, True, False, USE_TMA, BM, BN, BK, CHUNK,
                     PRECISION, SCALING=SCALING, FAST_ACCUM=FAST_ACCUM,
                     scales=(scale_a_ptr, scale_b_ptr))


@triton.jit
def scaled_ragged_glu_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, c_scale_ptr,
                             T, N, K, G, lda, b_group_stride, ldb, ldc, bias_ptr, has_bias,
                             activation, gu_ptr, rows_ptr, rows_div, SCALING: tl.constexpr,
                             GLU: tl.constexpr, SAVE_GU: tl.constexpr, USE_TMA: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                             CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """ragged_glu_kernel's up projection in fp8 for inference: a [*, K] e4m3
    tokens (rows lda apart) gathered as rows[r] // rows_div (rows_div > 0),
    b [G, N, K] e4m3 (K-major), scaled as scaled.py's SCALING says (a's
    scales by token), tensor-core accumulation; bias [G, N] bfloat16; c [T,
    N / 2] = act(gate, up) in e4m3, each row's 128 columns one 1x128 block
    with its float32 scale in c_scale [T, cdiv(N / 2, 128)] (the down
    projection's blockwise input); SAVE_GU: gu [T, N] (bfloat16, the product
    plus bias) written too, as ragged_glu_kernel's."""
    ragged_m_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                     (bias_ptr, has_bias), False, True, False, USE_TMA, BM, BN, BK, CHUNK,
                     PRECISION, SCALING=SCALING, scales=(scale_a_ptr, scale_b_ptr),
                     gather=(a_ptr, lda, rows_ptr, rows_div), GLU=GLU,
                     glu=(gu_ptr if SAVE_GU else None, 1, activation), out_scales=c_scale_ptr)


@triton.jit
def ragged_m_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                     bias, A_T: tl.constexpr, B_T: tl.constexpr, C_T: tl.constexpr,
                     USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     CHUNK: tl.constexpr, PRECISION: tl.constexpr,
                     SCALING: tl.constexpr = NO_SCALES, FAST_ACCUM: tl.constexpr = True,
                     scales=None, gather=None, GLU: tl.constexpr = NO_GLU, glu=None,
                     out_scales=None):
    """One program of a ragged_m launch.

    Persistent: program p takes tiles p, p + P, ... of the list made of every
    group's tiles (m-tile fastest, so programs running together share one
    weight column block), then the tiles of the rows past the last group,
    which are written with zeros (a pseudo-group with K = 0).  Groups are
    scanned CHUNK at a time: a prefix sum over their tile counts finds the
    owner of a tile without a per-group loop.

    Each optional feature is one argument: bias = (bias_ptr, has_bias),
    added where has_bias (add_bias); scales = (scale_a_ptr, scale_b_ptr),
    applied as SCALING (scaled.py's, with FAST_ACCUM) says; gather = (a_ptr,
    lda, rows_ptr, rows_div), A's rows read through an index by pointer
    loads (glu.glu_tile; TMA then only stores c); glu = (gu_ptr, save_gu,
    activation), glu.py's gated epilogue where GLU >= CONCATENATED (gu_ptr None:
    no gu); out_scales, h stored in fp8 with its 1x128 blocks' scales there
    (glu.quantized_h).  gather and out_scales, which have no mode, are used
    where they are not None; gather with scales is scaled.gathered_scaled_tile.  scales and glu are
    used where their mode says, and are None (never read) where it says
    not: the mode is needed anyway to say which scales or gate layout, and
    it cannot travel in the tuple (Triton makes a constexpr a tensor where
    the tuple holding it is assigned or unpacked), so a None test beside it
    would be a second answer to the same question.
    """
    tl.static_assert(SCALING == NO_SCALES or USE_TMA, "scaled tiles are TMA-only")
    tl.static_assert(GLU < CONCATENATED or gather is not None,
                     "the gated epilogue takes glu_tile's column order: gathered rows")
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    n_tiles = tl.cdiv(N, BN)
    lane = tl.arange(0, CHUNK)
    # An N-major b of gathered rows' products comes by TMA (CONCATENATED's in
    # two half blocks, the gate's and the up's): its pointer loads run along
    # N, whose mask the flavour's rules do not make constant over 16 bytes
    # (one element each).
    B_BY_TMA: tl.constexpr = USE_TMA and not B_T and gather is not None
    B_BLOCK_N: tl.constexpr = BN // 2 if GLU == CONCATENATED else BN
    SCALED_GATHER: tl.constexpr = gather is not None and SCALING != NO_SCALES
    if SCALED_GATHER:  # fp8's K-major b, by TMA (CONCATENATED: half blocks)
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G, N, tl.maximum(K, 1)],
                                           strides=[b_group_stride, ldb, 1],
                                           block_shape=[1, B_BLOCK_N, BK])
    elif USE_TMA and gather is None:
        # One descriptor for all of A and one for all of B, built once per
        # program.  A tile may read rows past its group's end (the next
        # group's rows): they only reach output rows that the store clips.
        a_desc, b_desc = ragged_m_descriptors(a_ptr, b_ptr, T, N, K, G, lda, b_group_stride, ldb,
                                              A_T, B_T, BM, BN, BK)
    elif B_BY_TMA:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G, tl.maximum(K, 1), N],
                                           strides=[b_group_stride, ldb, 1],
                                           block_shape=[1, BK, B_BLOCK_N])
    if USE_TMA and GLU < CONCATENATED and not C_T:
        c_desc = ragged_descriptor(c_ptr, N, ldc, BM, BN)
    elif USE_TMA:  # h: half as many columns
        c_desc = ragged_descriptor(c_ptr, N // 2, ldc, BM, BN // 2)
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = walk_groups(offs_ptr, chunk + lane, G, T,
                                                           rows_before, tiles_before, n_tiles, BM)
        chunk_end = tiles_before + tl.sum(group_tiles)
        # The start is derived from tiles_before rather than carried: Triton 3.6's
        # remove-layout-conversions pass drops a loop-carried scalar used as an
        # inner loop's lower bound (seen in the TTGIR; wrong tiles ran).
        for t in range(first_step_past(pid, tiles_before, num_programs), chunk_end, num_programs):
            g, start, end, off_m, off_n = locate_tile(t, chunk, starts, ends, group_tiles,
                                                      tiles_end, BM, BN, CHUNK)
            k_end = tl.where(g < G, K, 0)
            if SCALED_GATHER:
                acc = gathered_scaled_tile(gather, scales, b_desc, tl.minimum(g, G - 1), off_m,
                                           off_n, end, N, K, k_end, SCALING, GLU, BM, BN, BK)
            elif gather is not None:
                weights = b_ptr + tl.minimum(g, G - 1).to(tl.int64) * b_group_stride
                acc = glu_tile(gather, weights, off_m, off_n, k_end, end, N, ldb, B_T, GLU, BM,
                               BN, BK, PRECISION, USE_TMA, (b_desc, g) if B_BY_TMA else None)
            elif SCALING != NO_SCALES:
                acc = scaled_tile_tma(a_desc, b_desc, scales, tl.minimum(g, G - 1), off_m, off_n,
                                      end, N, K, k_end, SCALING, FAST_ACCUM, BM, BN, BK)
            elif USE_TMA:
                acc = ragged_m_tile_tma(a_desc, b_desc, g, off_m, off_n, k_end, T, lda, A_T, B_T,
                                        BM, BN, BK, PRECISION)
            else:
                weights = b_ptr + tl.minimum(g, G - 1).to(tl.int64) * b_group_stride
                acc = tile_mma_basic(a_ptr, weights, off_m, off_n, 0, k_end, end, N, lda, ldb,
                                     A_T, B_T, BM, BN, BK, PRECISION)
            if GLU < CONCATENATED:  # no gate
                acc = add_bias(acc, bias, g, G, off_n, N, BN)
                if C_T:
                    tile_store_transposed(c_ptr, acc, off_m, off_n, end, N, ldc, BM, BN)
                elif USE_TMA:
                    ragged_store(c_desc, acc, start, end, off_m, off_n, BM, BN)
                else:
                    tile_store(c_ptr, acc, off_m, off_n, end, N, ldc, False, BM, BN)
            else:
                h = glu_epilogue(acc, g, G, off_m, end, off_n, N, bias, glu, GLU, BM, BN)
                if out_scales is not None:
                    h = quantized_h(h, out_scales, N, off_m, end, off_n, BM, BN)
                if USE_TMA:
                    ragged_store(c_desc, h, start, end, off_m, off_n // 2, BM, BN // 2)
                else:
                    tile_store(c_ptr, h, off_m, off_n // 2, end, N // 2, ldc, False, BM, BN // 2)
        tiles_before = chunk_end
        rows_before = tl.max(ends)


@triton.jit
def group_row_range(offs_ptr, g, T, CHUNK: tl.constexpr):
    """(e_{g-1}, e_g) of the module docstring, for one group g."""
    lane = tl.arange(0, CHUNK)
    before = 0
    through = 0
    for chunk in range(0, g + 1, CHUNK):
        idx = chunk + lane
        vals = tl.minimum(tl.maximum(tl.load(offs_ptr + idx, mask=idx <= g, other=0), 0), T)
        before = tl.maximum(before, tl.max(tl.where(idx < g, vals, 0)))
        through = tl.maximum(through, tl.max(vals))
    return before, through


@triton.jit
def ragged_k_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, M, N, T, G, lda, ldb, ldc,
                    A_T: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                    PRECISION: tl.constexpr):
    """a [M, T] stored as row-major [T, M] (A_T, rows lda apart; as in dB = x^T
    dy) or row-major (the TMA flavour reads it through pointers: a group's K
    range along the contiguous dimension starts anywhere), b [T, N] row-major,
    c [G, M, N] with rows ldc apart and groups M * ldc apart.

    Every group has the same tile count, so a tile's group is a division; its
    K range comes from the offsets.  A group with no rows stores zeros.
    """
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    tiles_per_group = k_group_tiles(M, N, BM, BN)
    if USE_TMA:  # descriptors built once
        if A_T:
            a_desc = ragged_descriptor(a_ptr, M, lda, BK, BM)
        b_desc = ragged_descriptor(b_ptr, N, ldb, BK, BN)
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[G, M, N], strides=[M * ldc, ldc, 1],
                                           block_shape=[1, BM, BN])
    for tile in range(pid, G * tiles_per_group, num_programs):
        g = tile // tiles_per_group
        in_group = tile % tiles_per_group
        off_m, off_n = k_tile_origin(in_group, M, N, BM, BN)
        start, end = group_row_range(offs_ptr, g, T, CHUNK)
        if USE_TMA:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            rows = off_m + tl.arange(0, BM)
            for k0 in range(start, end, BK):
                if A_T:
                    a = ragged_load(a_desc, start, end, k0, off_m, BK, BM).T
                else:
                    ks = k0 + tl.arange(0, BK)
                    at = rows.to(tl.int64)[:, None] * lda + ks[None, :]
                    a = tl.load(a_ptr + at, mask=(rows < M)[:, None] & (ks < end)[None, :],
                                other=0.0)
                b = ragged_load(b_desc, start, end, k0, off_n, BK, BN)
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
            c_desc.store([g, off_m, off_n], acc.to(c_desc.dtype).reshape(1, BM, BN))
        else:
            acc = tile_mma_basic(a_ptr, b_ptr, off_m, off_n, start, end, M, N, lda, ldb,
                                 A_T, False, BM, BN, BK, PRECISION)
            c_group = c_ptr + g.to(tl.int64) * M * ldc
            tile_store(c_group, acc, off_m, off_n, M, N, ldc, False, BM, BN)


@triton.jit
def gathered_k_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, M, N, T, G, lda, ldb, ldc, rows_ptr,
                      rows_div, GATHER_A: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                      PRECISION: tl.constexpr):
    """ragged_k_kernel's product, out[g] = a[:, rows of g] @ b[rows of g], for a
    [M, T] stored as row-major [*, M] (rows lda apart) and b [T, N] row-major,
    one of them gathered: row r (< T) of the gathered one (a's where
    GATHER_A, else b's) is its stored row rows[r] // rows_div (rows int64 [T]),
    the other's is row r.  moe_experts' weight gradients, read through the
    routing's order (no permuted copy).  Pointer loads only: the TMA
    flavour's configs are warp-specialised (ragged_k_ws.gathered_k_ws_kernel)."""
    tl.static_assert(not USE_TMA, "the TMA flavour runs the warp-specialised kernel")
    pid = tl.program_id(0)
    tiles_per_group = k_group_tiles(M, N, BM, BN)
    for tile in range(pid, G * tiles_per_group, tl.num_programs(0)):
        g = tile // tiles_per_group
        in_group = tile % tiles_per_group
        off_m, off_n = k_tile_origin(in_group, M, N, BM, BN)
        start, end = group_row_range(offs_ptr, g, T, CHUNK)
        rm = off_m + tl.arange(0, BM)
        rn = off_n + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(start, end, BK):
            kk = k0 + tl.arange(0, BK)
            k_ok = kk < end
            src = tl.load(rows_ptr + kk, mask=k_ok, other=0) // rows_div
            if GATHER_A:
                a_rows = src
                b_rows = kk.to(tl.int64)
            else:
                a_rows = kk.to(tl.int64)
                b_rows = src
            a = tl.load(a_ptr + a_rows[None, :] * lda + rm[:, None],
                        mask=(rm < M)[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptr + b_rows[:, None] * ldb + rn[None, :],
                        mask=k_ok[:, None] & (rn < N)[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        c_group = c_ptr + g.to(tl.int64) * M * ldc
        tile_store(c_group, acc, off_m, off_n, M, N, ldc, False, BM, BN)
