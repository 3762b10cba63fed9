"""The list layout (kernels/list_gemm.py's contract: per-group pointers, sizes
and leading dimensions in a group table, the host's tile prefix) as a
warp-specialised persistent kernel for sm90, in Gluon.

Same tile walk as list_gemm_kernel: program p takes tiles p, p + P, ... of the
list of every group's tiles, m-tile fastest.  The partitions are those of
kernels/ws.py: a loader warp fills a STAGES-deep ring of (A, B) K blocks, the
MMA partition runs asynchronous wgmma on it (ragged_ws.accumulate) and stores
each tile through TMA in column parts.

Every group has its own tensors, so each tile's descriptors are made on the
device (A and B by the loader, C by the MMA partition) in the same per-program
scratch slots.  A descriptor must not change under a TMA copy still using it:
the loader waits for its last loads to land, and the MMA partition for its
last stores to finish, before making the next tile's.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .list_gemm import A_, B_, C_, FIELDS, K_, LDA_, LDB_, LDC_, M_, N_
from .ragged_ws import accumulate
from .ws import (EPILOGUE_COLS, LOADER_REGISTERS, LOADER_WARPS, accumulator_layout, column_parts,
                 first_step_past, shared_layout)


@gluon.jit
def tile_group(t, chunk, ends, in_range, tile_ends):
    """(group, its first tile) of tile t, among the CHUNK groups from `chunk`
    whose inclusive tile prefix is `ends`."""
    g = chunk + gl.sum((in_range & (ends <= t)).to(gl.int32), 0)
    first_tile = gl.load(tile_ends + g - 1, mask=g > 0, other=0).to(gl.int32)
    return g, first_tile


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
def tile_origin(t, first_tile, M, BM: gl.constexpr, BN: gl.constexpr):
    m_tiles = (M + BM - 1) // BM
    in_group = t - first_tile
    return in_group % m_tiles * BM, in_group // m_tiles * BN


@gluon.jit
def wait_landed(ready, count, STAGES: gl.constexpr):
    """Wait until the last STAGES loads issued (of `count`) have landed; those
    before them have been read already (their slots were freed)."""
    for i in gl.static_range(STAGES):
        c = count - 1 - i
        mbarrier.wait(ready.index(c % STAGES), c // STAGES & 1, pred=c >= 0)


@gluon.jit
def load_partition(group_table, tile_ends, G, a_bufs, b_bufs, ready, empty, DTYPE: gl.constexpr,
                   B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                   CHUNK: gl.constexpr, STAGES: gl.constexpr):
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    nbytes: gl.constexpr = (BM + BN) * BK * DTYPE.primitive_bitwidth // 8
    a_block: gl.constexpr = [BM, BK]
    b_block: gl.constexpr = [BN, BK] if B_T else [BK, BN]
    count = 0
    for chunk in range(0, G, CHUNK):
        ends, in_range, chunk_start, chunk_end = chunk_tiles(tile_ends, chunk, G, CHUNK)
        for t in range(first_step_past(pid, chunk_start, programs), chunk_end, programs):
            g, first_tile = tile_group(t, chunk, ends, in_range, tile_ends)
            M = group_field(group_table, g, M_).to(gl.int32)
            N = group_field(group_table, g, N_).to(gl.int32)
            K = group_field(group_table, g, K_).to(gl.int32)
            off_m, off_n = tile_origin(t, first_tile, M, BM, BN)
            a_ptr = group_field(group_table, g, A_).to(gl.pointer_type(DTYPE))
            b_ptr = group_field(group_table, g, B_).to(gl.pointer_type(DTYPE))
            k_dim = gl.maximum(K, 1)  # K = 0: a valid descriptor that is never loaded
            wait_landed(ready, count, STAGES)
            a_desc = tma.make_tensor_descriptor(a_ptr, [M, k_dim],
                                                [group_field(group_table, g, LDA_), 1],
                                                a_block, shared_layout(a_block, DTYPE))
            b_shape = [N, k_dim] if B_T else [k_dim, N]
            b_desc = tma.make_tensor_descriptor(b_ptr, b_shape,
                                                [group_field(group_table, g, LDB_), 1],
                                                b_block, shared_layout(b_block, DTYPE))
            for k0 in range(0, K, BK):
                slot = count % STAGES
                mbarrier.wait(empty.index(slot), (count // STAGES & 1) ^ 1)
                bar = ready.index(slot)
                mbarrier.expect(bar, nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, k0], bar, a_bufs.index(slot))
                if B_T:
                    tma.async_copy_global_to_shared(b_desc, [off_n, k0], bar, b_bufs.index(slot))
                else:
                    tma.async_copy_global_to_shared(b_desc, [k0, off_n], bar, b_bufs.index(slot))
                count += 1


@gluon.jit
def mma_partition(group_table, tile_ends, G, a_bufs, b_bufs, c_buf, ready, empty,
                  DTYPE: gl.constexpr, B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  BK: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr):
    acc_layout: gl.constexpr = accumulator_layout(BN, gl.num_warps())
    EPI_N: gl.constexpr = c_buf.shape[1]
    c_block: gl.constexpr = [BM, EPI_N]
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    count = 0
    for chunk in range(0, G, CHUNK):
        ends, in_range, chunk_start, chunk_end = chunk_tiles(tile_ends, chunk, G, CHUNK)
        for t in range(first_step_past(pid, chunk_start, programs), chunk_end, programs):
            g, first_tile = tile_group(t, chunk, ends, in_range, tile_ends)
            M = group_field(group_table, g, M_).to(gl.int32)
            N = group_field(group_table, g, N_).to(gl.int32)
            K = group_field(group_table, g, K_).to(gl.int32)
            off_m, off_n = tile_origin(t, first_tile, M, BM, BN)
            acc, count = accumulate(a_bufs, b_bufs, ready, empty, count, K, 0, BM, B_T, BN, BK,
                                    STAGES, acc_layout)
            parts = column_parts(acc.to(DTYPE), BN // EPI_N)
            tma.store_wait(0)  # no store still reads the descriptor made below
            c_ptr = group_field(group_table, g, C_).to(gl.pointer_type(DTYPE))
            c_desc = tma.make_tensor_descriptor(c_ptr, [M, N],
                                                [group_field(group_table, g, LDC_), 1],
                                                c_block, shared_layout(c_block, DTYPE))
            for i in gl.static_range(BN // EPI_N):
                tma.store_wait(0)  # the previous store has read c_buf
                c_buf.store(parts[i])
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n + i * EPI_N], c_buf)
    tma.store_wait(0)


@gluon.jit
def list_gemm_ws_kernel(group_table, tile_ends, G, DTYPE: gl.constexpr, B_T: gl.constexpr,
                        USE_TMA: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                        BK: gl.constexpr, CHUNK: gl.constexpr, PRECISION: gl.constexpr,
                        STAGES: gl.constexpr):
    """list_gemm_kernel's contract, TMA only (16-byte aligned bases and leading
    dimensions, host-checked); USE_TMA and PRECISION (16-bit inputs only) are
    taken for the common signature."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    b_tile: gl.constexpr = [BN, BK] if B_T else [BK, BN]
    EPI_N: gl.constexpr = BN if BN < EPILOGUE_COLS else EPILOGUE_COLS
    a_bufs = gl.allocate_shared_memory(DTYPE, [STAGES, BM, BK], shared_layout([BM, BK], DTYPE))
    b_bufs = gl.allocate_shared_memory(DTYPE, [STAGES] + b_tile, shared_layout(b_tile, DTYPE))
    c_buf = gl.allocate_shared_memory(DTYPE, [BM, EPI_N], shared_layout([BM, EPI_N], DTYPE))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (mma_partition, (group_table, tile_ends, G, a_bufs, b_bufs, c_buf, ready, empty, DTYPE,
                         B_T, BM, BN, BK, CHUNK, STAGES)),
        (load_partition, (group_table, tile_ends, G, a_bufs, b_bufs, ready, empty, DTYPE, B_T,
                          BM, BN, BK, CHUNK, STAGES)),
    ], [LOADER_WARPS], [LOADER_REGISTERS])
