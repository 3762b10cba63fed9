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

FAST_ACCUM (torch's use_fast_accum): the tensor cores accumulate a tile's
products over all of K, in their own precision, which loses bits as K grows.
Without it each K step's product (BK = 128 deep) is added to the float32
accumulator by the CUDA cores (rowwise: the compiler's partial accumulator,
max_num_imprecise_acc; blockwise: every block's product is scaled and added
so).
"""
import triton
import triton.language as tl

NO_SCALES = tl.constexpr(0)
ROWWISE = tl.constexpr(1)
BLOCKWISE = tl.constexpr(2)
SCALE_BLOCK = tl.constexpr(128)


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
