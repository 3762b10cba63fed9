"""scaled_ragged_m (fp8) as a warp-specialised persistent kernel for sm90, in Gluon.

scaled_ragged_m_kernel's contract (kernels/scaled.py says what the scales
mean, kernels/ragged.py how offsets are read) on ragged_ws.py's loader and
ring.  The MMA work is split between two partitions of one warpgroup each,
rows 0 .. BM/2 and BM/2 .. BM of every tile, which share each ring slot's B
and free it separately.  Blockwise scaling must wait for each K block's wgmma
before it scales and adds the block's product on the CUDA cores; with
separate partitions, one warpgroup's scaling runs while the other's MMAs do
(in one program of 8 warps they would wait for each other at every slot).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from .ragged import RAGGED_ROWS
from .ragged_ws import (LOADER_REGISTERS, LOADER_WARPS, accumulator_layout, chunk_groups,
                        column_parts, first_step_past, load_partition, locate, ring_setup)
from .scaled import ROWWISE, SCALE_BLOCK

# Registers of the second MMA partition's threads (the first, the default
# partition, gets what is left of the 64K; about as many).
MMA_REGISTERS = gl.constexpr(216)


@gluon.jit
def block_scales(scale_a_ptr, scale_b_ptr, g, rows, cols, row_ok, col_ok, k_blocks, n_blocks,
                 block, off_n, BN: gl.constexpr):
    """[rows, cols] factors of K block `block`: scale_a[row, block] x
    scale_b[g, col // 128, block], as one column when the tile lies in one
    128-column block (one FMA per element), else a full tile."""
    scale_a = gl.load(scale_a_ptr + rows.to(gl.int64) * k_blocks + block, mask=row_ok, other=0.0)
    weights = scale_b_ptr + g.to(gl.int64) * n_blocks * k_blocks + block
    if SCALE_BLOCK % BN == 0:
        scale = scale_a * gl.load(weights + (off_n // SCALE_BLOCK) * k_blocks)
        return gl.expand_dims(scale, 1)
    else:
        scale_b = gl.load(weights + (cols // SCALE_BLOCK) * k_blocks, mask=col_ok, other=0.0)
        return gl.expand_dims(scale_a, 1) * gl.expand_dims(scale_b, 0)


@gluon.jit
def scaled_mma_partition(half: gl.constexpr, c_desc, a_bufs, b_bufs, c_bufs, ready, empty,
                         offs_ptr, scale_a_ptr, scale_b_ptr, T, N, K, G, SCALING: gl.constexpr,
                         BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                         CHUNK: gl.constexpr, STAGES: gl.constexpr):
    """Rows half * BM/2 .. (half + 1) * BM/2 of every tile of this program."""
    gl.static_assert(SCALE_BLOCK % BK == 0, "a K step must not straddle two scale blocks")
    warps: gl.constexpr = gl.num_warps()
    HALF_M: gl.constexpr = BM // 2
    acc_layout: gl.constexpr = accumulator_layout(BN, warps, 8)
    c_buf = c_bufs.index(half)
    EPI_N: gl.constexpr = c_buf.shape[1]
    c_store = c_buf._reinterpret(c_desc.dtype, [1, 1, HALF_M, EPI_N], c_desc.layout)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_tiles = (N + BN - 1) // BN
    k_blocks = (K + SCALE_BLOCK - 1) // SCALE_BLOCK
    n_blocks = (N + SCALE_BLOCK - 1) // SCALE_BLOCK
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
            g = chunk + local
            k_end = gl.where(g < G, K, 0)
            part_m = off_m + half * HALF_M
            rows = part_m + gl.arange(0, HALF_M, gl.SliceLayout(1, acc_layout))
            cols = off_n + gl.arange(0, BN, gl.SliceLayout(0, acc_layout))
            row_ok = rows < end
            col_ok = (cols < N) & (g < G)
            acc = gl.zeros([HALF_M, BN], gl.float32, acc_layout)
            for k0 in range(0, k_end, BK):
                slot = count % STAGES
                mbarrier.wait(ready.index(slot), count // STAGES & 1)
                a = a_bufs.index(slot).slice(half * HALF_M, HALF_M)
                b = b_bufs.index(slot).permute((1, 0))
                if SCALING == ROWWISE:
                    acc = warpgroup_mma(a, b, acc, is_async=True)
                    acc = warpgroup_mma_wait(1, deps=(acc, ))
                    mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k0 > 0)
                else:
                    part = warpgroup_mma(a, b, gl.zeros([HALF_M, BN], gl.float32, acc_layout),
                                         use_acc=False, is_async=True)
                    # The scales load while the MMA runs.
                    scale = block_scales(scale_a_ptr, scale_b_ptr, g, rows, cols, row_ok, col_ok,
                                         k_blocks, n_blocks, k0 // SCALE_BLOCK, off_n, BN)
                    part = warpgroup_mma_wait(0, deps=(part, ))
                    mbarrier.arrive(empty.index(slot))
                    acc += part * scale
                count += 1
            if SCALING == ROWWISE:
                acc = warpgroup_mma_wait(0, deps=(acc, ))
                mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k_end > 0)
                scale_a = gl.load(scale_a_ptr + rows, mask=row_ok, other=0.0)
                scale_b = gl.load(scale_b_ptr + g.to(gl.int64) * N + cols, mask=col_ok, other=0.0)
                acc = acc * gl.expand_dims(scale_a, 1) * gl.expand_dims(scale_b, 0)
            row = RAGGED_ROWS - (end - start) + (part_m - start)
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
def scaled_ragged_m_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, T, N, K, G,
                              lda, b_group_stride, ldb, ldc, SCALING: gl.constexpr,
                              USE_TMA: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                              BK: gl.constexpr, CHUNK: gl.constexpr, PRECISION: gl.constexpr,
                              STAGES: gl.constexpr):
    """scaled_ragged_m_kernel's contract; num_warps (4) is each MMA partition's."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty = ring_setup(
        a_ptr, b_ptr, c_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc, True, BM, BN, BK, STAGES, 2)
    gl.warp_specialize([
        (scaled_mma_partition, (0, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, offs_ptr,
                                scale_a_ptr, scale_b_ptr, T, N, K, G, SCALING, BM, BN, BK, CHUNK,
                                STAGES)),
        (scaled_mma_partition, (1, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, offs_ptr,
                                scale_a_ptr, scale_b_ptr, T, N, K, G, SCALING, BM, BN, BK, CHUNK,
                                STAGES)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, T, N, K, G,
                          True, BM, BN, BK, CHUNK, STAGES)),
    ], [gl.num_warps(), LOADER_WARPS], [MMA_REGISTERS, LOADER_REGISTERS])
