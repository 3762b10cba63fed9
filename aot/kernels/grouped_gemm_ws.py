"""grouped_gemm (kernels/grouped_gemm.py's contract: per-group pointers, sizes
and leading dimensions in a group table, the host's tile prefix) as a
warp-specialised persistent kernel for sm90, in Gluon.

Same tile walk as grouped_gemm_kernel: program p takes tiles p, p + P, ... of the
list of every group's tiles, m-tile fastest.  The partitions are those of
kernels/ws.py: a loader warp fills a STAGES-deep ring of (A, B) K blocks, the
MMA partition runs asynchronous wgmma on it, one MMA in flight, and stores
each tile through TMA in column parts.

Every group has its own tensors, so each tile's descriptors are made on the
device (A and B by the loader, C by the MMA partition) in the same per-program
scratch slots.  A descriptor must not change under a TMA copy still using it:
the loader waits for its last loads to land, and the MMA partition until its
last stores have read their data (the wait TMA stores offer), before making
the next tile's.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .epilogue_ws import store_tile
from .gluon_api import tma_load
from .grouped_gemm import A_, B_, C_, FIELDS, K_, LDA_, LDB_, LDC_, M_, N_
from .loader_ws import claim_slot
from .mma_ws import operands
from .ws import (EPILOGUE_COLS, LOADER_REGISTERS, LOADER_WARPS, accumulator_layout, allocate_ring,
                 first_step_past, shared_layout)


@gluon.jit
def chunk_tiles(tile_ends, chunk, G, CHUNK: gl.constexpr):
    """(tile prefix of the CHUNK groups from `chunk`, which of them exist,
    first tile of the chunk, end of its tiles), in the calling partition's warps."""
    layout: gl.constexpr = gl.BlockedLayout([CHUNK // 32], [32], [gl.num_warps()], [0])
    lane = gl.arange(0, CHUNK, layout)
    in_range = chunk + lane < G
    ends = gl.load(tile_ends + chunk + lane, mask=in_range, other=0).to(gl.int32)
    chunk_start = gl.load(tile_ends + chunk - 1, mask=chunk > 0, other=0).to(gl.int32)
    return ends, in_range, chunk_start, gl.max(ends, 0)


@gluon.jit
def group_field(group_table, g, field: gl.constexpr):
    return gl.load(group_table + g.to(gl.int64) * FIELDS + field)


@gluon.jit
def tile_of(group_table, tile_ends, t, chunk, ends, in_range, BM: gl.constexpr,
            BN: gl.constexpr):
    """(group, its M, N, K, the tile's origin) of tile t, among the groups of
    the chunk from `chunk` (chunk_tiles' ends and in_range)."""
    g = chunk + gl.sum((in_range & (ends <= t)).to(gl.int32), 0)
    first_tile = gl.load(tile_ends + g - 1, mask=g > 0, other=0).to(gl.int32)
    M = group_field(group_table, g, M_).to(gl.int32)
    N = group_field(group_table, g, N_).to(gl.int32)
    K = group_field(group_table, g, K_).to(gl.int32)
    m_tiles = (M + BM - 1) // BM
    in_group = t - first_tile
    return g, M, N, K, in_group % m_tiles * BM, in_group // m_tiles * BN


@gluon.jit
def wait_landed(ready, count, STAGES: gl.constexpr):
    """Wait until every load issued (`count` of them) has landed.  Only the
    last STAGES can be in flight: the loader waited for each earlier one's
    slot to be freed before reusing it."""
    for i in gl.static_range(STAGES):
        c = count - 1 - i
        mbarrier.wait(ready.index(c % STAGES), c // STAGES & 1, pred=c >= 0)


@gluon.jit
def load_tile(group_table, g, M, N, K, off_m, off_n, a_bufs, b_bufs, ready, empty, count,
              DTYPE: gl.constexpr, B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
              BK: gl.constexpr, STAGES: gl.constexpr):
    """Make group g's A and B descriptors and load the tile's K blocks into
    the ring.  Returns the ring count after it."""
    nbytes: gl.constexpr = (BM + BN) * BK * DTYPE.primitive_bitwidth // 8
    a_block: gl.constexpr = [BM, BK]
    b_block: gl.constexpr = [BN, BK] if B_T else [BK, BN]
    k_dim = gl.maximum(K, 1)  # K = 0: a valid descriptor that is never loaded
    a_ptr = group_field(group_table, g, A_).to(gl.pointer_type(DTYPE))
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, k_dim], [group_field(group_table, g, LDA_), 1],
                                        a_block, shared_layout(a_block, DTYPE))
    b_ptr = group_field(group_table, g, B_).to(gl.pointer_type(DTYPE))
    b_shape = [N, k_dim] if B_T else [k_dim, N]
    b_desc = tma.make_tensor_descriptor(b_ptr, b_shape, [group_field(group_table, g, LDB_), 1],
                                        b_block, shared_layout(b_block, DTYPE))
    for k0 in range(0, K, BK):
        slot, bar = claim_slot(ready, empty, count, nbytes, STAGES)
        tma_load(a_desc, [off_m, k0], bar, a_bufs.index(slot))
        if B_T:
            tma_load(b_desc, [off_n, k0], bar, b_bufs.index(slot))
        else:
            tma_load(b_desc, [k0, off_n], bar, b_bufs.index(slot))
        count += 1
    return count


@gluon.jit
def load_partition(group_table, tile_ends, G, a_bufs, b_bufs, ready, empty, DTYPE: gl.constexpr,
                   B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                   CHUNK: gl.constexpr, STAGES: gl.constexpr):
    """The loader: each tile's descriptors, then its K blocks into the ring.
    (The walk over the tiles is written out in both partitions: Gluon has no
    generators.)"""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    count = 0
    for chunk in range(0, G, CHUNK):
        ends, in_range, chunk_start, chunk_end = chunk_tiles(tile_ends, chunk, G, CHUNK)
        for t in range(first_step_past(pid, chunk_start, programs), chunk_end, programs):
            g, M, N, K, off_m, off_n = tile_of(group_table, tile_ends, t, chunk, ends, in_range,
                                               BM, BN)
            wait_landed(ready, count, STAGES)  # the last tile's descriptors are done with
            count = load_tile(group_table, g, M, N, K, off_m, off_n, a_bufs, b_bufs, ready,
                              empty, count, DTYPE, B_T, BM, BN, BK, STAGES)


@gluon.jit
def store_descriptor(group_table, g, M, N, BM: gl.constexpr, EPI_N: gl.constexpr,
                     DTYPE: gl.constexpr):
    """Group g's C, in [BM, EPI_N] blocks, made in the one scratch slot once
    the stores through the previous descriptor have read their data."""
    tma.store_wait(0)
    c_ptr = group_field(group_table, g, C_).to(gl.pointer_type(DTYPE))
    return tma.make_tensor_descriptor(c_ptr, [M, N], [group_field(group_table, g, LDC_), 1],
                                      [BM, EPI_N], shared_layout([BM, EPI_N], DTYPE))


@gluon.jit
def issue_block(a_bufs, b_bufs, ready, count, acc, B_T: gl.constexpr, BM: gl.constexpr,
                STAGES: gl.constexpr):
    """Wait for ring block `count` and start its MMA into acc (not waited for)."""
    slot = count % STAGES
    mbarrier.wait(ready.index(slot), count // STAGES & 1)
    a, b = operands(a_bufs, b_bufs, slot, 0, BM, False, B_T)
    return warpgroup_mma(a, b, acc, is_async=True)


@gluon.jit
def mma_tile(group_table, g, M, N, K, off_m, off_n, a_bufs, b_bufs, c_buf, ready, empty, count,
             DTYPE: gl.constexpr, B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
             BK: gl.constexpr, STAGES: gl.constexpr):
    """A tile with K > 0, one MMA in flight; its store descriptor is made while
    the first block's MMA runs (off the tensor cores' path; the last tile's
    stores have had that long to finish).  Returns the ring count after it."""
    acc = gl.zeros([BM, BN], gl.float32, accumulator_layout(BN, gl.num_warps()))
    acc = issue_block(a_bufs, b_bufs, ready, count, acc, B_T, BM, STAGES)
    acc = warpgroup_mma_wait(1, deps=(acc, ))  # one may stay in flight: no wait
    c_desc = store_descriptor(group_table, g, M, N, BM, c_buf.shape[1], DTYPE)
    for k0 in range(BK, K, BK):
        acc = issue_block(a_bufs, b_bufs, ready, count + 1, acc, B_T, BM, STAGES)
        acc = warpgroup_mma_wait(1, deps=(acc, ))  # the block before is done with its slot
        mbarrier.arrive(empty.index(count % STAGES))
        count += 1
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index(count % STAGES))
    store_tile(acc, c_desc, c_buf, (off_m, ), off_n)
    return count + 1


@gluon.jit
def mma_partition(group_table, tile_ends, G, a_bufs, b_bufs, c_buf, ready, empty,
                  DTYPE: gl.constexpr, B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  BK: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr):
    """The MMA partition: the loader's tiles in the same order, each stored."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    count = 0
    for chunk in range(0, G, CHUNK):
        ends, in_range, chunk_start, chunk_end = chunk_tiles(tile_ends, chunk, G, CHUNK)
        for t in range(first_step_past(pid, chunk_start, programs), chunk_end, programs):
            g, M, N, K, off_m, off_n = tile_of(group_table, tile_ends, t, chunk, ends, in_range,
                                               BM, BN)
            if K > 0:
                count = mma_tile(group_table, g, M, N, K, off_m, off_n, a_bufs, b_bufs, c_buf,
                                 ready, empty, count, DTYPE, B_T, BM, BN, BK, STAGES)
            else:  # no K blocks in the ring: a zero tile
                c_desc = store_descriptor(group_table, g, M, N, BM, c_buf.shape[1], DTYPE)
                zeros = gl.zeros([BM, BN], gl.float32, accumulator_layout(BN, gl.num_warps()))
                store_tile(zeros, c_desc, c_buf, (off_m, ), off_n)
    tma.store_wait(0)


@gluon.jit
def grouped_gemm_ws_kernel(group_table, tile_ends, G, DTYPE: gl.constexpr, B_T: gl.constexpr,
                        USE_TMA: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                        BK: gl.constexpr, CHUNK: gl.constexpr, PRECISION: gl.constexpr,
                        STAGES: gl.constexpr):
    """grouped_gemm_kernel's contract, TMA only (16-byte aligned bases and leading
    dimensions, host-checked); USE_TMA and PRECISION (16-bit inputs only) are
    taken for the common signature."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    b_tile: gl.constexpr = [BN, BK] if B_T else [BK, BN]
    EPI_N: gl.constexpr = BN if BN < EPILOGUE_COLS else EPILOGUE_COLS
    a_bufs, b_bufs, c_bufs, ready, empty = allocate_ring(DTYPE, DTYPE, [BM, BK], b_tile,
                                                         [BM, EPI_N], 1, STAGES)
    c_buf = c_bufs.index(0)
    gl.warp_specialize([
        (mma_partition, (group_table, tile_ends, G, a_bufs, b_bufs, c_buf, ready, empty, DTYPE,
                         B_T, BM, BN, BK, CHUNK, STAGES)),
        (load_partition, (group_table, tile_ends, G, a_bufs, b_bufs, ready, empty, DTYPE, B_T,
                          BM, BN, BK, CHUNK, STAGES)),
    ], [LOADER_WARPS], [LOADER_REGISTERS])
