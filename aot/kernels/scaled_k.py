"""fp8 ragged-K product with float32 scales (sm90, TMA): the weight gradient
of fp8 training, out[g] = dY_g^T @ x_g, from operands quantized along T
within each group (the quantize_fp8_columns family).

Both operands are stored transposed and K-major, as fp8 wgmma reads them: a
[M, W] and b [N, W], W = 128 * (T // 128 + G).  Group g's rows [s_g, e_g)
(ragged.py's reading of the offsets) occupy 128-wide column blocks from
b_g = s_g // 128 + g on, zero-padded to a whole block, so no block holds two
groups' rows and every K step is one whole block (no masking: the padding
contributes zeros).

ROWWISE    out[g] = (a_g @ b_g^T) * scale_a[g, m] * scale_b[g, n]
           scale_a [G, M], scale_b [G, N]: one scale per row per group; each
           128-deep step's product is added to the float32 accumulator by the
           CUDA cores (max_num_imprecise_acc).
BLOCKWISE  out[g] = sum over the group's blocks j of
           (a_j @ b_j^T) * scale_a[b_g + j, m] * scale_b[b_g + j, n]
           scale_a [W / 128, M], scale_b [W / 128, N] (1x128 along T, the
           DeepSeek-V3 recipe's weight gradient).

This Triton kernel runs ROWWISE; BLOCKWISE runs the warp-specialised
kernel (scaled_k_ws.py), whose partitions take turns at the CUDA cores'
per-block work that here waits for every block's MMA.
"""
import triton
import triton.language as tl

from .ragged import group_row_range
from .scaled import ROWWISE, SCALE_BLOCK
from .tiles import k_group_tiles, k_tile_origin


@triton.jit
def scaled_ragged_k_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, M, N, T, G,
                           ldc, SCALING: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                           PRECISION: tl.constexpr):
    """c [G, M, N] (rows ldc apart, groups M * ldc apart) as the module
    docstring says, ROWWISE.  Persistent: program p takes tiles p, p + P, ...
    of the G * cdiv(M, BM) * cdiv(N, BN) tiles, group by group; a group with
    no rows stores zeros.  PRECISION (a 16-bit GEMM constexpr) is unused."""
    tl.static_assert(USE_TMA, "scaled_ragged_k reads its operands by TMA")
    tl.static_assert(BK == SCALE_BLOCK, "one K step a 128-wide block")
    tl.static_assert(SCALING == ROWWISE, "BLOCKWISE runs the warp-specialised kernel")
    width = (T // SCALE_BLOCK + G) * BK
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, width], strides=[width, 1],
                                       block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, width], strides=[width, 1],
                                       block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[G, M, N], strides=[M * ldc, ldc, 1],
                                       block_shape=[1, BM, BN])
    tiles_per_group = k_group_tiles(M, N, BM, BN)
    for tile in range(tl.program_id(0), G * tiles_per_group, tl.num_programs(0)):
        g = tile // tiles_per_group
        in_group = tile % tiles_per_group
        off_m, off_n = k_tile_origin(in_group, M, N, BM, BN)
        start, end = group_row_range(offs_ptr, g, T, CHUNK)
        first = start // SCALE_BLOCK + g
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for block in range(first, first + tl.cdiv(end - start, SCALE_BLOCK)):
            a = a_desc.load([off_m, block * BK])
            b = b_desc.load([off_n, block * BK])
            acc = tl.dot(a, b.T, acc, max_num_imprecise_acc=BK)
        rows = off_m + tl.arange(0, BM)
        cols = off_n + tl.arange(0, BN)
        scale_a = tl.load(scale_a_ptr + g.to(tl.int64) * M + rows, mask=rows < M, other=0.0)
        scale_b = tl.load(scale_b_ptr + g.to(tl.int64) * N + cols, mask=cols < N, other=0.0)
        acc = acc * scale_a[:, None] * scale_b[None, :]
        c_desc.store([g, off_m, off_n], acc.to(c_desc.dtype).reshape(1, BM, BN))
