"""scaled_k.py's BLOCKWISE weight gradient as a warp-specialised persistent
kernel for sm90, in Gluon: same parameters, tile order and offset rules as
scaled_k.scaled_ragged_k_kernel.

A loader warp fills a STAGES-deep ring with each tile's 128-wide K blocks of
a and b (the group's blocks of the padded layout: no clipping, no
clearing).  Two MMA partitions of one warpgroup each take 64 rows of a
128-row tile and run apart: each makes a block's product from zero on the
tensor cores, frees the slot, then scales the product by its rows' and
columns' scales of that block and adds it to its float32 accumulator on the
CUDA cores, while the other partition's MMA runs.  (ragged_ws.py's rescaled
single accumulator does not apply: here the scales vary along both the
rows and the columns of a tile, so its units would be per element.)
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .gluon_api import tma_load
from .ragged_k_ws import locate, total_tiles
from .ragged_ws import MMA_REGISTERS, operands, pass_blocks
from .scaled import BLOCKWISE, SCALE_BLOCK
from .ws import (EPILOGUE_COLS, LOADER_REGISTERS, LOADER_WARPS, accumulator_layout,
                 allocate_ring, claim_slot, shared_layout, store_tile)

PARTS = gl.constexpr(2)


@gluon.jit
def group_blocks(g, start, end, BK: gl.constexpr):
    """(the first block of group g's rows [start, end), how many it has)."""
    return start // BK + g, (end - start + BK - 1) // BK


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, T, G,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                   STAGES: gl.constexpr):
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
            count += 1


@gluon.jit
def block_scales(scale_a_ptr, scale_b_ptr, rows, row_ok, cols, col_ok, blocks, block, valid):
    """A block's scales of the tile's rows and columns (0 past M and N, and
    where the block is not `valid`: past the group's last)."""
    scale_a = gl.load(scale_a_ptr + rows.to(gl.int64) * blocks + block, mask=row_ok & valid,
                      other=0.0)
    scale_b = gl.load(scale_b_ptr + cols.to(gl.int64) * blocks + block, mask=col_ok & valid,
                      other=0.0)
    return scale_a, scale_b


@gluon.jit
def accumulate_blocks(a_bufs, b_bufs, ready, empty, count, first, steps, scales, rows, cols,
                      M, N, blocks, half: gl.constexpr, PART_M: gl.constexpr, BN: gl.constexpr,
                      STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """(the partition's scaled sum over blocks first .. first + steps, the
    ring count after it).  The next block's scales load while this one's
    MMA runs."""
    scale_a_ptr, scale_b_ptr = scales
    row_ok = rows < M
    col_ok = cols < N
    acc = gl.zeros([PART_M, BN], gl.float32, acc_layout)
    last = first + steps
    scale_a, scale_b = block_scales(scale_a_ptr, scale_b_ptr, rows, row_ok, cols, col_ok, blocks,
                                    first, steps > 0)
    for block in range(first, last):
        slot = count % STAGES
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        a, b = operands(a_bufs, b_bufs, slot, half, PART_M, False, True)
        product = warpgroup_mma(a, b, acc, use_acc=False, is_async=True)
        next_a, next_b = block_scales(scale_a_ptr, scale_b_ptr, rows, row_ok, cols, col_ok,
                                      blocks, block + 1, block + 1 < last)
        product = warpgroup_mma_wait(0, deps=(product, ))
        mbarrier.arrive(empty.index(slot))
        acc += product * gl.expand_dims(scale_a, 1) * gl.expand_dims(scale_b, 0)
        scale_a = next_a
        scale_b = next_b
        count += 1
    return acc, count


@gluon.jit
def mma_partition(half: gl.constexpr, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, offs_ptr,
                  scales, M, N, T, G, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  CHUNK: gl.constexpr, STAGES: gl.constexpr):
    """Rows half * 64 .. half * 64 + 64 of every tile of this program; a
    partition whose rows all lie past M passes its blocks unread."""
    PART_M: gl.constexpr = BM // PARTS
    acc_layout: gl.constexpr = accumulator_layout(BN, gl.num_warps(), 8)
    blocks = T // BK + G
    c_buf = c_bufs.index(half)
    count = 0
    g = -1
    start = 0
    end = 0
    for tile in range(gl.program_id(0), total_tiles(M, N, G, BM, BN), gl.num_programs(0)):
        g, off_m, off_n, start, end = locate(tile, offs_ptr, M, N, T, g, start, end, BM, BN,
                                             CHUNK)
        first, steps = group_blocks(g, start, end, BK)
        part_m = off_m + half * PART_M
        if part_m < M:
            rows = part_m + gl.arange(0, PART_M, gl.SliceLayout(1, acc_layout))
            cols = off_n + gl.arange(0, BN, gl.SliceLayout(0, acc_layout))
            acc, count = accumulate_blocks(a_bufs, b_bufs, ready, empty, count, first, steps,
                                           scales, rows, cols, M, N, blocks, half, PART_M, BN,
                                           STAGES, acc_layout)
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
    """scaled_ragged_k_kernel's contract for BLOCKWISE scales, TMA only (USE_TMA
    and PRECISION are taken for the common signature)."""
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
                                                         [PART_M, EPI_N], PARTS, STAGES)
    scales = (scale_a_ptr, scale_b_ptr)
    gl.warp_specialize([
        (mma_partition, (0, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, offs_ptr, scales, M, N,
                         T, G, BM, BN, BK, CHUNK, STAGES)),
        (mma_partition, (1, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, offs_ptr, scales, M, N,
                         T, G, BM, BN, BK, CHUNK, STAGES)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, T, G, BM,
                          BN, BK, CHUNK, STAGES)),
    ], [gl.num_warps(), LOADER_WARPS], [MMA_REGISTERS, LOADER_REGISTERS])
