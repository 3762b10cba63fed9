"""ragged_m as a warp-specialised persistent kernel for sm90, written in Gluon.

Same parameters, tile order and ragged-row rules as ragged.py's ragged_m_kernel
(its module docstring says how offsets are read): program p takes tiles p,
p + P, ... of the list of every group's tiles, m-tile fastest, then the tiles
of the rows past the last group, which are written with zeros.

Two partitions share a ring of STAGES shared-memory slots, each holding one
K block of A and of B:

- the loader (one warp) walks the program's tiles and, K block by K block,
  waits until a slot is free (`empty`), then has TMA fill it (`ready`
  completes when its bytes have landed);
- the default partition (num_warps warps; 8 split a 128-row tile between two
  warpgroups) waits for each slot, issues an asynchronous wgmma on it, keeps
  one in flight and frees the slot of the one before.  After a tile's last
  MMA it converts the accumulator, stages it in shared memory and starts a
  TMA store, which runs on while the next tile's MMAs start; the loader has
  by then filled the ring with the next tile's first K blocks.

Triton 3.6's own pipeliner cannot do this on sm90: there one program's warps
both wait for loads and run MMAs, and each tile drains the pipeline.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from .ragged import RAGGED_MAX, RAGGED_ROWS

LOADER_WARPS = gl.constexpr(1)
LOADER_REGISTERS = gl.constexpr(40)
# The epilogue stages the tile in shared memory this many columns at a time
# (BN = 256: two halves), which leaves room for a fourth stage of the ring.
EPILOGUE_COLS = gl.constexpr(128)


def mma_partitions(config) -> int:
    """The kernels' MMA partitions: one of num_warps warps covering BM rows
    (ragged_m_ws_kernel), or two of BM / 2 rows each (scaled_ragged_m_ws_kernel)."""
    return config.BM // (16 * config.num_warps)


def max_registers(config) -> int:
    """Registers per thread the kernel is compiled for (ptxas's maxnreg): all
    warps of one program within an SM's 64K; at run time the MMA partitions
    take what the loader's warpgroup gives back."""
    warps = config.num_warps * mma_partitions(config) + 4  # the loader holds a warpgroup's
    return 65536 // (32 * warps) // 8 * 8


@gluon.constexpr_function
def accumulator_layout(BN, num_warps, input_bits=16):
    """wgmma's register layout: warps stacked along M, 16 rows each (a
    warpgroup covers 64 rows), one instruction as wide as the tile and 32
    bytes deep."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                     instr_shape=[16, BN, 256 // input_bits])


@gluon.constexpr_function
def shared_layout(block_shape, dtype):
    return gl.NVMMASharedLayout.get_default_for(block_shape, dtype)


@gluon.jit
def _max(a, b):
    return gl.maximum(a, b)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def chunk_groups(offs_ptr, chunk, T, G, rows_before, tiles_before, n_tiles, BM: gl.constexpr,
                 CHUNK: gl.constexpr, WARPS: gl.constexpr):
    """Groups chunk .. chunk + CHUNK as vectors: (starts, ends, tile counts,
    cumulative tile ends).  Index G is the pseudo-group of the rows past the
    last group; past it, empty groups.  WARPS: the calling partition's."""
    layout: gl.constexpr = gl.BlockedLayout([CHUNK // 32], [32], [WARPS], [0])
    idx = chunk + gl.arange(0, CHUNK, layout)
    ends = gl.load(offs_ptr + idx, mask=idx < G, other=0)
    ends = gl.where(idx >= G, T, ends)
    starts = gl.load(offs_ptr + idx - 1, mask=(idx >= 1) & (idx <= G), other=0)
    starts = gl.where(idx > G, T, starts)
    ends = gl.associative_scan(gl.minimum(gl.maximum(ends, 0), T), 0, _max)
    starts = gl.associative_scan(gl.minimum(gl.maximum(starts, 0), T), 0, _max)
    ends = gl.maximum(ends, rows_before)
    starts = gl.maximum(starts, rows_before)
    group_tiles = (ends - starts + BM - 1) // BM * n_tiles
    tiles_end = tiles_before + gl.associative_scan(group_tiles, 0, _add)
    return starts, ends, group_tiles, tiles_end


@gluon.jit
def _pick(values, index):
    """values[index] for a runtime index into a register vector."""
    lanes = gl.arange(0, values.shape[0], values.type.layout)
    return gl.sum(gl.where(lanes == index, values, 0), 0)


@gluon.jit
def locate(t, starts, ends, group_tiles, tiles_end, n_tiles, BM: gl.constexpr, BN: gl.constexpr):
    """(chunk-local group, its row range, tile origin) of tile t of the chunk."""
    local = gl.sum((tiles_end <= t).to(gl.int32), 0)
    start = _pick(starts, local)
    end = _pick(ends, local)
    in_group = t - (_pick(tiles_end, local) - _pick(group_tiles, local))
    m_tiles = (end - start + BM - 1) // BM
    off_m = start + (in_group % m_tiles) * BM
    off_n = (in_group // m_tiles) * BN
    return local, start, end, off_m, off_n


@gluon.jit
def column_parts(tile, PARTS: gl.constexpr):
    """tile split into PARTS (1 or 2) column blocks, as a tuple.  The halves
    differ in the top bit of the column, which wgmma's layout keeps within a
    thread: no data moves."""
    if PARTS == 1:
        return (tile, )
    else:
        gl.static_assert(PARTS == 2, "the epilogue splits a tile in at most two")
        return tile.reshape([tile.shape[0], 2, tile.shape[1] // 2]).permute((0, 2, 1)).split()


@gluon.jit
def first_step_past(start, end, step):
    """The first of start, start + step, ... that is >= end."""
    return start + (gl.maximum(end - start, 0) + step - 1) // step * step


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, T, N, K, G,
                   B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                   CHUNK: gl.constexpr, STAGES: gl.constexpr):
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_tiles = (N + BN - 1) // BN
    b_block: gl.constexpr = [1, BN, BK] if B_T else [1, BK, BN]
    nbytes: gl.constexpr = (BM * BK + BN * BK) * a_desc.dtype.primitive_bitwidth // 8
    count = 0
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = chunk_groups(
            offs_ptr, chunk, T, G, rows_before, tiles_before, n_tiles, BM, CHUNK,
            gl.num_warps())
        chunk_end = tiles_before + gl.sum(group_tiles, 0)
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            local, start, end, off_m, off_n = locate(t, starts, ends, group_tiles, tiles_end,
                                                     n_tiles, BM, BN)
            g = chunk + local
            k_end = gl.where(g < G, K, 0)
            for k0 in range(0, k_end, BK):
                slot = count % STAGES
                mbarrier.wait(empty.index(slot), (count // STAGES & 1) ^ 1)
                bar = ready.index(slot)
                mbarrier.expect(bar, nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, k0], bar, a_bufs.index(slot))
                b_buf = b_bufs.index(slot)._reinterpret(b_desc.dtype, b_block, b_desc.layout)
                if B_T:
                    tma.async_copy_global_to_shared(b_desc, [g, off_n, k0], bar, b_buf)
                else:
                    tma.async_copy_global_to_shared(b_desc, [g, k0, off_n], bar, b_buf)
                count += 1
        tiles_before = chunk_end
        rows_before = gl.max(ends, 0)


@gluon.jit
def mma_partition(c_desc, a_bufs, b_bufs, c_buf, ready, empty, offs_ptr, T, N, K, G,
                  B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  CHUNK: gl.constexpr, STAGES: gl.constexpr):
    warps: gl.constexpr = gl.num_warps()
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_tiles = (N + BN - 1) // BN
    acc_layout: gl.constexpr = accumulator_layout(BN, warps)
    EPI_N: gl.constexpr = c_buf.shape[1]
    c_store = c_buf._reinterpret(c_desc.dtype, [1, 1, BM, EPI_N], c_desc.layout)
    count = 0
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = chunk_groups(
            offs_ptr, chunk, T, G, rows_before, tiles_before, n_tiles, BM, CHUNK, warps)
        chunk_end = tiles_before + gl.sum(group_tiles, 0)
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            local, start, end, off_m, off_n = locate(t, starts, ends, group_tiles, tiles_end,
                                                     n_tiles, BM, BN)
            k_end = gl.where(chunk + local < G, K, 0)
            acc = gl.zeros([BM, BN], gl.float32, acc_layout)
            for k0 in range(0, k_end, BK):
                slot = count % STAGES
                mbarrier.wait(ready.index(slot), count // STAGES & 1)
                if B_T:
                    b = b_bufs.index(slot).permute((1, 0))
                else:
                    b = b_bufs.index(slot)
                acc = warpgroup_mma(a_bufs.index(slot), b, acc, is_async=True)
                # One MMA in flight: the one before it is done with its slot.
                acc = warpgroup_mma_wait(1, deps=(acc, ))
                mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k0 > 0)
                count += 1
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k_end > 0)
            row = RAGGED_ROWS - (end - start) + (off_m - start)
            parts = column_parts(acc.to(c_desc.dtype), BN // EPI_N)
            for i in gl.static_range(BN // EPI_N):
                tma.store_wait(0)  # the previous store has read c_buf
                c_buf.store(parts[i])
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [RAGGED_ROWS, end, row, off_n + i * EPI_N],
                                                c_store)
        tiles_before = chunk_end
        rows_before = gl.max(ends, 0)
    tma.store_wait(0)


@gluon.jit
def ring_setup(a_ptr, b_ptr, c_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc, B_T: gl.constexpr,
               BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
               PARTS: gl.constexpr):
    """Descriptors, buffers and barriers of a ragged_m-shaped kernel whose
    output tile is stored by PARTS MMA partitions of BM // PARTS rows each
    (each has its c buffer, and each frees a ring slot: `empty` waits for all)."""
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    out: gl.constexpr = c_ptr.dtype.element_ty
    k_dim = gl.maximum(K, 1)  # K = 0: a valid descriptor that is never loaded
    a_desc = tma.make_tensor_descriptor(a_ptr, [T, k_dim], [lda, 1], [BM, BK],
                                        shared_layout([BM, BK], dtype))
    b_tile: gl.constexpr = [BN, BK] if B_T else [BK, BN]
    if B_T:
        b_desc = tma.make_tensor_descriptor(b_ptr, [G, N, k_dim], [b_group_stride, ldb, 1],
                                            [1, BN, BK], shared_layout([1, BN, BK], dtype))
    else:
        b_desc = tma.make_tensor_descriptor(b_ptr, [G, k_dim, N], [b_group_stride, ldb, 1],
                                            [1, BK, BN], shared_layout([1, BK, BN], dtype))
    # ragged.py's clipping descriptor: rows past a group's end are not stored.
    EPI_N: gl.constexpr = BN if BN < EPILOGUE_COLS else EPILOGUE_COLS
    PART_M: gl.constexpr = BM // PARTS
    c_desc = tma.make_tensor_descriptor(c_ptr, [RAGGED_MAX, RAGGED_MAX, RAGGED_ROWS, N],
                                        [2 ** 34 - ldc, ldc, ldc, 1], [1, 1, PART_M, EPI_N],
                                        shared_layout([1, 1, PART_M, EPI_N], out))
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], shared_layout([BM, BK], dtype))
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_tile, shared_layout(b_tile, dtype))
    c_bufs = gl.allocate_shared_memory(out, [PARTS, PART_M, EPI_N],
                                       shared_layout([PART_M, EPI_N], out))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=PARTS)
    return a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty


@gluon.jit
def ragged_m_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                       B_T: gl.constexpr, USE_TMA: gl.constexpr, BM: gl.constexpr,
                       BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                       PRECISION: gl.constexpr, STAGES: gl.constexpr):
    """ragged_m_kernel's contract (a [T, K] row-major, b [G, K, N] or, B_T,
    [G, N, K], c [T, N] row-major), TMA only; USE_TMA and PRECISION (16-bit
    inputs only) are taken for the common signature."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty = ring_setup(
        a_ptr, b_ptr, c_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc, B_T, BM, BN, BK, STAGES, 1)
    gl.warp_specialize([
        (mma_partition, (c_desc, a_bufs, b_bufs, c_bufs.index(0), ready, empty, offs_ptr, T, N,
                         K, G, B_T, BM, BN, BK, CHUNK, STAGES)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, T, N, K, G,
                          B_T, BM, BN, BK, CHUNK, STAGES)),
    ], [LOADER_WARPS], [LOADER_REGISTERS])
