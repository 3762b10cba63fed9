"""scaled_k.py's BLOCKWISE weight gradient as a warp-specialised persistent
kernel for sm90, in Gluon: same parameters, tile order and offset rules as
scaled_k.scaled_ragged_k_kernel.

A loader warp fills a STAGES-deep ring with each tile's 128-wide K blocks of
a and b (the group's blocks of the padded layout: no clipping, no
clearing).  Two MMA partitions of one warpgroup each take 64 rows of a
128-row tile.  As ragged_ws.py's blockwise kernel, each keeps one
accumulator that the tensor cores add every block's product to, rescaled
between blocks on the CUDA cores, and the two take turns so that one's
rescaling runs while the other's MMA does; here a block's scale is the
product of a row's and a column's (1x128 along T on both operands), so the
accumulator's unit is too (accumulate_blocks).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .gluon_api import tma_load
from .ragged_k_ws import locate, total_tiles
from .ragged_ws import MMA_REGISTERS, operands, pass_blocks, wait_turn
from .scaled import BLOCKWISE, SCALE_BLOCK
from .ws import (EPILOGUE_COLS, LOADER_REGISTERS, LOADER_WARPS, accumulator_layout,
                 allocate_ring, claim_slot, shared_layout, store_tile)

PARTS = gl.constexpr(2)
# The accumulator's units per operand are no smaller than these (unit_of).
UNIT_FLOOR = gl.constexpr(2.0**-60)
UNIT_RANGE = gl.constexpr(2.0**-30)


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
    """A block's scales of the tile's rows and columns (1 past M and N, and
    where the block is not `valid`: past the group's last)."""
    scale_a = gl.load(scale_a_ptr + rows.to(gl.int64) * blocks + block, mask=row_ok & valid,
                      other=1.0)
    scale_b = gl.load(scale_b_ptr + cols.to(gl.int64) * blocks + block, mask=col_ok & valid,
                      other=1.0)
    return scale_a, scale_b


@gluon.jit
def unit_of(scale, largest):
    """An operand's unit while a block of this scale is added: the scale,
    raised to UNIT_FLOOR or UNIT_RANGE x the largest scale so far where it
    is smaller.  Both operands' ratios of a block's scale to the current
    unit are then at most 2^30, so |accumulator| stays below 2^60 x the sum
    of the blocks' fp8 products; a block so raised adds at most UNIT_RANGE x
    the largest block scale x its product more than it should.
    quantize_fp8_columns' scales are at least 1e-12 / 448 (above the floor)."""
    bound = gl.maximum(largest * UNIT_RANGE, UNIT_FLOOR)
    return gl.where(gl.abs(scale) < bound, bound, scale)


@gluon.jit
def accumulate_blocks(a_bufs, b_bufs, ready, empty, turns, count, first, steps, scales, rows,
                      cols, M, N, blocks, half: gl.constexpr, PART_M: gl.constexpr,
                      BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                      acc_layout: gl.constexpr):
    """(the partition's scaled sum over blocks first .. first + steps, the
    ring count after it), in one accumulator that the tensor cores add each
    block's product to, kept in units of the current block's row and column
    scales (unit_of): before block j's MMA the accumulator is multiplied by
    unit[j-1] / unit[j] of its row and of its column, and at the end by the
    last units.  The two partitions take turns as ragged_ws's
    accumulate_blockwise's, so that one's multiplies run while the other's
    MMA does; the next block's scales load a block ahead."""
    scale_a_ptr, scale_b_ptr = scales
    row_ok = rows < M
    col_ok = cols < N
    last = first + steps
    acc = gl.zeros([PART_M, BN], gl.float32, acc_layout)
    unit_a = gl.full([PART_M], 1.0, gl.float32, rows.type.layout)
    unit_b = gl.full([BN], 1.0, gl.float32, cols.type.layout)
    largest_a = gl.zeros([PART_M], gl.float32, rows.type.layout)
    largest_b = gl.zeros([BN], gl.float32, cols.type.layout)
    scale_a, scale_b = block_scales(scale_a_ptr, scale_b_ptr, rows, row_ok, cols, col_ok, blocks,
                                    first, steps > 0)
    HALF_K: gl.constexpr = BK // 2
    for block in range(first, last):
        slot = count % STAGES
        next_a, next_b = block_scales(scale_a_ptr, scale_b_ptr, rows, row_ok, cols, col_ok,
                                      blocks, block + 1, block + 1 < last)
        largest_a = gl.maximum(largest_a, gl.abs(scale_a))
        largest_b = gl.maximum(largest_b, gl.abs(scale_b))
        new_a = unit_of(scale_a, largest_a)
        new_b = unit_of(scale_b, largest_b)
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=block > first)
        acc = acc * gl.expand_dims(unit_a / new_a, 1) * gl.expand_dims(unit_b / new_b, 0)
        unit_a = new_a
        unit_b = new_b
        scale_a = next_a
        scale_b = next_b
        a, b = operands(a_bufs, b_bufs, slot, half, PART_M, False, True)
        wait_turn(turns, half, count)
        acc = warpgroup_mma(a.slice(0, HALF_K, dim=1), b.slice(0, HALF_K), acc, is_async=True)
        acc = warpgroup_mma(a.slice(HALF_K, HALF_K, dim=1), b.slice(HALF_K, HALF_K), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(1, deps=(acc, ))  # the first half is done
        mbarrier.arrive(turns.index(half))
        count += 1
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=steps > 0)
    return acc * gl.expand_dims(unit_a, 1) * gl.expand_dims(unit_b, 0), count


@gluon.jit
def mma_partition(half: gl.constexpr, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, turns,
                  offs_ptr, scales, M, N, T, G, BM: gl.constexpr, BN: gl.constexpr,
                  BK: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr):
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
            acc, count = accumulate_blocks(a_bufs, b_bufs, ready, empty, turns, count, first,
                                           steps, scales, rows, cols, M, N, blocks, half, PART_M,
                                           BN, BK, STAGES, acc_layout)
            store_tile(acc, c_desc, c_buf, (g, part_m), off_n)
        else:
            count = pass_blocks(ready, empty, turns, count, steps * BK, half, BK, STAGES)
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
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    gl.warp_specialize([
        (mma_partition, (0, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, turns, offs_ptr, scales,
                         M, N, T, G, BM, BN, BK, CHUNK, STAGES)),
        (mma_partition, (1, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, turns, offs_ptr, scales,
                         M, N, T, G, BM, BN, BK, CHUNK, STAGES)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, T, G, BM,
                          BN, BK, CHUNK, STAGES)),
    ], [gl.num_warps(), LOADER_WARPS], [MMA_REGISTERS, LOADER_REGISTERS])
