"""Ragged-M products whose weights are 4-bit (the w4_glu and w4_ragged_m
families), b [G, N, K] stored two values a byte along K (element 2i in the
low nibble, 2i + 1 in the high: [G, N, K / 2] uint8), in one of two
formats (FORMAT):
  MXFP4:      OCP microscaling e2m1 values with e8m0 scales, one a group of
              32 along K ([G, N, K / 32] uint8: 2 ** (byte - 127), 255 is NaN);
  INT4_G32,   symmetric integers stored offset by 8 (nibble u is u - 8, -8
  INT4_G128:  .. 7) with bfloat16 scales, one a group of 32 or 128 along K
              ([G, N, K / group]).
The tokens are bfloat16 (W4A16): the weights are widened to bfloat16 in the
K loop and the products are 16-bit MMAs (Hopper has no 4-bit tensor cores).
The widening, each value times its scale rounded once to bfloat16, is
kernels/widen4.py's, two values a 32-bit instruction.

The weights are the MMA's second operand (its N side, the tokens its M):
Triton widens them into the shared memory tile wgmma reads, rather than
keeping them in registers as the first operand (as kernels/experts_decode.py
keeps fp8 weights); docs/notes/2026-11-29-mxfp4-experts-w4a16.md and
docs/notes/2026-11-29-w4-widening-in-ptx.md measure both orders.  A scale's
NaN byte (255) is not special-cased; it still makes the products it scales
non-finite (infinity), never a finite wrong value.

The programs walk their tiles as ragged.ragged_m_program does (tiles.py
walk_groups, locate_tile; the rows past the last group written zero), in a
loop of their own: that program's modes are all TMA or Gluon tiles, and a
change here recompiles none of its kernels.

Pointer loads throughout: 16-byte vectors, the host having checked what makes
them whole (csrc/ops/expert_products_w4.cc: 16-byte aligned rows, K a
multiple of the scale group); sm80 and sm90 compile the same code.  Why not
the weights by TMA: docs/notes/2026-11-29-w4-widening-in-ptx.md."""
import triton
import triton.language as tl

from .glu import NO_GLU, glu_epilogue, w13_columns
from .ragged import add_bias
from .tiles import first_step_past, locate_tile, tile_store, walk_groups
from .widen4 import e2m1_pairs, e8m0_scales, int4_pairs

MXFP4 = tl.constexpr(0)
INT4_G32 = tl.constexpr(1)
INT4_G128 = tl.constexpr(2)


@triton.jit
def widened(b, scale, FORMAT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            GROUPS: tl.constexpr):
    """b [BN, BK / 2] packed bytes of FORMAT, scale [BN, GROUPS] (MXFP4's e8m0
    bytes, INT4's bfloat16; each over BK / GROUPS values) -> the weights
    [BN, BK] bfloat16."""
    if FORMAT == MXFP4:
        scale = e8m0_scales(scale)
    per_byte = tl.broadcast_to(scale[:, :, None], (BN, GROUPS, BK // 2 // GROUPS))
    per_byte = per_byte.reshape(BN, BK // 2)
    if FORMAT == MXFP4:
        low, high = e2m1_pairs(b, per_byte)
    else:
        low, high = int4_pairs(b, per_byte)
    return tl.join(low, high).reshape(BN, BK)


@triton.jit
def w4_tile(gather, weights, off_m, off_n, k_end, end, N, GLU: tl.constexpr,
            FORMAT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """The tile's product [BM, BN] float32 in w13_columns' order (GLU's):
    gather = (a_ptr, lda, rows_ptr, rows_div) as glu.glu_tile's (the tile's
    row r is a[rows[off_m + r] // rows_div], or a[off_m + r] where rows_div
    is 0; zeros from end on); weights = (b_ptr, ldb, scale_ptr, lds), group
    g's packed values (rows ldb bytes apart) and scales (rows lds apart;
    MXFP4's bytes, INT4's a bfloat16 pointer); k_end: K (0: the rows past the last
    group, a product of zeros)."""
    GROUP: tl.constexpr = 128 if FORMAT == INT4_G128 else 32  # values along K a scale covers
    # A K step is whole scale groups, or lies within one (BK divides GROUP).
    GROUPS: tl.constexpr = max(BK // GROUP, 1)
    tl.static_assert(BK % GROUP == 0 or GROUP % BK == 0, "K steps and scale groups nest")
    a_ptr, lda, rows_ptr, rows_div = gather
    b_ptr, ldb, scale_ptr, lds = weights
    rm = off_m + tl.arange(0, BM)
    row_ok = rm < end
    gathered = rows_div != 0
    src = tl.load(rows_ptr + rm, mask=row_ok & gathered, other=0) // tl.maximum(rows_div, 1)
    src = tl.where(gathered, src, rm)
    a_rows = tl.multiple_of(a_ptr + src.to(tl.int64) * lda, 16)
    cols, col_ok = w13_columns(off_n, N, GLU, BN)
    b_rows = tl.multiple_of(b_ptr + cols.to(tl.int64) * ldb, 16)
    scale_rows = scale_ptr + cols.to(tl.int64) * lds
    VECTOR: tl.constexpr = 128 // a_ptr.dtype.element_ty.primitive_bitwidth  # 16 bytes
    ks = tl.arange(0, BK)
    bytes_k = tl.arange(0, BK // 2)
    groups_k = tl.arange(0, GROUPS)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, k_end, BK):
        in_k = tl.max_constancy(k0 + ks < k_end, VECTOR)
        a = tl.load(a_rows[:, None] + k0 + ks[None, :], mask=row_ok[:, None] & in_k[None, :],
                    other=0.0)
        byte_ok = tl.max_constancy(k0 // 2 + bytes_k < k_end // 2, 16)
        b = tl.load(b_rows[:, None] + k0 // 2 + bytes_k[None, :],
                    mask=col_ok[:, None] & byte_ok[None, :], other=0)
        group_ok = k0 // GROUP + groups_k < k_end // GROUP
        scale = tl.load(scale_rows[:, None] + k0 // GROUP + groups_k[None, :],
                        mask=col_ok[:, None] & group_ok[None, :], other=0)
        acc = tl.dot(a, widened(b, scale, FORMAT, BN, BK, GROUPS).T, acc)
    return acc


@triton.jit
def w4_glu_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, b_scale_ptr, T, N, K, G, lda, b_group_stride,
                  ldb, b_scale_group_stride, lds, ldc, bias_ptr, has_bias, activation, rows_ptr,
                  rows_div, GLU: tl.constexpr, FORMAT: tl.constexpr, USE_TMA: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                  PRECISION: tl.constexpr):
    """ragged.ragged_glu_kernel's up projection (without gu) with 4-bit
    weights: a [*, K] 16-bit tokens gathered as rows[r] // rows_div, b [G,
    N, K / 2] packed as FORMAT says (rows ldb bytes apart) with its scales
    b_scale [G, N, K / group] (rows lds apart), bias [G, N]; c [T, N / 2] =
    act(gate, up), rows ldc apart.  USE_TMA and PRECISION are unused."""
    w4_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, ldc, (a_ptr, lda, rows_ptr, rows_div),
               (b_group_stride, ldb, b_scale_ptr, b_scale_group_stride, lds),
               (bias_ptr, has_bias), activation, GLU, FORMAT, BM, BN, BK, CHUNK)


@triton.jit
def w4_ragged_m_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, b_scale_ptr, T, N, K, G, lda,
                       b_group_stride, ldb, b_scale_group_stride, lds, ldc, bias_ptr, has_bias,
                       FORMAT: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                       PRECISION: tl.constexpr):
    """ragged_m with 4-bit weights (w4_glu_kernel's b and b_scale): a [T,
    K] 16-bit, rows lda apart; c [T, N] (rows ldc apart) = a @ b[g]^T (+
    bias[g]): moe_experts' down projection."""
    w4_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, ldc, (a_ptr, lda, offs_ptr, 0),
               (b_group_stride, ldb, b_scale_ptr, b_scale_group_stride, lds),
               (bias_ptr, has_bias), 0, NO_GLU, FORMAT, BM, BN, BK, CHUNK)


@triton.jit
def w4_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, ldc, gather, weights, bias, activation,
               GLU: tl.constexpr, FORMAT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, CHUNK: tl.constexpr):
    """One persistent program: tiles pid, pid + P, ... of every group's
    tiles, then the rows past the last group's (zeros).  weights =
    (b_group_stride, ldb, scale_ptr, scale_group_stride, lds); GLU gated:
    c gets act(gate, up) (glu.glu_epilogue), else the product."""
    b_group_stride, ldb, scale_ptr, scale_group_stride, lds = weights
    if FORMAT != MXFP4:  # INT4's scales are bfloat16: strides count them, not bytes
        scale_ptr = scale_ptr.to(tl.pointer_type(tl.bfloat16))
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    n_tiles = tl.cdiv(N, BN)
    lane = tl.arange(0, CHUNK)
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = walk_groups(offs_ptr, chunk + lane, G, T,
                                                           rows_before, tiles_before, n_tiles, BM)
        chunk_end = tiles_before + tl.sum(group_tiles)
        for t in range(first_step_past(pid, tiles_before, num_programs), chunk_end, num_programs):
            g, start, end, off_m, off_n = locate_tile(t, chunk, starts, ends, group_tiles,
                                                      tiles_end, BM, BN, CHUNK)
            group = tl.minimum(g, G - 1).to(tl.int64)
            group_weights = (b_ptr + group * b_group_stride, ldb,
                             scale_ptr + group * scale_group_stride, lds)
            acc = w4_tile(gather, group_weights, off_m, off_n, tl.where(g < G, K, 0), end, N,
                          GLU, FORMAT, BM, BN, BK)
            if GLU == NO_GLU:
                acc = add_bias(acc, bias, g, G, off_n, N, BN)
                tile_store(c_ptr, acc, off_m, off_n, end, N, ldc, False, BM, BN)
            else:
                h = glu_epilogue(acc, g, G, off_m, end, off_n, N, bias, (None, 0, activation), GLU,
                                 BM, BN)
                tile_store(c_ptr, h, off_m, off_n // 2, end, N // 2, ldc, False, BM, BN // 2)
        tiles_before = chunk_end
        rows_before = tl.max(ends)
