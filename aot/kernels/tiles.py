"""Tile-level building blocks shared by every kernel family.

One output tile is C[off_m:off_m+BM, off_n:off_n+BN] = sum over k in
[k_start, k_end) of A[m, k] * B[k, n], accumulated in float32.  Element
addressing is given by a leading dimension and a layout flag per operand:

    A_T == 0: A[m, k] at a_ptr + m * lda + k      (row-major [M, K])
    A_T == 1: A[m, k] at a_ptr + k * lda + m      (stored as [K, M])
    B_T == 0: B[k, n] at b_ptr + k * ldb + n      (row-major [K, N])
    B_T == 1: B[k, n] at b_ptr + n * ldb + k      (stored as [N, K])

Bounds are absolute coordinates: rows m >= m_end, columns n >= n_end and
k >= k_end read as zero and are never written.  PRECISION is tl.dot's
input_precision for float32 operands ('tf32', 'tf32x3'; ignored otherwise).
Both load paths take the same arguments so that a family kernel picks one
with a single constexpr (USE_TMA).
"""
import triton
import triton.language as tl


@triton.jit
def tile_mma_basic(a_ptr, b_ptr, off_m, off_n, k_start, k_end, m_end, n_end, lda, ldb,
                   A_T: tl.constexpr, B_T: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr):
    """Masked pointer loads: correct for any shape, stride and alignment."""
    rm = off_m + tl.arange(0, BM)
    rn = off_n + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    # 64-bit offsets: a single expert's weights can exceed 2**31 elements.
    rm64 = rm.to(tl.int64)
    rn64 = rn.to(tl.int64)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_start, k_end, BK):
        kk = (k0 + rk).to(tl.int64)
        if A_T:
            a_offs = kk[None, :] * lda + rm64[:, None]
        else:
            a_offs = rm64[:, None] * lda + kk[None, :]
        if B_T:
            b_offs = rn64[None, :] * ldb + kk[:, None]
        else:
            b_offs = kk[:, None] * ldb + rn64[None, :]
        a_mask = (rm[:, None] < m_end) & (kk[None, :] < k_end)
        b_mask = (kk[:, None] < k_end) & (rn[None, :] < n_end)
        a = tl.load(a_ptr + a_offs, mask=a_mask, other=0.0)
        b = tl.load(b_ptr + b_offs, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def tile_mma_tma(a_ptr, b_ptr, off_m, off_n, k_start, k_end, m_end, n_end, lda, ldb,
                 A_T: tl.constexpr, B_T: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr):
    """TMA loads through device-side descriptors (sm90).

    The descriptors span [0, end) in every dimension, so the hardware zero-fills
    everything past the bounds; loads start at k_start, so nothing below it is
    read.  Needs 16-byte aligned bases and leading dimensions (host-checked).
    A zero extent is padded to 1: such a descriptor is built but never loaded.
    """
    k_dim = tl.maximum(k_end, 1)
    if A_T:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[k_dim, m_end], strides=[lda, 1],
                                           block_shape=[BK, BM])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[m_end, k_dim], strides=[lda, 1],
                                           block_shape=[BM, BK])
    if B_T:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[n_end, k_dim], strides=[ldb, 1],
                                           block_shape=[BN, BK])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[k_dim, n_end], strides=[ldb, 1],
                                           block_shape=[BK, BN])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_start, k_end, BK):
        if A_T:
            a = a_desc.load([k0, off_m]).T
        else:
            a = a_desc.load([off_m, k0])
        if B_T:
            b = b_desc.load([off_n, k0]).T
        else:
            b = b_desc.load([k0, off_n])
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def tile_mma(a_ptr, b_ptr, off_m, off_n, k_start, k_end, m_end, n_end, lda, ldb,
             A_T: tl.constexpr, B_T: tl.constexpr, USE_TMA: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr):
    if USE_TMA:
        acc = tile_mma_tma(a_ptr, b_ptr, off_m, off_n, k_start, k_end, m_end, n_end, lda, ldb,
                           A_T, B_T, BM, BN, BK, PRECISION)
    else:
        acc = tile_mma_basic(a_ptr, b_ptr, off_m, off_n, k_start, k_end, m_end, n_end, lda, ldb,
                             A_T, B_T, BM, BN, BK, PRECISION)
    return acc


@triton.jit
def tile_store(c_ptr, acc, off_m, off_n, m_end, n_end, ldc,
               USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Store a tile of row-major C, converted to C's element type, clipped to the bounds."""
    out = acc.to(c_ptr.dtype.element_ty)
    if USE_TMA:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[m_end, n_end], strides=[ldc, 1],
                                           block_shape=[BM, BN])
        c_desc.store([off_m, off_n], out)
    else:
        rm = off_m + tl.arange(0, BM)
        rn = off_n + tl.arange(0, BN)
        offs = rm.to(tl.int64)[:, None] * ldc + rn[None, :]
        mask = (rm[:, None] < m_end) & (rn[None, :] < n_end)
        tl.store(c_ptr + offs, out, mask=mask)


@triton.jit
def tile_store_transposed(c_ptr, acc, off_m, off_n, m_end, n_end, ldc, BM: tl.constexpr,
                          BN: tl.constexpr):
    """Store a tile of a C stored transposed (C[m, n] at c_ptr + n * ldc + m,
    row-major C^T), converted to C's element type, clipped to the bounds.
    The compiler's coalescing gives each thread consecutive m (C^T's rows)."""
    rm = off_m + tl.arange(0, BM)
    rn = off_n + tl.arange(0, BN)
    offs = rn.to(tl.int64)[None, :] * ldc + rm[:, None]
    mask = (rm[:, None] < m_end) & (rn[None, :] < n_end)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def running_max(x):
    """Inclusive prefix maximum along the only axis."""
    return tl.associative_scan(x, 0, _max_combine)


@triton.jit
def pick(values, index, CHUNK: tl.constexpr):
    """values[index] for a runtime index into a register vector."""
    return tl.sum(tl.where(tl.arange(0, CHUNK) == index, values, 0))


@triton.jit
def first_step_past(start, end, step):
    """The first of start, start + step, start + 2 * step, ... that is >= end."""
    return start + tl.cdiv(tl.maximum(end - start, 0), step) * step


@triton.jit
def k_group_tiles(M, N, BM: tl.constexpr, BN: tl.constexpr):
    """The tiles of each group's out[g] [M, N] in a ragged-K product (all
    groups have as many)."""
    return tl.cdiv(M, BM) * tl.cdiv(N, BN)


@triton.jit
def k_tile_origin(in_group, M, N, BM: tl.constexpr, BN: tl.constexpr):
    """(off_m, off_n) of a group's tile number in_group in a ragged-K product
    out[g] [M, N] = a_g [M, Tg] @ b_g [Tg, N]: the shorter side's tiles vary
    fastest.  The tiles running at once then share a few blocks of the longer
    side's operand, which streams from memory once, and sweep the shorter
    side's, which stays in L2; with the longer side fastest its operand was
    read again for every tile along the shorter side wherever it outgrew L2."""
    m_tiles = tl.cdiv(M, BM)
    n_tiles = tl.cdiv(N, BN)
    n_fastest = M > N
    fastest = tl.where(n_fastest, n_tiles, m_tiles)
    along, across = in_group % fastest, in_group // fastest
    return tl.where(n_fastest, across, along) * BM, tl.where(n_fastest, along, across) * BN


@triton.jit
def walk_groups(offs_ptr, idx, G, T, rows_before, tiles_before, n_tiles, BM: tl.constexpr):
    """Groups idx (a chunk's indices, chunk + arange) of a ragged-M product of T
    rows (offs [G] their ends, clamped to [rows_before, T] and made
    non-decreasing; index G is the pseudo-group of the rows past the last
    group, ending at T; those past it are empty), each with n_tiles column
    tiles: (starts, ends, group_tiles, tiles_end), the last the inclusive
    prefix of the group tiles after tiles_before, m-tiles of BM rows."""
    ends = tl.load(offs_ptr + idx, mask=idx < G, other=0)
    ends = tl.where(idx >= G, T, ends)
    starts = tl.load(offs_ptr + idx - 1, mask=(idx >= 1) & (idx <= G), other=0)
    starts = tl.where(idx > G, T, starts)
    ends = tl.maximum(running_max(tl.minimum(tl.maximum(ends, 0), T)), rows_before)
    starts = tl.maximum(running_max(tl.minimum(tl.maximum(starts, 0), T)), rows_before)
    group_tiles = tl.cdiv(ends - starts, BM) * n_tiles
    tiles_end = tiles_before + tl.cumsum(group_tiles, 0)
    return starts, ends, group_tiles, tiles_end


@triton.jit
def locate_tile(t, chunk, starts, ends, group_tiles, tiles_end, BM: tl.constexpr,
                BN: tl.constexpr, CHUNK: tl.constexpr):
    """(group, its rows' start and end, the tile's first row and first column)
    of tile t of walk_groups' chunk from `chunk`, column tiles BN wide: m-tiles
    fastest, so that programs running together share a column tile of the
    weights."""
    local_group = tl.sum((tiles_end <= t).to(tl.int32))
    g = chunk + local_group
    start = pick(starts, local_group, CHUNK)
    end = pick(ends, local_group, CHUNK)
    group_first_tile = pick(tiles_end, local_group, CHUNK) - pick(group_tiles, local_group, CHUNK)
    in_group = t - group_first_tile
    m_tiles = tl.cdiv(end - start, BM)
    return g, start, end, start + (in_group % m_tiles) * BM, (in_group // m_tiles) * BN
