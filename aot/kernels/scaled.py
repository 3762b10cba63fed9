"""Scaled fp8 tiles (sm90, TMA): one output tile of a [T, K] row-major times
one group's b, stored [N, K] (K-major), with float32 scale factors that undo
the quantisation (x ~ q * scale):

ROWWISE    out = (a @ b) * scale_a[row] * scale_b[g, col]
           scale_a [T], scale_b [G, N]: torch._scaled_grouped_mm's rowwise form.
BLOCKWISE  out = sum over 128-wide K blocks j of
           (a[:, j] @ b[j, :]) * scale_a[row, j] * scale_b[g, col // 128, j]
           scale_a [T, ceil(K/128)] (1x128 per token), scale_b
           [G, ceil(N/128), ceil(K/128)] (128x128 weight blocks), both
           row-major; each block's product is scaled in float32 before it is
           added (the DeepSeek-V3 recipe).
BLOCKWISE_ROWWISE
           a's scales as BLOCKWISE's, b's as ROWWISE's:
           out = sum over j of (a[:, j] @ b[j, :]) * scale_a[row, j], times
           scale_b[g, col] (per-channel weights with activations quantized
           per 1x128 block: the fused up projection's h, a per-channel model).

Gathered rows (gathered_scaled_tile, the fused fp8 up projection): row r of
a is a token's row, rows[r] // rows_div, and so are its scales' rows.

FAST_ACCUM (torch's use_fast_accum): the tensor cores accumulate a tile's
products over all of K, in their own precision, which loses bits as K grows.
Without it each K step's product (BK = 128 deep) is added to the float32
accumulator by the CUDA cores (rowwise: the compiler's partial accumulator,
max_num_imprecise_acc; blockwise: every block's product is scaled and added
so).
"""
import triton
import triton.language as tl

from .glu import CONCATENATED
from .quantize import BLOCK

NO_SCALES = tl.constexpr(0)
ROWWISE = tl.constexpr(1)
BLOCKWISE = tl.constexpr(2)
BLOCKWISE_ROWWISE = tl.constexpr(3)
SCALE_BLOCK = BLOCK  # the elements along each side of a scale block: quantize_fp8's


@triton.jit
def _load_pair(a_desc, b_desc, g, off_m, off_n, k0, BN: tl.constexpr, BK: tl.constexpr):
    a = a_desc.load([off_m, k0])
    b = b_desc.load([g, off_n, k0]).reshape(BN, BK).T
    return a, b


@triton.jit
def scaled_tile_tma(a_desc, b_desc, scales, g, off_m, off_n, end, N, K, k_end,
                    SCALING: tl.constexpr, FAST_ACCUM: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr, BK: tl.constexpr):
    """The float32 tile at (off_m, off_n) of group g (a valid index) with its
    scales = (scale_a_ptr, scale_b_ptr) applied; rows >= end and columns >= N
    read scale 0."""
    scale_a_ptr, scale_b_ptr = scales
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    row_ok = rows < end
    col_ok = cols < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if SCALING == ROWWISE:
        for k0 in range(0, k_end, BK):
            a, b = _load_pair(a_desc, b_desc, g, off_m, off_n, k0, BN, BK)
            if FAST_ACCUM:
                acc = tl.dot(a, b, acc)
            else:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BK)
        scale_a = tl.load(scale_a_ptr + rows, mask=row_ok, other=0.0)
        scale_b = tl.load(scale_b_ptr + g.to(tl.int64) * N + cols, mask=col_ok, other=0.0)
        acc = acc * scale_a[:, None] * scale_b[None, :]
    elif SCALING == BLOCKWISE_ROWWISE:
        tl.static_assert(SCALE_BLOCK % BK == 0, "a K step must not straddle two scale blocks")
        a_scales = scale_a_ptr + rows.to(tl.int64) * tl.cdiv(K, SCALE_BLOCK)
        for k0 in range(0, k_end, BK):
            a, b = _load_pair(a_desc, b_desc, g, off_m, off_n, k0, BN, BK)
            scale_a = tl.load(a_scales + k0 // SCALE_BLOCK, mask=row_ok, other=0.0)
            acc += tl.dot(a, b) * scale_a[:, None]
        scale_b = tl.load(scale_b_ptr + g.to(tl.int64) * N + cols, mask=col_ok, other=0.0)
        acc = acc * scale_b[None, :]
    else:
        tl.static_assert(SCALE_BLOCK % BK == 0, "a K step must not straddle two scale blocks")
        k_blocks = tl.cdiv(K, SCALE_BLOCK)
        a_scales = scale_a_ptr + rows.to(tl.int64) * k_blocks
        b_group = scale_b_ptr + g.to(tl.int64) * tl.cdiv(N, SCALE_BLOCK) * k_blocks
        # A tile within one 128-column block has one weight scale per K block:
        # folded into the row scales, one FMA per element (the CUDA-core work
        # between two MMAs is what limits this loop).
        ONE_N_BLOCK: tl.constexpr = SCALE_BLOCK % BN == 0
        if ONE_N_BLOCK:
            b_scales = b_group + (off_n // SCALE_BLOCK) * k_blocks
        else:
            b_scales = b_group + (cols // SCALE_BLOCK) * k_blocks
        for k0 in range(0, k_end, BK):
            a, b = _load_pair(a_desc, b_desc, g, off_m, off_n, k0, BN, BK)
            block = k0 // SCALE_BLOCK
            scale_a = tl.load(a_scales + block, mask=row_ok, other=0.0)
            if ONE_N_BLOCK:
                scale = scale_a * tl.load(b_scales + block)
                acc += tl.dot(a, b) * scale[:, None]
            else:
                scale_b = tl.load(b_scales + block, mask=col_ok, other=0.0)
                acc += tl.dot(a, b) * scale_a[:, None] * scale_b[None, :]
    return acc


@triton.jit
def gathered_scaled_tile(gather, scales, b_desc, g, off_m, off_n, end, N, K, k_end,
                         SCALING: tl.constexpr, GLU: tl.constexpr, BM: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr):
    """scaled_tile_tma's tile for gathered rows, gather = (a_ptr, lda, rows_ptr,
    rows_div): row r (below end) is a[rows[off_m + r] // rows_div], read by
    16-byte pointer loads (the kernels' rules: K a multiple of 16, aligned
    rows), scaled by its token's scales; b[g] by TMA through b_desc
    ([G, N, K], blocks of [1, BN / 2, BK] for CONCATENATED, else [1, BN,
    BK]).  The accumulator's columns are glu.w13_columns' (CONCATENATED: the
    gate's BN / 2 from off_n / 2, then the up's from N / 2 + off_n / 2);
    columns past their half or past N read scale 0."""
    a_ptr, lda, rows_ptr, rows_div = gather
    rows = off_m + tl.arange(0, BM)
    row_ok = rows < end
    tokens = tl.load(rows_ptr + rows, mask=row_ok, other=0) // rows_div
    a_rows = tl.multiple_of(a_ptr + tokens * lda, 16)
    operand = (a_rows, row_ok, tokens, b_desc, g)
    if GLU == CONCATENATED:
        gate = scaled_columns(operand, scales, off_n // 2, N // 2, N, K, k_end, SCALING, BM,
                              BN // 2, BK)
        up = scaled_columns(operand, scales, N // 2 + off_n // 2, N, N, K, k_end, SCALING, BM,
                            BN // 2, BK)
        return tl.reshape(tl.permute(tl.join(gate, up), (0, 2, 1)), (BM, BN))
    else:
        return scaled_columns(operand, scales, off_n, N, N, K, k_end, SCALING, BM, BN, BK)


@triton.jit
def scaled_columns(operand, scales, first, limit, N, K, k_end, SCALING: tl.constexpr,
                   BM: tl.constexpr, W: tl.constexpr, BK: tl.constexpr):
    """[BM, W] float32: gathered_scaled_tile's rows (operand = (a_rows,
    row_ok, tokens, b_desc, g)) times b[g]'s rows first .. first + W (those
    below limit; the others scaled by 0), scaled.  A tile of fewer rows than
    wgmma's least M (64) is computed transposed, the weights' W rows as the
    MMA's M (SWAPPED): its few rows then cost MMA columns, not a 64-row
    accumulator mostly empty that every K block's scaling would go over."""
    a_rows, row_ok, tokens, b_desc, g = operand
    scale_a_ptr, scale_b_ptr = scales
    SWAPPED: tl.constexpr = BM < 64
    cols = first + tl.arange(0, W)
    col_ok = cols < limit
    rk = tl.arange(0, BK)
    if SWAPPED:
        acc = tl.zeros((W, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, W), dtype=tl.float32)
    if SCALING == ROWWISE:
        for k0 in range(0, k_end, BK):
            acc = oriented_dot(gathered_block(a_rows, row_ok, k0 + rk, k_end),
                               b_desc.load([g, first, k0]).reshape(W, BK), acc, SWAPPED)
        scale_a = tl.load(scale_a_ptr + tokens, mask=row_ok, other=0.0)
        scale_b = tl.load(scale_b_ptr + g.to(tl.int64) * N + cols, mask=col_ok, other=0.0)
        acc = scaled_by(acc, scale_a, scale_b, SWAPPED)
    else:
        tl.static_assert(SCALING == BLOCKWISE, "gathered rows take rowwise or blockwise scales")
        tl.static_assert(BK == SCALE_BLOCK, "one K step a scale block")
        # The columns lie in b's 128-row block first / 128 and, past its
        # end, the next (W = 256 starts on a block): two scalar loads a step.
        tl.static_assert(W <= 2 * SCALE_BLOCK, "a tile's columns span at most two scale blocks")
        k_blocks = tl.cdiv(K, SCALE_BLOCK)
        n_blocks = tl.cdiv(N, SCALE_BLOCK)
        a_scales = scale_a_ptr + tokens * k_blocks
        first_block = first // SCALE_BLOCK
        b_scales = scale_b_ptr + (g.to(tl.int64) * n_blocks + first_block) * k_blocks
        in_second = cols // SCALE_BLOCK != first_block
        second_exists = first_block + 1 < n_blocks
        for k0 in range(0, k_end, BK):
            product = oriented_dot(gathered_block(a_rows, row_ok, k0 + rk, k_end),
                                   b_desc.load([g, first, k0]).reshape(W, BK), None, SWAPPED)
            block = k0 // SCALE_BLOCK
            scale_a = tl.load(a_scales + block, mask=row_ok, other=0.0)
            scale_b = tl.where(in_second,
                               tl.load(b_scales + k_blocks + block, mask=second_exists, other=0.0),
                               tl.load(b_scales + block))
            scale_b = tl.where(col_ok, scale_b, 0.0)
            acc += scaled_by(product, scale_a, scale_b, SWAPPED)
    if SWAPPED:
        return acc.T
    else:
        return acc


@triton.jit
def oriented_dot(a, b, acc, SWAPPED: tl.constexpr):
    """a [BM, BK] times b [W, BK] transposed: [BM, W], or SWAPPED its
    transpose b @ a^T, [W, BM]; added to acc unless it is None."""
    if SWAPPED:
        return tl.dot(b, a.T, acc)
    else:
        return tl.dot(a, b.T, acc)


@triton.jit
def scaled_by(product, rows, cols, SWAPPED: tl.constexpr):
    """product [BM, W] (SWAPPED: [W, BM], oriented_dot's) times rows [BM] along
    its rows and cols [W] along its columns, the rows' factor first in either
    orientation: the same roundings, so both give the same bits."""
    if SWAPPED:
        return product * rows[None, :] * cols[:, None]
    else:
        return product * rows[:, None] * cols[None, :]


@triton.jit
def gathered_block(a_rows, row_ok, ks, k_end):
    """[rows, ks] of the gathered rows (zeros past k_end, which is a multiple
    of 16: a 16-byte vector is wholly in or out)."""
    in_k = tl.max_constancy(ks < k_end, 16)
    return tl.load(a_rows[:, None] + ks[None, :], mask=row_ok[:, None] & in_k[None, :], other=0.0)
