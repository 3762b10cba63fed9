"""ragged_m, scaled_ragged_m (fp8) and ragged_glu as warp-specialised
persistent kernels for sm90, in Gluon: kernels/ragged.py's contracts
(ragged_m_kernel, scaled_ragged_m_kernel, ragged_glu_kernel; kernels/scaled.py
says what the scales mean, kernels/glu.py the gated epilogue and the gathered
rows) on the loader, ring and tile walk of kernels/ws.py and the K loops of
kernels/mma_ws.py.

The MMA work of a BM-row tile goes to PARTS partitions of num_warps warps,
BM / PARTS rows each: BM = 16 x num_warps x PARTS.  One partition of two
warpgroups (128 rows, 8 warps) shares every slot wait and release between
them; two partitions of one warpgroup each (64 rows, 4 warps) run apart and
free each slot separately, so one's CUDA-core work (blockwise fp8 rescales
its accumulator between K blocks, which waits for the block's wgmma; there
the two take turns) runs while the other's MMAs do.  A partition whose rows
all lie past its group's end (a group's last, short tile) skips its MMAs and
store, leaving the tensor cores to the other.

PINGPONG: two partitions of num_warps warps take turns at whole tiles
instead, each holding a BM x BN accumulator: the program's tiles alternate
between them, each slot of a tile freed by the one that reads it, so that
one's epilogue (the tile's scaling, activation and stores) runs while the
other's MMAs do, where the split tile's partitions both wait for theirs.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .epilogue_ws import store_columns, store_rows, store_tile
from .glu import CONCATENATED, NO_GLU
from .glu_ws import gu_descriptor, store_gated
from .loader_ws import load_partition
from .mma_ws import (MMA_REGISTERS, accumulate, accumulate_blockwise,
                     accumulate_blockwise_promoted, channel_scaled, pass_blocks)
from .ragged import RAGGED_ROWS
from .scaled import BLOCKWISE, BLOCKWISE_ROWWISE, NO_SCALES, ROWWISE, SCALE_BLOCK
from .ws import (GATHER_REGISTERS, GATHER_WARPS, LOADER_REGISTERS, LOADER_WARPS, accumulator_layout,
                 chunk_groups, fence_before_k_loop, first_step_past, locate, partition_rows,
                 ring_setup, row_alignment)


@gluon.jit
def wait_tile(turns, half: gl.constexpr, turn, PINGPONG: gl.constexpr):
    """PINGPONG, before partition `half` reads the ring for the program's tile
    number `turn` (its own): wait until the other has waited for every slot of
    the tile before (pass_tile).  Only then has each slot this tile reads
    completed the round before its own, so that a wait on its `ready` phase
    cannot pass on the parity of a round two behind."""
    if PINGPONG:
        mbarrier.wait(turns.index(1 - half), (turn - 1) // 2 & 1, pred=turn > 0)


@gluon.jit
def pass_tile(turns, half: gl.constexpr, PINGPONG: gl.constexpr):
    """PINGPONG: partition `half` has read its tile's slots; the other may go on."""
    if PINGPONG:
        mbarrier.arrive(turns.index(half))


@gluon.jit
def store_group_rows(acc, c_desc, c_buf, row, start, end, off_n):
    """Store a tile at (row, off_n), row >= start, by TMA: rows past the group's
    end are clipped (the ragged descriptor of kernels/ragged.py)."""
    at = RAGGED_ROWS - (end - start) + (row - start)
    store_tile(acc, c_desc, c_buf, (RAGGED_ROWS, end, at), off_n)


@gluon.jit
def store_ungated(acc, c_desc, c_buf, c_ptr, ldc, bias, g, G, part_m, start, end, off_n, N,
                  ALIGN: gl.constexpr, C_T: gl.constexpr):
    """A finished tile plus bias_ptr[g] for bias = (bias_ptr, has_bias) (where
    has_bias; none past the last group), its rows possibly begun before its
    group (ws.tiled_rows); C_T: c stored transposed (epilogue_ws.store_columns)."""
    bias_ptr, has_bias = bias
    if has_bias != 0:
        cols = off_n + gl.arange(0, acc.shape[1], gl.SliceLayout(0, acc.type.layout))
        group_bias = gl.load(bias_ptr + g.to(gl.int64) * N + cols, mask=(cols < N) & (g < G),
                             other=0.0)
        acc = acc + gl.expand_dims(group_bias.to(gl.float32), 0)
    # ALIGN is a constexpr: its branch compiles without the runtime test.
    if C_T:
        store_columns(acc, c_desc, c_buf, c_ptr, ldc, part_m, start, end, off_n, N)
    elif ALIGN == 1:  # noqa: SIM114
        store_group_rows(acc, c_desc, c_buf, part_m, start, end, off_n)
    elif part_m >= start:
        store_group_rows(acc, c_desc, c_buf, part_m, start, end, off_n)
    else:  # the group's first tile, begun before it
        store_rows(acc, c_ptr, ldc, part_m, start, end, off_n, N)


@gluon.jit
def mma_partition(half: gl.constexpr, PARTS: gl.constexpr, c_desc, c_ptr, ldc, a_bufs, b_bufs,
                  c_bufs, ready, empty, turns, offs_ptr, T, N, K, G, bias, scales, gather, gu_desc,
                  glu, out_scales, A_T: gl.constexpr, B_T: gl.constexpr, C_T: gl.constexpr,
                  SCALING: gl.constexpr, FAST_ACCUM: gl.constexpr, GLU: gl.constexpr,
                  BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                  STAGES: gl.constexpr, CTAS: gl.constexpr, PINGPONG: gl.constexpr,
                  BLOCK_COLUMNS: gl.constexpr):
    """Rows half * BM / PARTS .. (half + 1) * BM / PARTS of every tile of this
    program (in a cluster, PARTS = 1: each CTA's share of the tile's rows),
    or PINGPONG all rows of every other tile, from the program's tile `half`.
    The features as ragged_m_ws_program's, but glu = (save_gu, activation)
    beside gu_desc: kernels/glu.py's gated epilogue stores h through c_desc
    and gu through gu_desc (None: no gu; a partition's arguments hold no None
    in a tuple); turns: the partitions' barriers for taking turns, at K blocks
    (accumulate_blockwise's) or, PINGPONG, at tiles (wait_tile's); None where
    they do not."""
    warps: gl.constexpr = gl.num_warps()
    PART_M: gl.constexpr = partition_rows(BM, PARTS, PINGPONG)
    PART: gl.constexpr = 0 if PINGPONG else half  # which PART_M rows of a ring slot's A block
    block_turns = None if PINGPONG else turns
    acc_layout: gl.constexpr = accumulator_layout(BN, warps, a_bufs.dtype.primitive_bitwidth, CTAS)
    ALIGN: gl.constexpr = row_alignment(A_T, C_T, a_bufs.dtype)
    # a's scales per row and 128-column K block; b's per column (scaled.py).
    # (Comparisons: the compiler implements no `in`.)
    BLOCK_ROWS: gl.constexpr = SCALING == BLOCKWISE or SCALING == BLOCKWISE_ROWWISE  # noqa: PLR1714
    CHANNELS: gl.constexpr = SCALING == ROWWISE or SCALING == BLOCKWISE_ROWWISE  # noqa: PLR1714
    c_buf = c_bufs.index(half)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_tiles = (N + BN - 1) // BN
    count = 0
    tiles_before = 0
    rows_before = 0
    turn = 0  # PINGPONG: the program's tiles so far (this partition's are those of its half)
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = chunk_groups(
            offs_ptr, chunk, T, G, rows_before, tiles_before, n_tiles, BM, ALIGN, CHUNK, warps,
            CTAS)
        chunk_end = tiles_before + gl.sum(group_tiles, 0)
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            g, start, end, off_m, off_n, k_end = locate(t, chunk, starts, ends, group_tiles,
                                                        tiles_end, n_tiles, G, K, BM, BN, ALIGN)
            part_m = off_m if PINGPONG else off_m + half * PART_M
            if PINGPONG and turn % 2 != half:  # the other's tile: its slots are not ours
                count += (k_end + BK - 1) // BK
            elif part_m < end:
                wait_tile(turns, half, turn, PINGPONG)
                fence_before_k_loop()
                if BLOCK_ROWS and not FAST_ACCUM:
                    acc, count = accumulate_blockwise_promoted(
                        a_bufs, b_bufs, ready, empty, count, k_end, scales, g, part_m, end, K, N,
                        off_n, PART, PART_M, BN, BK, STAGES, acc_layout, SCALING)
                elif BLOCK_ROWS:
                    acc, count = accumulate_blockwise(
                        a_bufs, b_bufs, ready, empty, block_turns, count, k_end, scales, g,
                        part_m, end, K, N, off_n, PART, PART_M, BN, BK, STAGES, acc_layout,
                        SCALING, GLU, gather, BLOCK_COLUMNS)
                else:
                    acc, count = accumulate(a_bufs, b_bufs, ready, empty, count, k_end, PART,
                                            PART_M, A_T, B_T, BN, BK, STAGES, acc_layout,
                                            FAST_ACCUM, gather)
                pass_tile(turns, half, PINGPONG)
                if CHANNELS:
                    acc = channel_scaled(acc, scales, gather, g, G, N, off_n, part_m, end, SCALING,
                                         GLU, acc_layout)
                if GLU < CONCATENATED:
                    store_ungated(acc, c_desc, c_buf, c_ptr, ldc, bias, g, G, part_m, start, end,
                                  off_n, N, ALIGN, C_T)
                else:  # a row-major a: tiles start at their group's rows
                    store_gated(acc, c_desc, c_buf, bias, (gu_desc, glu[0], glu[1]), g, G, N,
                                off_n, part_m, start, end, GLU, out_scales)
            else:
                wait_tile(turns, half, turn, PINGPONG)
                count = pass_blocks(ready, empty, block_turns, count, k_end, half, BK, STAGES)
                pass_tile(turns, half, PINGPONG)
            turn += 1
        tiles_before = chunk_end
        rows_before = gl.max(ends, 0)
    tma.store_wait(0)


@gluon.jit
def ragged_m_ws_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                        bias, A_T: gl.constexpr, B_T: gl.constexpr, C_T: gl.constexpr,
                        BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                        CHUNK: gl.constexpr, STAGES: gl.constexpr, CTAS: gl.constexpr,
                        SCALING: gl.constexpr = NO_SCALES, FAST_ACCUM: gl.constexpr = True,
                        scales=None, gather=None, GLU: gl.constexpr = NO_GLU, glu=None,
                        out_scales=None, PINGPONG: gl.constexpr = False,
                        BLOCK_COLUMNS: gl.constexpr = SCALE_BLOCK):
    """One program of the kernels below; its optional features are
    ragged.ragged_m_program's (bias, SCALING with FAST_ACCUM and scales,
    gather, GLU with glu, out_scales), each one argument, decided alike;
    PINGPONG: the MMA partitions take turns at whole tiles (the module's doc);
    BLOCK_COLUMNS: accumulate_blockwise's."""
    # The same rule as ws.mma_partitions, which budgets the registers.
    PARTS: gl.constexpr = 2 if PINGPONG else BM // CTAS // (16 * gl.num_warps())
    gl.static_assert(not PINGPONG or CTAS == 1, "pingpong partitions take a CTA's tiles")
    # A cluster's CTAs split the tile's rows; a partition's rows within a CTA,
    # blockwise scales and rows that do not start a TMA box are not split.
    gl.static_assert(CTAS == 1 or (PARTS == 1 and SCALING < BLOCKWISE and not A_T and not C_T),
                     "a cluster kernel takes one MMA partition, no blockwise scales, a row-major a "
                     "and c")
    gl.static_assert(PARTS == 1 or PARTS == 2, "one or two MMA partitions")
    # Gathered rows (ragged_glu's, gated or UNGATED) are copied by the loader,
    # a warpgroup, where rows_div is not 0.
    GATHER: gl.constexpr = gather is not None
    GATED: gl.constexpr = GLU >= CONCATENATED
    HALVES: gl.constexpr = GLU == CONCATENATED
    if GATED:  # the MMA partitions' glu: gu stored through a descriptor, if at all
        gu_ptr, save_gu, activation = glu
        SAVES_GU: gl.constexpr = gu_ptr is not None
    else:
        SAVES_GU: gl.constexpr = False
    # The c buffers stage gu's parts too where it is stored (wider than h where h is fp8).
    STAGED: gl.constexpr = gu_ptr.dtype.element_ty if SAVES_GU else c_ptr.dtype.element_ty
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty = ring_setup(
        a_ptr, b_ptr, c_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc, A_T, B_T, BM, BN, BK,
        STAGES, PARTS, CTAS, HALVES, GATED, 32 * GATHER_WARPS if GATHER else 0, C_T, PINGPONG,
        STAGED)
    LOADER: gl.constexpr = GATHER_WARPS if GATHER else LOADER_WARPS
    LOADER_REGS: gl.constexpr = GATHER_REGISTERS if GATHER else LOADER_REGISTERS
    if GATHER:
        gl.static_assert(not A_T and CTAS == 1, "gathered rows are row-major, in one CTA")
    if SAVES_GU:
        gu_desc = gu_descriptor(gu_ptr, N, partition_rows(BM, PARTS, PINGPONG),
                                c_desc.block_shape[3], GLU)
    # Its partitions take turns at tiles (PINGPONG: wait_tile) or at K blocks
    # (blockwise's split tiles: accumulate_blockwise).
    TURNS: gl.constexpr = PINGPONG or (SCALING >= BLOCKWISE and FAST_ACCUM)
    if TURNS:
        gl.static_assert(PARTS == 2, "turns are taken by two MMA partitions")
        turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turns.index(i), count=1)
    # Partitions 0 .. PARTS - 1 take a part of each tile's rows each (the
    # first is the default partition, with the program's warps); the last
    # one is the loader.
    gl.warp_specialize(
        [(mma_partition, (p, PARTS, c_desc, c_ptr, ldc, a_bufs, b_bufs, c_bufs, ready, empty,
                          turns if TURNS else None, offs_ptr, T, N, K, G, bias, scales, gather,
                          gu_desc if SAVES_GU else None, (save_gu, activation) if GATED else None,
                          out_scales, A_T, B_T, C_T,
                          SCALING, FAST_ACCUM, GLU, BM, BN, BK, CHUNK, STAGES, CTAS, PINGPONG,
                          BLOCK_COLUMNS))
         if p < PARTS else
         (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, T, N, K, G,
                           A_T, B_T, BM, BN, BK, CHUNK, STAGES, CTAS, HALVES, gather, C_T))
         for p in ((0, 1) if PARTS == 1 else (0, 1, 2))],
        [LOADER] if PARTS == 1 else [gl.num_warps(), LOADER],
        [LOADER_REGS] if PARTS == 1 else [MMA_REGISTERS, LOADER_REGS])


@gluon.jit
def ragged_m_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                       bias_ptr, has_bias, A_T: gl.constexpr, B_T: gl.constexpr,
                       C_T: gl.constexpr, USE_TMA: gl.constexpr, BM: gl.constexpr,
                       BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                       PRECISION: gl.constexpr, STAGES: gl.constexpr, CTAS: gl.constexpr,
                       PINGPONG: gl.constexpr):
    """ragged_m_kernel's contract (a [T, K] or, A_T, stored [K, T]; b [G, K, N]
    or, B_T, [G, N, K]; c [T, N] row-major or, C_T, stored [N, T]: ws.store_columns),
    TMA only; USE_TMA and PRECISION (16-bit inputs only) are taken for the
    common signature.  CTAS: the
    cluster's CTAs (ws.py), which the program's BM rows are split between;
    PINGPONG: ragged_m_ws_program's."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    ragged_m_ws_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                        (bias_ptr, has_bias), A_T, B_T, C_T, BM, BN, BK, CHUNK, STAGES, CTAS,
                        PINGPONG=PINGPONG)


@gluon.jit
def ragged_glu_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                         bias_ptr, has_bias, gu_ptr, save_gu, activation, rows_ptr, rows_div,
                         B_T: gl.constexpr,
                         GLU: gl.constexpr, USE_TMA: gl.constexpr, BM: gl.constexpr,
                         BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                         PRECISION: gl.constexpr, STAGES: gl.constexpr,
                         PINGPONG: gl.constexpr):
    """ragged.ragged_glu_kernel's contract, TMA only (USE_TMA and PRECISION
    taken for the common signature); PINGPONG: ragged_m_ws_program's."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    ragged_m_ws_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                        (bias_ptr, has_bias), False, B_T, False, BM, BN, BK, CHUNK, STAGES, 1,
                        gather=(a_ptr, lda, rows_ptr, rows_div), GLU=GLU,
                        glu=(gu_ptr, save_gu, activation), PINGPONG=PINGPONG)


@gluon.jit
def scaled_ragged_m_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, T, N, K, G,
                              lda, b_group_stride, ldb, ldc, bias_ptr, has_bias,
                              SCALING: gl.constexpr, FAST_ACCUM: gl.constexpr,
                              USE_TMA: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                              BK: gl.constexpr, CHUNK: gl.constexpr, PRECISION: gl.constexpr,
                              STAGES: gl.constexpr, CTAS: gl.constexpr, PINGPONG: gl.constexpr):
    """scaled_ragged_m_kernel's contract (b K-major); CTAS and PINGPONG as
    ragged_m_ws_kernel's."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    ragged_m_ws_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                        (bias_ptr, has_bias), False, True, False, BM, BN, BK, CHUNK, STAGES, CTAS,
                        SCALING=SCALING, FAST_ACCUM=FAST_ACCUM, scales=(scale_a_ptr, scale_b_ptr),
                        PINGPONG=PINGPONG)


@gluon.jit
def scaled_ragged_glu_ws_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr,
                                c_scale_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc, bias_ptr,
                                has_bias, activation, gu_ptr, rows_ptr, rows_div,
                                SCALING: gl.constexpr, GLU: gl.constexpr, SAVE_GU: gl.constexpr,
                                USE_TMA: gl.constexpr, BM: gl.constexpr,
                                BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                                PRECISION: gl.constexpr, STAGES: gl.constexpr,
                                PINGPONG: gl.constexpr, BLOCK_COLUMNS: gl.constexpr = SCALE_BLOCK):
    """ragged.scaled_ragged_glu_kernel's contract, TMA only (USE_TMA and
    PRECISION taken for the common signature); PINGPONG and BLOCK_COLUMNS:
    ragged_m_ws_program's."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    ragged_m_ws_program(a_ptr, b_ptr, c_ptr, offs_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc,
                        (bias_ptr, has_bias), False, True, False, BM, BN, BK, CHUNK, STAGES, 1,
                        SCALING=SCALING, scales=(scale_a_ptr, scale_b_ptr),
                        gather=(a_ptr, lda, rows_ptr, rows_div), GLU=GLU,
                        glu=(gu_ptr if SAVE_GU else None, 1, activation), out_scales=c_scale_ptr,
                        PINGPONG=PINGPONG, BLOCK_COLUMNS=BLOCK_COLUMNS)
