"""ragged_k as a warp-specialised persistent kernel for sm90, written in Gluon.

Same parameters, tile order and offset rules as ragged.py's ragged_k_kernel
(its module docstring says how offsets are read): program p takes tiles p,
p + P, ... of G groups' equal tile lists, m-tile fastest; a tile's K range is
its group's rows [start, end) of a and b, read through ragged.py's clipping
descriptors (rows past end load as zeros), and a group with no rows stores
a zero tile.

The partitions are those of kernels/ws.py and ragged_ws.py: a loader warp
fills a STAGES-deep ring of (A, B) K blocks, the default partition runs
asynchronous wgmmas on it (one in flight) and stores each tile through TMA in
column parts (epilogue_ws.store_tile).  A stored [T, M] (A_T, dB's x^T) lands as
[BK, BM] blocks that wgmma reads transposed; a row-major A [M, T] as [BM, BK]
blocks from a multiple of BK columns at or before the group's first row
(k_block_step, ws.tiled_rows), which the MMA partition clears outside the group.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,
                                                               mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from .epilogue_ws import store_tile
from .gluon_api import cp_async_load, thread_barrier, tma_load
from .loader_ws import claim_slot
from .ragged import RAGGED_ROWS
from .tiles import k_group_tiles, k_tile_origin
from .ws import (EPILOGUE_COLS, GATHER_REGISTERS, GATHER_WARPS, LOADER_REGISTERS, LOADER_WARPS,
                 accumulator_layout, allocate_ring, fence_before_k_loop, ragged_descriptor,
                 shared_layout, tiled_rows)


@gluon.jit
def group_row_range(offs_ptr, g, T, CHUNK: gl.constexpr):
    """(e_{g-1}, e_g) of ragged.py's docstring, for one group g, in the calling
    partition's warps."""
    layout: gl.constexpr = gl.BlockedLayout([CHUNK // 32], [32], [gl.num_warps()], [0])
    lane = gl.arange(0, CHUNK, layout)
    before = 0
    through = 0
    for chunk in range(0, g + 1, CHUNK):
        idx = chunk + lane
        vals = gl.minimum(gl.maximum(gl.load(offs_ptr + idx, mask=idx <= g, other=0), 0), T)
        before = gl.maximum(before, gl.max(gl.where(idx < g, vals, 0), 0))
        through = gl.maximum(through, gl.max(vals, 0))
    return before, through


@gluon.jit
def locate(tile, offs_ptr, M, N, T, last_g, last_start, last_end, BM: gl.constexpr,
           BN: gl.constexpr, CHUNK: gl.constexpr):
    """(group, tile origin, group's row range) of a tile, as ragged_k_kernel.
    The row range is read only when the group differs from the last tile's
    (last_g, whose range is last_start, last_end): reading it is a round trip
    to memory before the tile's first MMA, and a program's tiles stay in one
    group for many tiles where groups have many."""
    tiles_per_group = k_group_tiles(M, N, BM, BN)
    g = tile // tiles_per_group
    in_group = tile % tiles_per_group
    start = last_start
    end = last_end
    if g != last_g:
        start, end = group_row_range(offs_ptr, g, T, CHUNK)
    off_m, off_n = k_tile_origin(in_group, M, N, BM, BN)
    return g, off_m, off_n, start, end


@gluon.jit
def total_tiles(M, N, G, BM: gl.constexpr, BN: gl.constexpr):
    """The tiles of all G groups' outputs (k_group_tiles each)."""
    return G * k_group_tiles(M, N, BM, BN)


@gluon.constexpr_function
def k_block_step(A_T, BK):
    """tiled_rows' ALIGN: a row-major A's K blocks start at a multiple of BK
    columns (TMA could start them at any 16 bytes): from 16-byte steps the
    kernel ran slower (docs/notes/2026-11-22-full-bench-h100.md; likely because
    each 64-byte row of a box then straddles one more 32-byte sector).  The
    boundary blocks this adds are cleared."""
    return 1 if A_T else BK


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, T, G,
                   A_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                   CHUNK: gl.constexpr, STAGES: gl.constexpr):
    ALIGN: gl.constexpr = k_block_step(A_T, BK)
    nbytes: gl.constexpr = (BM + BN) * BK * a_desc.dtype.primitive_bitwidth // 8
    count = 0
    g = -1
    start = 0
    end = 0
    for tile in range(gl.program_id(0), total_tiles(M, N, G, BM, BN), gl.num_programs(0)):
        g, off_m, off_n, start, end = locate(tile, offs_ptr, M, N, T, g, start, end, BM, BN,
                                             CHUNK)
        first, span = tiled_rows(start, end, ALIGN)
        for k in range(0, span, BK):  # none for an empty group
            slot, bar = claim_slot(ready, empty, count, nbytes, STAGES)
            # Row first + k of b (ragged.py's coordinates: rows past end load as zeros).
            row = RAGGED_ROWS - (end - start) + (first - start) + k
            if A_T:
                a_buf = a_bufs.index(slot).reinterpret(a_desc.dtype, [1, 1, BK, BM],
                                                       a_desc.layout)
                tma_load(a_desc, [RAGGED_ROWS, end, row, off_m], bar, a_buf)
            else:
                tma_load(a_desc, [off_m, first + k], bar, a_bufs.index(slot))
            b_buf = b_bufs.index(slot).reinterpret(b_desc.dtype, [1, 1, BK, BN], b_desc.layout)
            tma_load(b_desc, [RAGGED_ROWS, end, row, off_n], bar, b_buf)
            count += 1


@gluon.jit
def clear_outside(a_buf, b_buf, k0, start, end):
    """Zero the K block's columns of A and rows of B outside [start, end) in
    shared memory, then make the partition's writes visible to its wgmmas:
    a row-major A is read from a BK step before the group's first row
    (k_block_step) and past its end, where other groups' values, finite or
    not, must add nothing."""
    BK: gl.constexpr = a_buf.shape[1]
    warps: gl.constexpr = gl.num_warps()
    a_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BK, BK // 8], [warps, 1], [1, 0])
    b_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [warps, 1], [1, 0])
    cols = k0 + gl.arange(0, BK, gl.SliceLayout(0, a_layout))
    a = a_buf.load(a_layout)
    a_buf.store(gl.where(gl.expand_dims((cols >= start) & (cols < end), 0), a, 0.0))
    rows = k0 + gl.arange(0, BK, gl.SliceLayout(1, b_layout))
    b = b_buf.load(b_layout)
    b_buf.store(gl.where(gl.expand_dims((rows >= start) & (rows < end), 1), b, 0.0))
    fence_async_shared()
    thread_barrier()


@gluon.jit
def mma_partition(c_desc, a_bufs, b_bufs, c_buf, ready, empty, offs_ptr, M, N, T, G,
                  A_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  CHUNK: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr = False):
    """GATHER: one operand's blocks were written by the loader's threads
    (gathered_load_partition), which wgmma's reads (the async proxy) see only
    after a proxy fence."""
    ALIGN: gl.constexpr = k_block_step(A_T, BK)
    acc_layout: gl.constexpr = accumulator_layout(BN, gl.num_warps())
    count = 0
    g = -1
    start = 0
    end = 0
    for tile in range(gl.program_id(0), total_tiles(M, N, G, BM, BN), gl.num_programs(0)):
        g, off_m, off_n, start, end = locate(tile, offs_ptr, M, N, T, g, start, end, BM, BN,
                                             CHUNK)
        first, span = tiled_rows(start, end, ALIGN)
        acc = gl.zeros([BM, BN], gl.float32, acc_layout)
        fence_before_k_loop()
        for k in range(0, span, BK):  # the loader's count of K blocks
            slot = count % STAGES
            mbarrier.wait(ready.index(slot), count // STAGES & 1)
            if GATHER:
                fence_async_shared()
            if A_T:
                a = a_bufs.index(slot).permute((1, 0))  # [BK, BM] as [BM, BK]
            else:
                k0 = first + k
                if (k0 < start) | (k0 + BK > end):
                    clear_outside(a_bufs.index(slot), b_bufs.index(slot), k0, start, end)
                a = a_bufs.index(slot)
            acc = warpgroup_mma(a, b_bufs.index(slot), acc, is_async=True)
            # One MMA in flight: the one before it is done with its slot.
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k > 0)
            count += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        # An empty group ran no MMA: nothing to free, its zero tile is stored.
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=span > 0)
        store_tile(acc, c_desc, c_buf, (g, off_m), off_n)
    tma.store_wait(0)


@gluon.jit
def ragged_k_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, M, N, T, G, lda, ldb, ldc,
                       A_T: gl.constexpr, USE_TMA: gl.constexpr, BM: gl.constexpr,
                       BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                       PRECISION: gl.constexpr, STAGES: gl.constexpr):
    """ragged_k_kernel's contract (a [M, T] stored as row-major [T, M] (A_T) or
    row-major, b [T, N] row-major, c [G, M, N] with rows ldc apart and groups
    M * ldc apart), TMA only; USE_TMA and PRECISION (16-bit inputs only) are
    taken for the common signature."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    out: gl.constexpr = c_ptr.dtype.element_ty
    a_tile: gl.constexpr = [BK, BM] if A_T else [BM, BK]
    if A_T:
        a_desc = ragged_descriptor(a_ptr, M, lda, BK, BM)
    else:  # K blocks along a's rows: no clipping, clear_outside zeroes what is not the group's
        a_desc = tma.make_tensor_descriptor(a_ptr, [M, T], [lda, 1], a_tile,
                                            shared_layout(a_tile, dtype))
    b_desc = ragged_descriptor(b_ptr, N, ldb, BK, BN)
    EPI_N: gl.constexpr = BN if BN < EPILOGUE_COLS else EPILOGUE_COLS
    c_desc = tma.make_tensor_descriptor(c_ptr, [G, M, N], [M * ldc, ldc, 1], [1, BM, EPI_N],
                                        shared_layout([1, BM, EPI_N], out))
    a_bufs, b_bufs, c_bufs, ready, empty = allocate_ring(dtype, out, a_tile, [BK, BN],
                                                         [BM, EPI_N], 1, STAGES)
    c_buf = c_bufs.index(0)
    gl.warp_specialize([
        (mma_partition, (c_desc, a_bufs, b_bufs, c_buf, ready, empty, offs_ptr, M, N, T, G,
                         A_T, BM, BN, BK, CHUNK, STAGES)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, T, G,
                          A_T, BM, BN, BK, CHUNK, STAGES)),
    ], [LOADER_WARPS], [LOADER_REGISTERS])


@gluon.constexpr_function
def spread_rows_layout(rows, cols, warps):
    """The loader's [rows, cols] copy of gathered rows with one row a thread
    (rows x threads-a-row = the warpgroup's threads): 16-byte pieces, a row's
    spread over the few threads that share its index."""
    lanes = 32 * warps // rows
    return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [warps, 1], [1, 0])


@gluon.jit
def order_entries(rows_ptr, positions, end):
    """rows[p] at these positions of the order (0 from end on, whose copies are
    masked), as loaded: nothing waits for the load until the block of K
    steps that uses it (gathered_load_partition)."""
    return gl.load(rows_ptr + positions, mask=positions < end, other=0)


@gluon.jit
def fill_gathered(desc, a_bufs, b_bufs, ready, empty, count, k, entries, at, start, end, cols,
                  col_ok, src_ptr, ld_src, rows_div, off_m, off_n, GATHER_A: gl.constexpr,
                  BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """Ring slot `count` <- K step k of the tile: the other operand's block by
    TMA, the gathered one's rows (entries: their order entries) by this
    warpgroup's cp.async copies; returns the next count."""
    OTHER: gl.constexpr = BN if GATHER_A else BM
    nbytes: gl.constexpr = OTHER * BK * desc.dtype.primitive_bitwidth // 8
    slot, bar = claim_slot(ready, empty, count, nbytes, STAGES)
    # Row start + k of the other operand (ragged.py's coordinates).
    row = RAGGED_ROWS - (end - start) + k
    origin = [RAGGED_ROWS, end, row, off_n if GATHER_A else off_m]
    if GATHER_A:
        other = b_bufs.index(slot).reinterpret(desc.dtype, [1, 1, BK, BN], desc.layout)
        buf = a_bufs.index(slot)
    else:
        other = a_bufs.index(slot).reinterpret(desc.dtype, [1, 1, BK, BM], desc.layout)
        buf = b_bufs.index(slot)
    tma_load(desc, origin, bar, other)
    # The TMA flavour's rules (csrc/run.cc): a 16-byte aligned base and row
    # stride, so each thread's 8 elements are one 16-byte copy.
    sources = (entries.to(gl.int32) // rows_div).to(gl.int64)
    starts = gl.multiple_of(src_ptr + sources * ld_src, 16)
    ok = gl.expand_dims(at + k < end, 1) & col_ok
    cp_async_load(buf, gl.expand_dims(starts, 1) + gl.expand_dims(cols, 0), ok)
    async_copy.mbarrier_arrive(bar, increment_count=False)
    return count + 1


@gluon.jit
def gathered_load_partition(desc, a_bufs, b_bufs, ready, empty, offs_ptr, src_ptr, ld_src,
                            rows_ptr, rows_div, M, N, T, G, GATHER_A: gl.constexpr,
                            BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                            CHUNK: gl.constexpr, STAGES: gl.constexpr):
    """load_partition's ring, filled for gathered_k_ws_kernel: the other
    operand's K block by TMA (desc, rows clipped to the group), the gathered
    one's by this warpgroup's cp.async copies of the rows the order names
    (zeros past the group's end or the columns), each thread arriving on the
    slot's `ready` when its copies land.  K steps go four at a time, whose
    order entries were loaded during the four before: a round trip to memory
    takes longer than a step's MMA (and a register still loading stalls the
    thread that copies it: the four are named, not rotated)."""
    COLS: gl.constexpr = BM if GATHER_A else BN
    layout: gl.constexpr = spread_rows_layout(BK, COLS, gl.num_warps())
    width = M if GATHER_A else N
    count = 0
    g = -1
    start = 0
    end = 0
    for tile in range(gl.program_id(0), total_tiles(M, N, G, BM, BN), gl.num_programs(0)):
        g, off_m, off_n, start, end = locate(tile, offs_ptr, M, N, T, g, start, end, BM, BN,
                                             CHUNK)
        col0 = off_m if GATHER_A else off_n
        cols = col0 + gl.arange(0, COLS, gl.SliceLayout(0, layout))
        cols = gl.max_contiguous(gl.multiple_of(cols, 8), 8)
        # M and N are multiples of 8 where this runs (the family's row_length
        # role): each 16-byte copy is whole in or out.
        col_ok = gl.expand_dims(gl.max_constancy(cols < width, 8), 0)
        at = start + gl.arange(0, BK, gl.SliceLayout(1, layout))
        span = end - start
        e0 = order_entries(rows_ptr, at, end)
        e1 = order_entries(rows_ptr, at + BK, end)
        e2 = order_entries(rows_ptr, at + 2 * BK, end)
        e3 = order_entries(rows_ptr, at + 3 * BK, end)
        for k in range(0, span, 4 * BK):  # none for an empty group
            n0 = order_entries(rows_ptr, at + (k + 4 * BK), end)
            n1 = order_entries(rows_ptr, at + (k + 5 * BK), end)
            n2 = order_entries(rows_ptr, at + (k + 6 * BK), end)
            n3 = order_entries(rows_ptr, at + (k + 7 * BK), end)
            count = fill_gathered(desc, a_bufs, b_bufs, ready, empty, count, k, e0, at, start,
                                  end, cols, col_ok, src_ptr, ld_src, rows_div, off_m, off_n,
                                  GATHER_A, BM, BN, BK, STAGES)
            if k + BK < span:
                count = fill_gathered(desc, a_bufs, b_bufs, ready, empty, count, k + BK, e1, at,
                                      start, end, cols, col_ok, src_ptr, ld_src, rows_div, off_m,
                                      off_n, GATHER_A, BM, BN, BK, STAGES)
            if k + 2 * BK < span:
                count = fill_gathered(desc, a_bufs, b_bufs, ready, empty, count, k + 2 * BK, e2,
                                      at, start, end, cols, col_ok, src_ptr, ld_src, rows_div,
                                      off_m, off_n, GATHER_A, BM, BN, BK, STAGES)
            if k + 3 * BK < span:
                count = fill_gathered(desc, a_bufs, b_bufs, ready, empty, count, k + 3 * BK, e3,
                                      at, start, end, cols, col_ok, src_ptr, ld_src, rows_div,
                                      off_m, off_n, GATHER_A, BM, BN, BK, STAGES)
            e0 = n0
            e1 = n1
            e2 = n2
            e3 = n3


@gluon.jit
def gathered_k_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, M, N, T, G, lda, ldb, ldc, rows_ptr,
                         rows_div, GATHER_A: gl.constexpr, USE_TMA: gl.constexpr,
                         BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                         CHUNK: gl.constexpr, PRECISION: gl.constexpr, STAGES: gl.constexpr):
    """ragged.gathered_k_kernel's contract, TMA only (USE_TMA and PRECISION
    taken for the common signature): ragged_k_ws_kernel with a stored [T, M]
    a (A_T), whose loader gathers one operand's rows (gathered_load_partition)."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    out: gl.constexpr = c_ptr.dtype.element_ty
    if GATHER_A:
        desc = ragged_descriptor(b_ptr, N, ldb, BK, BN)
        src_ptr = a_ptr
        ld_src = lda
    else:
        desc = ragged_descriptor(a_ptr, M, lda, BK, BM)
        src_ptr = b_ptr
        ld_src = ldb
    EPI_N: gl.constexpr = BN if BN < EPILOGUE_COLS else EPILOGUE_COLS
    c_desc = tma.make_tensor_descriptor(c_ptr, [G, M, N], [M * ldc, ldc, 1], [1, BM, EPI_N],
                                        shared_layout([1, BM, EPI_N], out))
    a_bufs, b_bufs, c_bufs, ready, empty = allocate_ring(dtype, out, [BK, BM], [BK, BN],
                                                         [BM, EPI_N], 1, STAGES,
                                                         COPIERS=32 * GATHER_WARPS)
    gl.warp_specialize([
        (mma_partition, (c_desc, a_bufs, b_bufs, c_bufs.index(0), ready, empty, offs_ptr, M, N,
                         T, G, True, BM, BN, BK, CHUNK, STAGES, True)),
        (gathered_load_partition, (desc, a_bufs, b_bufs, ready, empty, offs_ptr, src_ptr, ld_src,
                                   rows_ptr, rows_div, M, N, T, G, GATHER_A, BM, BN, BK, CHUNK,
                                   STAGES)),
    ], [GATHER_WARPS], [GATHER_REGISTERS])
