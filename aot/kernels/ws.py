"""What the warp-specialised persistent kernels for sm90 (Gluon) share:
the ragged_m tile walk (kernels/ragged.py's order and offset rules: program p
takes tiles p, p + P, ... of the list of every group's tiles, m-tile fastest,
then the tiles of the rows past the last group, written with zeros), the
loader partition, the ring of shared-memory stages and its barriers, register
budgets and layouts.

A loader partition (one warp) walks its program's tiles and, K block by K
block, waits until a ring slot is free (`empty`), then has TMA fill it
(`ready` completes when the bytes have landed); a loader that gathers A's
rows through an index (ragged_glu) is a warpgroup whose threads copy them.
MMA partitions wait for each slot, run asynchronous wgmma on it with one in
flight, free the slot of the one before, and store each finished tile
through TMA while the loader fills the ring with the next tile's first K
blocks.  Triton 3.6's own compiler does not warp-specialise on sm90: there
one program's warps both wait for loads and run MMAs, and each tile drains
the pipeline.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,
                                                               mbarrier, tma)

from .gluon_api import cluster_barriers, cp_async_load, tma_load, tma_load_multicast, tma_store
from .ragged import RAGGED_MAX, RAGGED_ROWS

LOADER_WARPS = gl.constexpr(1)
LOADER_REGISTERS = gl.constexpr(40)
# A loader that gathers A's rows copies them with its threads (gather_rows):
# a warpgroup, with registers for the rows' addresses.
GATHER_WARPS = gl.constexpr(4)
GATHER_REGISTERS = gl.constexpr(64)
# The epilogue stages the tile in shared memory this many columns at a time
# (BN = 256: two halves), which leaves room for a fourth stage of the ring.
EPILOGUE_COLS = gl.constexpr(128)


def mma_partitions(config) -> int:
    """The MMA partitions of a config's kernel: one of num_warps warps covering
    a CTA's BM / ctas rows, or two of half as many each, or (pingpong) two
    taking turns at whole tiles (kernels/ragged_ws.py); at least one (the
    decode kernel's MMA rows are weight rows, not BM's:
    kernels/experts_decode_ws.py)."""
    if config.pingpong:
        return 2
    return max(config.BM // config.ctas // (16 * config.num_warps), 1)


@gluon.constexpr_function
def partition_rows(BM, PARTS, PINGPONG):
    """The rows of an MMA partition's accumulator: a split tile's share, or
    (PINGPONG) a whole tile of its own."""
    return BM if PINGPONG else BM // PARTS


def max_registers(config) -> int:
    """Registers per thread the kernel is compiled for (ptxas's maxnreg): all
    warps of one program within an SM's 64K; at run time the MMA partitions
    take what the loader's warpgroup gives back."""
    warps = config.num_warps * mma_partitions(config) + 4  # the loader holds a warpgroup's
    return 65536 // (32 * warps) // 8 * 8


# A program of a kernel compiled for a cluster of CTAS CTAs (CTAS = 2, Triton
# >= 3.8) is the whole cluster: its tiles and layouts are the cluster's, each
# CTA holding a part.  An output tile's rows, and A's, are split between the
# CTAs; B's block is the same for both and lands in both by one multicast TMA
# copy, which halves the L2 traffic per output element.  Each layout below
# takes CTAS and, for CTAS > 1, says how the CTAs divide it (cga_layout, a
# Triton 3.8 field, whose bases here say for each dimension whether it is
# split (1) or not (0); the layouts of CTAS = 1 are built without it).


@gluon.constexpr_function
def accumulator_layout(BN, num_warps, input_bits=16, CTAS=1):
    """wgmma's register layout: warps stacked along M, 16 rows each (a
    warpgroup covers 64 rows), one instruction as wide as the tile and 32
    bytes deep; in a cluster, rows split between the CTAs."""
    if CTAS == 1:
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                         instr_shape=[16, BN, 256 // input_bits])
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                     instr_shape=[16, BN, 256 // input_bits],
                                     cga_layout=[[1, 0]])


@gluon.constexpr_function
def shared_layout(block_shape, dtype, CTAS=1, split_dim=None):
    """TMA's and wgmma's swizzled layout of a block; in a cluster, dimension
    split_dim split between the CTAs, or (None) a copy in each."""
    if CTAS == 1:
        return gl.NVMMASharedLayout.get_default_for(block_shape, dtype)
    split = [[int(d == split_dim) for d in range(len(block_shape))]]
    return gl.NVMMASharedLayout.get_default_for(block_shape, dtype, cga_layout=split)


@gluon.constexpr_function
def vector_layout(size, warps, CTAS=1):
    """A 1-D layout of `size` elements over `warps` warps, whole in every CTA."""
    if CTAS == 1:
        return gl.BlockedLayout([size // 32], [32], [warps], [0])
    return gl.BlockedLayout([size // 32], [32], [warps], [0], cga_layout=[[0]])


@gluon.jit
def _max(a, b):
    """The combine function of a running maximum (gl.associative_scan's)."""
    return gl.maximum(a, b)


@gluon.jit
def plus(a, b):
    """The combine function of a running sum (gl.associative_scan's)."""
    return a + b


@gluon.constexpr_function
def row_alignment(a_transposed, c_transposed, dtype):
    """tiled_rows' ALIGN: the elements of dtype (the inputs') in 16 bytes where
    groups' rows lie along A's or C's contiguous dimension (ragged_m's A
    stored [K, T], its C stored [N, T]; TMA starts a box along a contiguous
    dimension only at a 16-byte step, and a group's rows start anywhere),
    else 1.  (ragged_k's row-major A takes a wider step: ragged_k_ws.k_block_step.)"""
    return 128 // dtype.primitive_bitwidth if a_transposed or c_transposed else 1


@gluon.jit
def tiled_rows(start, end, ALIGN: gl.constexpr):
    """(the first row of a group's m-tiles, the rows they span): the group's
    first row rounded down to a multiple of ALIGN (row_alignment, or
    ragged_k_ws.k_block_step); an empty group spans none.  Rows before the
    group's own first one are computed, never stored (store_rows)."""
    if ALIGN == 1:
        return start, end - start
    else:
        first = start - start % ALIGN
        return first, gl.where(end > start, end - first, 0)


@gluon.jit
def chunk_groups(offs_ptr, chunk, T, G, rows_before, tiles_before, n_tiles, BM: gl.constexpr,
                 ALIGN: gl.constexpr, CHUNK: gl.constexpr, WARPS: gl.constexpr,
                 CTAS: gl.constexpr = 1):
    """Groups chunk .. chunk + CHUNK as vectors: (starts, ends, tile counts,
    cumulative tile ends).  Index G is the pseudo-group of the rows past the
    last group; past it, empty groups.  ALIGN: tiled_rows'.  WARPS: the
    calling partition's."""
    layout: gl.constexpr = vector_layout(CHUNK, WARPS, CTAS)
    idx = chunk + gl.arange(0, CHUNK, layout)
    ends = gl.load(offs_ptr + idx, mask=idx < G, other=0)
    ends = gl.where(idx >= G, T, ends)
    starts = gl.load(offs_ptr + idx - 1, mask=(idx >= 1) & (idx <= G), other=0)
    starts = gl.where(idx > G, T, starts)
    ends = gl.associative_scan(gl.minimum(gl.maximum(ends, 0), T), 0, _max)
    starts = gl.associative_scan(gl.minimum(gl.maximum(starts, 0), T), 0, _max)
    ends = gl.maximum(ends, rows_before)
    starts = gl.maximum(starts, rows_before)
    rows = tiled_rows(starts, ends, ALIGN)[1]
    group_tiles = (rows + BM - 1) // BM * n_tiles
    tiles_end = tiles_before + gl.associative_scan(group_tiles, 0, plus)
    return starts, ends, group_tiles, tiles_end


@gluon.jit
def pick(values, index):
    """values[index] for a runtime index into a register vector."""
    lanes = gl.arange(0, values.shape[0], values.type.layout)
    return gl.sum(gl.where(lanes == index, values, 0), 0)


@gluon.jit
def locate(t, chunk, starts, ends, group_tiles, tiles_end, n_tiles, G, K, BM: gl.constexpr,
           BN: gl.constexpr, ALIGN: gl.constexpr):
    """(group, its row range, tile origin, K to walk) of tile t of the chunk of
    groups from `chunk`: the pseudo-group G (rows past the last group) walks none."""
    local = gl.sum((tiles_end <= t).to(gl.int32), 0)
    start = pick(starts, local)
    end = pick(ends, local)
    in_group = t - (pick(tiles_end, local) - pick(group_tiles, local))
    first, rows = tiled_rows(start, end, ALIGN)
    m_tiles = (rows + BM - 1) // BM
    off_m = first + (in_group % m_tiles) * BM
    off_n = (in_group // m_tiles) * BN
    g = chunk + local
    return g, start, end, off_m, off_n, gl.where(g < G, K, 0)


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
def store_tile(tile, c_desc, c_buf, origin, off_n):
    """Store a finished tile through TMA in column parts as wide as c_buf (2-D),
    staging each in c_buf: part i goes to c_desc's block at coordinates
    origin + (off_n + i x the part's width, ), origin being those before the
    column (the group's and the rows')."""
    EPI_N: gl.constexpr = c_buf.shape[1]
    PARTS: gl.constexpr = tile.shape[1] // EPI_N
    staged = c_buf.reinterpret(c_desc.dtype, c_desc.block_shape, c_desc.layout)
    flat = c_buf
    if c_buf.dtype != c_desc.dtype:  # allocated wider (ring_setup's STAGED): a 2-D view of c's type
        flat = c_buf.reinterpret(c_desc.dtype, c_buf.shape,
                                 shared_layout(c_buf.shape, c_desc.dtype))
    parts = column_parts(tile.to(c_desc.dtype), PARTS)
    for i in gl.static_range(PARTS):
        tma.store_wait(0)  # the previous store has read c_buf
        flat.store(parts[i])
        fence_async_shared()
        tma_store(c_desc, origin + (off_n + i * EPI_N, ), staged)


@gluon.jit
def store_rows(tile, c_ptr, ldc, row, first, end, off_n, N):
    """Store a tile at (row, off_n) of a row-major C through registers, only
    rows first .. end and columns below N: a group's first tile where it
    begins before the group (tiled_rows), rows a TMA box cannot skip."""
    layout: gl.constexpr = tile.type.layout
    rows = row + gl.arange(0, tile.shape[0], gl.SliceLayout(1, layout))
    cols = off_n + gl.arange(0, tile.shape[1], gl.SliceLayout(0, layout))
    keep = gl.expand_dims((rows >= first) & (rows < end), 1) & gl.expand_dims(cols < N, 0)
    at = gl.expand_dims(rows.to(gl.int64) * ldc, 1) + gl.expand_dims(cols, 0)
    gl.store(c_ptr + at, tile.to(c_ptr.dtype.element_ty), mask=keep)


@gluon.constexpr_function
def column_layout(warps):
    """The registers of a part of a tile stored transposed through them
    (store_columns): a warp's threads on 32 consecutive rows of a column, so
    that each store writes 64 consecutive bytes of 16-bit C^T whatever the
    mask (a group's rows start and end anywhere: wider vectors would need
    masks constant over them); its warps side by side."""
    return gl.BlockedLayout([1, 1], [32, 1], [1, warps], [0, 1])


@gluon.constexpr_function
def transposed_shared(dtype):
    """A [rows, cols] buffer stored column-major, TMA's 128-byte swizzle: its
    transpose is a [cols, rows] block of a TMA store of C^T (the rows of a
    partition's tile are at least 128 bytes of C^T's contiguous dimension)."""
    return gl.NVMMASharedLayout(128, dtype.primitive_bitwidth, 2, transposed=True)


@gluon.jit
def store_columns(tile, c_desc, c_buf, c_ptr, ldc, row, first, end, off_n, N):
    """Store a tile at (row, off_n) of a C stored transposed (C[r, n] at
    c_ptr + n * ldc + r: row-major C^T, c_desc's [N, T] with blocks of
    c_buf's transpose), only rows first .. end and columns below N, in
    column parts as wide as c_buf, each staged in it column-major.  A tile
    whose rows all lie in first .. end is stored by TMA; a TMA box cannot end
    at a group's last row, which runs along C^T's contiguous dimension, so
    other tiles are stored through registers (column_layout)."""
    ROWS: gl.constexpr = tile.shape[0]
    EPI_N: gl.constexpr = c_buf.shape[1]
    PARTS: gl.constexpr = tile.shape[1] // EPI_N
    layout: gl.constexpr = column_layout(gl.num_warps())
    staged = c_buf.reinterpret(c_buf.dtype, [ROWS, EPI_N], transposed_shared(c_buf.dtype))
    whole = (row >= first) & (row + ROWS <= end)
    rows = row + gl.arange(0, ROWS, gl.SliceLayout(1, layout))
    row_ok = gl.expand_dims((rows >= first) & (rows < end), 1)
    parts = column_parts(tile.to(c_buf.dtype), PARTS)
    for i in gl.static_range(PARTS):
        tma.store_wait(0)  # the previous store has read c_buf
        staged.store(parts[i])
        if whole:
            fence_async_shared()
            tma_store(c_desc, [off_n + i * EPI_N, row], staged.permute((1, 0)))
        else:
            part = staged.load(layout)
            cols = off_n + i * EPI_N + gl.arange(0, EPI_N, gl.SliceLayout(0, layout))
            at = gl.expand_dims(rows, 1) + gl.expand_dims(cols.to(gl.int64) * ldc, 0)
            gl.store(c_ptr + at, part, mask=row_ok & gl.expand_dims(cols < N, 0))


@gluon.jit
def first_step_past(start, end, step):
    """The first of start, start + step, ... that is >= end."""
    return start + (gl.maximum(end - start, 0) + step - 1) // step * step


@gluon.jit
def fence_before_k_loop():
    """A proxy fence before an MMA partition's K loop, once a tile.  Triton's
    proxy-fence pass puts one before any wgmma that a generic shared-memory
    write of this partition may precede, and it found one before every K
    block's MMA (MEMBAR.ALL.CTA in the loop).  With this fence the loop
    starts with none to order; blocks that the loader's threads copy in (a
    gather) still take a fence in the loop, as they need."""
    fence_async_shared()


@gluon.jit
def claim_slot(ready, empty, count, nbytes: gl.constexpr, STAGES: gl.constexpr):
    """(slot, its ready barrier) for the loader's load number `count`: waits
    until the slot's last reader has freed it, then has its barrier expect
    nbytes (the full boxes land, zero-filled past the bounds)."""
    slot = count % STAGES
    mbarrier.wait(empty.index(slot), (count // STAGES & 1) ^ 1)
    bar = ready.index(slot)
    mbarrier.expect(bar, nbytes)
    return slot, bar


@gluon.constexpr_function
def copy_elements(dtype):
    """Elements of `dtype` in one 16-byte copy."""
    return 128 // dtype.primitive_bitwidth


@gluon.constexpr_function
def gather_layout(BM, BK, warps, dtype):
    """The loader's [BM, BK] copy of gathered rows of `dtype`: 16 bytes
    (copy_elements) a copy, a row's BK elements across BK / copy_elements threads."""
    vector = copy_elements(dtype)
    lanes = BK // vector
    return gl.BlockedLayout([1, vector], [32 // lanes, lanes], [warps, 1], [1, 0])


@gluon.jit
def gather_rows(gather, off_m, end, BM: gl.constexpr, BK: gl.constexpr):
    """([BM, 1] addresses, [BM, 1] mask) of the tile's rows off_m .. (those
    below end), row r being a[rows[r] // rows_div] for gather = (a_ptr, lda,
    rows_ptr, rows_div); rows_div = 0: a[r] (rows not read)."""
    a_ptr, lda, rows_ptr, rows_div = gather
    layout: gl.constexpr = gather_layout(BM, BK, gl.num_warps(), a_ptr.dtype.element_ty)
    rm = off_m + gl.arange(0, BM, gl.SliceLayout(1, layout))
    ok = rm < end
    src = gl.load(rows_ptr + rm, mask=ok & (rows_div != 0), other=0) // gl.maximum(rows_div, 1)
    src = gl.where(rows_div != 0, src, rm)
    # The TMA flavour's rules (csrc/run.cc): a 16-byte aligned base and row
    # stride, so each thread's elements are one 16-byte copy.
    rows = gl.multiple_of(a_ptr + src * lda, 16)
    return gl.expand_dims(rows, 1), gl.expand_dims(ok, 1)


@gluon.jit
def copy_rows(buf, rows, row_ok, k0, K, bar, BK: gl.constexpr):
    """Columns k0 .. k0 + BK of gather_rows' rows into buf (zeros past K or the
    rows), each thread's copies arriving on bar when they land."""
    layout: gl.constexpr = gather_layout(buf.shape[0], BK, gl.num_warps(), buf.dtype)
    VECTOR: gl.constexpr = copy_elements(buf.dtype)
    cols = gl.max_contiguous(
        gl.multiple_of(k0 + gl.arange(0, BK, gl.SliceLayout(0, layout)), VECTOR), VECTOR)
    # K is a row_length where this runs (a multiple of 16 bytes: its role in
    # the gathering families): whole copies are in or out.
    in_k = gl.max_constancy(cols < K, VECTOR)
    cp_async_load(buf, rows + gl.expand_dims(cols, 0), row_ok & gl.expand_dims(in_k, 0))
    async_copy.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def fill_a(a_desc, a_bufs, ready, empty, count, gathered, rows, row_ok, off_m, k0, K,
           A_BYTES: gl.constexpr, B_BYTES: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """(slot, its ready barrier) of a loader that may gather (load_partition's
    gather), A's block in it: gathered, its threads copy the rows; else TMA
    loads them and one arrival stands for the threads'."""
    if gathered:
        slot, bar = claim_slot(ready, empty, count, B_BYTES, STAGES)
        copy_rows(a_bufs.index(slot), rows, row_ok, k0, K, bar, BK)
    else:
        slot, bar = claim_slot(ready, empty, count, A_BYTES + B_BYTES, STAGES)
        tma_load(a_desc, [off_m, k0], bar, a_bufs.index(slot))
        mbarrier.arrive(bar, count=32 * gl.num_warps())
    return slot, bar


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, T, N, K, G,
                   A_T: gl.constexpr, B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                   BK: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr,
                   CTAS: gl.constexpr = 1, HALVES: gl.constexpr = False, gather=None,
                   C_T: gl.constexpr = False):
    """HALVES: b's block is the rows of its two halves (ring_setup).  gather
    (gather_rows'; None: A's blocks come by TMA): each slot's `ready` also
    counts one arrival of each of this partition's threads (ring_setup's
    COPIERS), and where gather's rows_div is not 0, A's rows are gathered and
    copied by those threads (gather_rows); where it is 0, A's block is loaded
    by TMA and the arrivals made in one.  C_T: c is stored transposed (tiles
    start as row_alignment says)."""
    ALIGN: gl.constexpr = row_alignment(A_T, C_T, a_bufs.dtype)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_tiles = (N + BN - 1) // BN
    # Bytes TMA lands in each CTA: its share of A's rows (unless gathered) and
    # all of B's block.
    A_BYTES: gl.constexpr = BM // CTAS * BK * a_bufs.dtype.primitive_bitwidth // 8
    B_BYTES: gl.constexpr = BN * BK * a_bufs.dtype.primitive_bitwidth // 8
    count = 0
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = chunk_groups(
            offs_ptr, chunk, T, G, rows_before, tiles_before, n_tiles, BM, ALIGN, CHUNK,
            gl.num_warps(), CTAS)
        chunk_end = tiles_before + gl.sum(group_tiles, 0)
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            g, start, end, off_m, off_n, k_end = locate(t, chunk, starts, ends, group_tiles,
                                                        tiles_end, n_tiles, G, K, BM, BN, ALIGN)
            if gather is not None:
                rows, row_ok = gather_rows(gather, off_m, end, BM, BK)
            for k0 in range(0, k_end, BK):
                if gather is not None:
                    slot, bar = fill_a(a_desc, a_bufs, ready, empty, count, gather[3] != 0, rows,
                                       row_ok, off_m, k0, K, A_BYTES, B_BYTES, BK, STAGES)
                else:
                    slot, bar = claim_slot(ready, empty, count, A_BYTES + B_BYTES, STAGES)
                    a_origin = [k0, off_m] if A_T else [off_m, k0]
                    tma_load(a_desc, a_origin, bar, a_bufs.index(slot))
                b_buf = b_bufs.index(slot).reinterpret(b_desc.dtype, b_desc.block_shape,
                                                       b_desc.layout)
                if HALVES:
                    b_origin = [g, 0, off_n // 2, k0]
                else:
                    b_origin = [g, off_n, k0] if B_T else [g, k0, off_n]
                if CTAS == 1:
                    tma_load(b_desc, b_origin, bar, b_buf)
                else:
                    tma_load_multicast(b_desc, b_origin, bar, b_buf)
                count += 1
        tiles_before = chunk_end
        rows_before = gl.max(ends, 0)


@gluon.jit
def ragged_descriptor(ptr, cols, ld, BR: gl.constexpr, BC: gl.constexpr, CTAS: gl.constexpr = 1):
    """ragged.py's ragged_descriptor in Gluon: [BR, BC] blocks of a row-major [R, cols]
    matrix, rows clipped to a group by the coordinates (see ragged.py); in a
    cluster, a block's rows split between the CTAs."""
    block: gl.constexpr = [1, 1, BR, BC]
    return tma.make_tensor_descriptor(ptr, [RAGGED_MAX, RAGGED_MAX, RAGGED_ROWS, cols],
                                      [2 ** 34 - ld, ld, ld, 1], block,
                                      shared_layout(block, ptr.dtype.element_ty, CTAS, 2))


@gluon.jit
def allocate_ring(dtype: gl.constexpr, out: gl.constexpr, a_tile: gl.constexpr,
                  b_tile: gl.constexpr, c_tile: gl.constexpr, PARTS: gl.constexpr,
                  STAGES: gl.constexpr, CTAS: gl.constexpr = 1, A_ROWS: gl.constexpr = 0,
                  COPIERS: gl.constexpr = 0, PINGPONG: gl.constexpr = False):
    """A kernel's shared memory: STAGES ring slots of an A and a B tile, a
    c_tile for each of PARTS MMA partitions to stage its stores in, and each
    slot's barriers: `ready` (its TMA copies, and the copies of COPIERS threads
    that each arrive once, have landed) and `empty` (all PARTS partitions are
    done reading it; PINGPONG: the one whose tile it holds).  In a cluster, A's
    dimension A_ROWS and c_tile's rows are split between the CTAs, and B's
    block is whole in each."""
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_tile,
                                       shared_layout(a_tile, dtype, CTAS, A_ROWS))
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_tile, shared_layout(b_tile, dtype, CTAS))
    c_bufs = gl.allocate_shared_memory(out, [PARTS] + c_tile, shared_layout(c_tile, out, CTAS, 0))
    if CTAS == 1:
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    else:
        ready = cluster_barriers(STAGES)
        empty = cluster_barriers(STAGES)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1 + COPIERS)
        mbarrier.init(empty.index(i), count=1 if PINGPONG else PARTS)
    return a_bufs, b_bufs, c_bufs, ready, empty


@gluon.jit
def ring_setup(a_ptr, b_ptr, c_ptr, T, N, K, G, lda, b_group_stride, ldb, ldc, A_T: gl.constexpr,
               B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
               STAGES: gl.constexpr, PARTS: gl.constexpr, CTAS: gl.constexpr = 1,
               HALVES: gl.constexpr = False, HALF_C: gl.constexpr = False,
               COPIERS: gl.constexpr = 0, C_T: gl.constexpr = False,
               PINGPONG: gl.constexpr = False, STAGED: gl.constexpr = None):
    """Descriptors, buffers and barriers of a ragged_m-shaped kernel whose
    output tile is stored by PARTS MMA partitions of BM // PARTS rows each
    (each has its c buffer, and each frees a ring slot: `empty` waits for
    all), or with PINGPONG by one of two partitions that take turns at whole
    tiles (each has a BM-row c buffer, and frees the slots of its own tiles).
    A_T: a is stored [K, T] and its blocks land as [BK, BM].  In a cluster
    (one partition), the tile's rows are split between the CTAs.  HALVES
    (B_T): b [G, N, K] seen as [G, 2, N / 2, K], a block being BN / 2 rows of
    each half (kernels/glu.py's CONCATENATED).  HALF_C: c has N / 2 columns,
    BN / 2 of them a tile (a gated epilogue's output, kernels/glu.py).
    COPIERS > 0: A's rows may be gathered by that many loader threads
    (load_partition's gather).  C_T: c is stored transposed, [N, T] row-major
    (store_columns).  STAGED: the c buffers' element type where they also
    stage a wider tensor than c (None: c's)."""
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    out: gl.constexpr = c_ptr.dtype.element_ty
    k_dim = gl.maximum(K, 1)  # K = 0: a valid descriptor that is never loaded
    a_tile: gl.constexpr = [BK, BM] if A_T else [BM, BK]
    A_ROWS: gl.constexpr = 1 if A_T else 0
    a_shape = [k_dim, T] if A_T else [T, k_dim]
    a_desc = tma.make_tensor_descriptor(a_ptr, a_shape, [lda, 1], a_tile,
                                        shared_layout(a_tile, dtype, CTAS, A_ROWS))
    b_tile: gl.constexpr = [BN, BK] if B_T else [BK, BN]
    if HALVES:
        gl.static_assert(B_T, "b's halves are read K-major")
        b_desc = tma.make_tensor_descriptor(b_ptr, [G, 2, N // 2, k_dim],
                                            [b_group_stride, N // 2 * ldb, ldb, 1],
                                            [1, 2, BN // 2, BK],
                                            shared_layout([1, 2, BN // 2, BK], dtype, CTAS))
    elif B_T:
        b_desc = tma.make_tensor_descriptor(b_ptr, [G, N, k_dim], [b_group_stride, ldb, 1],
                                            [1, BN, BK], shared_layout([1, BN, BK], dtype, CTAS))
    else:
        b_desc = tma.make_tensor_descriptor(b_ptr, [G, k_dim, N], [b_group_stride, ldb, 1],
                                            [1, BK, BN], shared_layout([1, BK, BN], dtype, CTAS))
    # Rows past a group's end are not stored.
    C_N: gl.constexpr = BN // 2 if HALF_C else BN
    EPI_N: gl.constexpr = C_N if C_N < EPILOGUE_COLS else EPILOGUE_COLS
    PART_M: gl.constexpr = partition_rows(BM, PARTS, PINGPONG)
    if C_T:
        c_desc = tma.make_tensor_descriptor(c_ptr, [N, T], [ldc, 1], [EPI_N, PART_M],
                                            shared_layout([EPI_N, PART_M], out))
    elif HALF_C:
        c_desc = ragged_descriptor(c_ptr, N // 2, ldc, PART_M, EPI_N, CTAS)
    else:
        c_desc = ragged_descriptor(c_ptr, N, ldc, PART_M, EPI_N, CTAS)
    a_bufs, b_bufs, c_bufs, ready, empty = allocate_ring(dtype, out if STAGED is None else STAGED,
                                                         a_tile, b_tile, [PART_M, EPI_N], PARTS,
                                                         STAGES, CTAS, A_ROWS, COPIERS, PINGPONG)
    return a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty
