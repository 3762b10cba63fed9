"""scaled_k.py's BLOCKWISE weight gradient as a warp-specialised persistent
kernel for sm90, in Gluon: same parameters, tile order and offset rules as
scaled_k.scaled_ragged_k_kernel.

The loader warp fills a STAGES-deep ring with each tile's 128-wide K blocks
of a and b by TMA (the group's blocks of the padded layout: no clipping, no
clearing) and, beside them, the block's scales of the tile's rows and
columns, which its threads copy by cp.async (quantize_fp8_columns stores
them block by block, so each is one contiguous run).  Two MMA partitions of
one warpgroup each take 64 rows of a 128-row tile and run apart: each makes
a block's product from zero on the tensor cores, reads the block's scales
from the ring, frees the slot, then scales the product by its rows' and
columns' scales and adds it to its float32 accumulator on the CUDA cores,
while the other partition's MMA runs (the DeepSeek-V3 recipe's promotion;
a block's scale is a row's times a column's, so mma_ws.py's single
rescaled accumulator would need a unit per element).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from .epilogue_ws import store_tile
from .gluon_api import cp_async_load, tma_load
from .loader_ws import claim_slot
from .mma_ws import MMA_REGISTERS, operands, pass_blocks
from .ragged_k_ws import locate, total_tiles
from .scaled import BLOCKWISE, SCALE_BLOCK
from .ws import (EPILOGUE_COLS, LOADER_REGISTERS, LOADER_WARPS, accumulator_layout, allocate_ring,
                 shared_layout)

PARTS = gl.constexpr(2)
VECTOR = gl.constexpr(4)  # floats in one 16-byte copy


@gluon.jit
def group_blocks(g, start, end, BK: gl.constexpr):
    """(the first block of group g's rows [start, end), how many it has)."""
    return start // BK + g, (end - start + BK - 1) // BK


@gluon.jit
def copy_scales(buf, scale_ptr, block, width, origin):
    """scale[block, origin .. origin + len(buf)] of a [*, width] row-major
    scale into buf (zeros past width), 16 bytes a copy (width is a multiple
    of 16: the operator's rule)."""
    layout: gl.constexpr = gl.BlockedLayout([VECTOR], [32], [gl.num_warps()], [0])
    at = gl.max_contiguous(gl.multiple_of(origin + gl.arange(0, buf.shape[0], layout), VECTOR),
                           VECTOR)
    row = gl.multiple_of(scale_ptr + block.to(gl.int64) * width, 16)
    cp_async_load(buf, row + at, gl.max_constancy(at < width, VECTOR))


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, offs_ptr,
                   scales, M, N, T, G, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                   CHUNK: gl.constexpr, STAGES: gl.constexpr):
    """Each block: the tiles by TMA (their bytes expected by one arrival),
    the scales by the threads' copies (one arrival each when they land)."""
    scale_a_ptr, scale_b_ptr = scales
    nbytes: gl.constexpr = (BM + BN) * BK  # fp8: a byte an element
    count = 0
    g = -1
    start = 0
    end = 0
    for tile in range(gl.program_id(0), total_tiles(M, N, G, BM, BN), gl.num_programs(0)):
        g, off_m, off_n, start, end = locate(tile, offs_ptr, M, N, T, g, start, end, BM, BN,
                                             CHUNK)
        first, steps = group_blocks(g, start, end, BK)
        for block in range(first, first + steps):
            slot, bar = claim_slot(ready, empty, count, nbytes, STAGES)
            tma_load(a_desc, [off_m, block * BK], bar, a_bufs.index(slot))
            tma_load(b_desc, [off_n, block * BK], bar, b_bufs.index(slot))
            copy_scales(sa_bufs.index(slot), scale_a_ptr, block, M, off_m)
            copy_scales(sb_bufs.index(slot), scale_b_ptr, block, N, off_n)
            async_copy.mbarrier_arrive(bar, increment_count=False)
            count += 1


@gluon.jit
def accumulate_blocks(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, count, steps,
                      half: gl.constexpr, PART_M: gl.constexpr, BN: gl.constexpr,
                      STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """(the partition's sum over the tile's `steps` blocks, each block's
    product scaled before it is added, the ring count after it)."""
    acc = gl.zeros([PART_M, BN], gl.float32, acc_layout)
    for _ in range(steps):
        slot = count % STAGES
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        a, b = operands(a_bufs, b_bufs, slot, half, PART_M, False, True)
        product = warpgroup_mma(a, b, acc, use_acc=False, is_async=True)
        scale_a = sa_bufs.index(slot).slice(half * PART_M, PART_M).load(
            gl.SliceLayout(1, acc_layout))
        scale_b = sb_bufs.index(slot).load(gl.SliceLayout(0, acc_layout))
        product = warpgroup_mma_wait(0, deps=(product, ))
        mbarrier.arrive(empty.index(slot))
        acc += product * gl.expand_dims(scale_a, 1) * gl.expand_dims(scale_b, 0)
        count += 1
    return acc, count


@gluon.jit
def mma_partition(half: gl.constexpr, c_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, c_bufs, ready,
                  empty, offs_ptr, M, N, T, G, BM: gl.constexpr, BN: gl.constexpr,
                  BK: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr):
    """Rows half * BM / 2 .. of every tile of this program; a partition whose
    rows all lie past M passes its blocks unread."""
    PART_M: gl.constexpr = BM // PARTS
    acc_layout: gl.constexpr = accumulator_layout(BN, gl.num_warps(), 8)
    c_buf = c_bufs.index(half)
    count = 0
    g = -1
    start = 0
    end = 0
    for tile in range(gl.program_id(0), total_tiles(M, N, G, BM, BN), gl.num_programs(0)):
        g, off_m, off_n, start, end = locate(tile, offs_ptr, M, N, T, g, start, end, BM, BN,
                                             CHUNK)
        steps = group_blocks(g, start, end, BK)[1]
        part_m = off_m + half * PART_M
        if part_m < M:
            acc, count = accumulate_blocks(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, count,
                                           steps, half, PART_M, BN, STAGES, acc_layout)
            store_tile(acc, c_desc, c_buf, (g, part_m), off_n)
        else:
            count = pass_blocks(ready, empty, None, count, steps * BK, half, BK, STAGES)
    tma.store_wait(0)


@gluon.jit
def scaled_ragged_k_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, M, N, T, G,
                              ldc, SCALING: gl.constexpr, USE_TMA: gl.constexpr,
                              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                              CHUNK: gl.constexpr, PRECISION: gl.constexpr,
                              STAGES: gl.constexpr):
    """scaled_ragged_k_kernel's contract for BLOCKWISE scales, M and N
    multiples of 16, TMA only (USE_TMA and PRECISION are taken for the
    common signature)."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    gl.static_assert(SCALING == BLOCKWISE, "ROWWISE runs the Triton kernel")
    gl.static_assert(BK == SCALE_BLOCK, "one K step a 128-wide block")
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    out: gl.constexpr = c_ptr.dtype.element_ty
    width = (T // BK + G) * BK
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, width], [width, 1], [BM, BK],
                                        shared_layout([BM, BK], dtype))
    b_desc = tma.make_tensor_descriptor(b_ptr, [N, width], [width, 1], [BN, BK],
                                        shared_layout([BN, BK], dtype))
    PART_M: gl.constexpr = BM // PARTS
    gl.static_assert(gl.num_warps() * 16 == PART_M, "two partitions of a warpgroup's rows")
    EPI_N: gl.constexpr = BN if BN < EPILOGUE_COLS else EPILOGUE_COLS
    c_desc = tma.make_tensor_descriptor(c_ptr, [G, M, N], [M * ldc, ldc, 1], [1, PART_M, EPI_N],
                                        shared_layout([1, PART_M, EPI_N], out))
    a_bufs, b_bufs, c_bufs, ready, empty = allocate_ring(dtype, out, [BM, BK], [BN, BK],
                                                         [PART_M, EPI_N], PARTS, STAGES,
                                                         COPIERS=32 * LOADER_WARPS)
    vectors: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    sa_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM], vectors)
    sb_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BN], vectors)
    gl.warp_specialize([
        (mma_partition, (0, c_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, c_bufs, ready, empty,
                         offs_ptr, M, N, T, G, BM, BN, BK, CHUNK, STAGES)),
        (mma_partition, (1, c_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, c_bufs, ready, empty,
                         offs_ptr, M, N, T, G, BM, BN, BK, CHUNK, STAGES)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty,
                          offs_ptr, (scale_a_ptr, scale_b_ptr), M, N, T, G, BM, BN, BK, CHUNK,
                          STAGES)),
    ], [gl.num_warps(), LOADER_WARPS], [MMA_REGISTERS, LOADER_REGISTERS])
