"""What the warp-specialised persistent kernels for sm90 (Gluon) share:
the ragged_m tile walk (kernels/ragged.py's order and offset rules: program p
takes tiles p, p + P, ... of the list of every group's tiles, m-tile fastest,
then the tiles of the rows past the last group, written with zeros), the
ring of shared-memory stages and its barriers, register budgets and layouts.
The loader partition is kernels/loader_ws.py's, the MMA partitions' K loops
kernels/mma_ws.py's, the stores of a finished tile kernels/epilogue_ws.py's.

A loader partition (one warp) fills the ring's slots (kernels/loader_ws.py).
MMA partitions wait for each slot, run asynchronous wgmma on it with one in
flight, free the slot of the one before, and store each finished tile
through TMA while the loader fills the ring with the next tile's first K
blocks.  Triton 3.6's own compiler does not warp-specialise on sm90: there
one program's warps both wait for loads and run MMAs, and each tile drains
the pipeline.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .gluon_api import cluster_barriers
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
    take what the producers' warpgroups (the loader's, ...) give back."""
    warps = config.num_warps * mma_partitions(config) + 4 * config.producers
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
