"""The K loops of the warp-specialised MMA partitions (kernels/ragged_ws.py's,
and those of the other sm90 Gluon kernels): this partition's operands of a
ring slot, the tile's product over K with one MMA in flight (16-bit, fp8
with fast or promoted accumulation), fp8's 128 x 128-block and per-channel
scales applied as kernels/scaled.py says (rescaling the accumulator between
K blocks; two partitions then take turns, wait_turn), and a tile's slots
passed unread.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                               warpgroup_mma, warpgroup_mma_wait)

from .fast_math import reciprocal
from .glu import CONCATENATED, NO_GLU
from .glu_ws import w13_columns
from .scaled import BLOCKWISE, ROWWISE, SCALE_BLOCK

# Blockwise fp8 keeps its accumulator in units no smaller than these (accumulate_blockwise).
UNIT_FLOOR = gl.constexpr(2.0**-100)
UNIT_RANGE = gl.constexpr(2.0**-60)

# Registers of a second MMA partition's threads (the default partition gets
# about as many: what is left of the 64K after it and the loader's warpgroup).
MMA_REGISTERS = gl.constexpr(216)


@gluon.jit
def operands(a_bufs, b_bufs, slot, half: gl.constexpr, PART_M: gl.constexpr, A_T: gl.constexpr,
             B_T: gl.constexpr):
    """This partition's rows of slot's A block as [PART_M, BK], and its B block
    as [BK, BN] (wgmma reads a transposed block as it is stored)."""
    if A_T:
        a = a_bufs.index(slot).slice(half * PART_M, PART_M, dim=1).permute((1, 0))
    else:
        a = a_bufs.index(slot).slice(half * PART_M, PART_M)
    if B_T:
        return a, b_bufs.index(slot).permute((1, 0))
    else:
        return a, b_bufs.index(slot)


@gluon.jit
def accumulate(a_bufs, b_bufs, ready, empty, count, k_end, half: gl.constexpr,
               PART_M: gl.constexpr, A_T: gl.constexpr, B_T: gl.constexpr, BN: gl.constexpr,
               BK: gl.constexpr, STAGES: gl.constexpr, acc_layout: gl.constexpr,
               FAST_ACCUM: gl.constexpr, gather=None):
    """(the tile's product over K, the ring count after it), one MMA in flight.
    fp8 without FAST_ACCUM: each BK-deep step's product is added to acc in
    float32 (the compiler's partial accumulator, as many registers again).
    gather (loader_ws.gather_rows'; None: A's blocks come by TMA): where its rows_div
    is not 0, A's block was written by the loader's threads (loader_ws.copy_rows),
    which wgmma's reads (the async proxy) see only after a proxy fence."""
    acc = gl.zeros([PART_M, BN], gl.float32, acc_layout)
    for k0 in range(0, k_end, BK):
        slot = count % STAGES
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        if gather is not None:  # noqa: SIM102 (a constexpr, then a runtime test)
            if gather[3] != 0:
                fence_async_shared()
        a, b = operands(a_bufs, b_bufs, slot, half, PART_M, A_T, B_T)
        if FAST_ACCUM:
            acc = warpgroup_mma(a, b, acc, is_async=True)
        else:
            acc = warpgroup_mma(a, b, acc, max_num_imprecise_acc=BK, is_async=True)
        acc = warpgroup_mma_wait(1, deps=(acc, ))  # the MMA before is done with its slot
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k0 > 0)
        count += 1
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k_end > 0)
    return acc, count


@gluon.jit
def block_scales(scales, g, rows, row_ok, k_end, k_blocks, n_blocks, block, col_block):
    """[rows, the tile's column blocks] scales of K block `block`, for scales
    = (scale_a_ptr, scale_b_ptr): scale_a[row, block] x scale_b[g, column
    block, block] (rows: scale_a's, token_rows'; col_block: b's block of each
    of the tile's column blocks, column_blocks'; None: b's scales are per
    channel, applied after the sum, and the scales are scale_a's [rows, 1]).
    Rows past the group and column blocks past N (never stored) and blocks
    past k_end (never added; all of the pseudo-group's, which has no
    scale_b) read 1."""
    scale_a_ptr, scale_b_ptr = scales
    in_k = block * SCALE_BLOCK < k_end
    scale_a = gl.load(scale_a_ptr + rows.to(gl.int64) * k_blocks + block, mask=row_ok & in_k,
                      other=1.0)
    if col_block is None:
        return gl.expand_dims(scale_a, 1)
    else:
        weights = scale_b_ptr + (g.to(gl.int64) * n_blocks + col_block) * k_blocks + block
        scale_b = gl.load(weights, mask=(col_block < n_blocks) & in_k, other=1.0)
        return gl.expand_dims(scale_a, 1) * gl.expand_dims(scale_b, 0)


@gluon.constexpr_function
def column_block_count(BN, SCALING, BLOCK_COLUMNS):
    """The number of a tile's column blocks, each scaled by one weight scale
    in the K loop (column_blocks'): BN / BLOCK_COLUMNS for b's 128 x 128
    blocks, 1 for per-channel weights (no weight scales in the K loop)."""
    return (BN + BLOCK_COLUMNS - 1) // BLOCK_COLUMNS if SCALING == BLOCKWISE else 1


@gluon.jit
def column_blocks(off_n, N, H: gl.constexpr, GLU: gl.constexpr, BLOCK_COLUMNS: gl.constexpr,
                  layout: gl.constexpr):
    """b's 128-row scale block of each of a tile's H blocks of BLOCK_COLUMNS
    columns: off_n / 128 + i, or for CONCATENATED the gate half's H / 2
    blocks then the up half's (from rows off_n / 2 + BLOCK_COLUMNS i of each
    half: kernels/glu.py's columns).  Each such block lies within one weight
    block where its first row is a multiple of BLOCK_COLUMNS: 128, or, where
    I = N / 2 is an odd multiple of 64, 64 (scaled_ragged_glu's conditions
    for its concatenated configs of this kernel)."""
    i = gl.arange(0, H, layout)
    if GLU == CONCATENATED:
        HALF: gl.constexpr = H // 2
        return (off_n // 2 + (i // HALF) * (N // 2) + (i % HALF) * BLOCK_COLUMNS) // SCALE_BLOCK
    else:
        gl.static_assert(BLOCK_COLUMNS == SCALE_BLOCK, "64-column blocks are concatenated halves'")
        return off_n // SCALE_BLOCK + i


@gluon.jit
def tile_column_blocks(off_n, N, H: gl.constexpr, SCALING: gl.constexpr, GLU: gl.constexpr,
                       BLOCK_COLUMNS: gl.constexpr, layout: gl.constexpr):
    """column_blocks' for b's 128 x 128 blocks (BLOCKWISE); None for per-channel ones."""
    # One return: Triton 3.6 refuses a None returned from a branch.
    col_block = None
    if SCALING == BLOCKWISE:
        col_block = column_blocks(off_n, N, H, GLU, BLOCK_COLUMNS, layout)
    return col_block


@gluon.jit
def channel_scaled(acc, scales, gather, g, G, N, off_n, part_m, end, SCALING: gl.constexpr,
                   GLU: gl.constexpr, acc_layout: gl.constexpr):
    """A summed tile times b's per-channel scales (ROWWISE and
    BLOCKWISE_ROWWISE) and, ROWWISE, a's per-row ones (the rows' tokens:
    token_rows); columns past N and rows past end read 0.  Indices made
    here, not live through the K loop."""
    scale_a_ptr, scale_b_ptr = scales
    cols, col_ok = w13_columns(off_n, N, acc.shape[1], GLU, gl.SliceLayout(0, acc_layout))
    scale_b = gl.load(scale_b_ptr + g.to(gl.int64) * N + cols, mask=col_ok & (g < G), other=0.0)
    if SCALING == ROWWISE:
        rows = part_m + gl.arange(0, acc.shape[0], gl.SliceLayout(1, acc_layout))
        row_ok = rows < end
        scale_a = gl.load(scale_a_ptr + token_rows(gather, rows, row_ok), mask=row_ok, other=0.0)
        return acc * gl.expand_dims(scale_a, 1) * gl.expand_dims(scale_b, 0)
    else:
        return acc * gl.expand_dims(scale_b, 0)


@gluon.jit
def token_rows(gather, rows, row_ok):
    """The rows of a's scales for a tile's rows: the tokens of gathered rows
    (rows_ptr[r] // rows_div, gather = (a_ptr, lda, rows_ptr, rows_div)), or
    the rows themselves (gather None)."""
    if gather is None:
        return rows
    else:
        rows_ptr = gather[2]
        return gl.load(rows_ptr + rows, mask=row_ok, other=0) // gather[3]


@gluon.jit
def unit_of(scale, largest):
    """The unit the accumulator is kept in while a block of this scale is
    added: the scale, raised to UNIT_FLOOR or UNIT_RANGE x the largest scale
    so far where it is smaller (zero included; NaN is kept).  The bound
    keeps |accumulator| below 2^60 x the sum of the blocks' fp8 products (no
    overflow, whatever the scales); a block so scaled adds at most the bound x
    its product more than it should (far below float32's rounding of the
    blocks that set the bound)."""
    bound = gl.maximum(largest * UNIT_RANGE, UNIT_FLOOR)
    return gl.where(gl.abs(scale) < bound, bound, scale)


@gluon.jit
def rescale(acc, factor, acc_layout: gl.constexpr):
    """acc [M, BN] times factor [M, H], one factor per column block (no data moves)."""
    M: gl.constexpr = acc.shape[0]
    H: gl.constexpr = factor.shape[1]
    blocks = acc.reshape([M, H, acc.shape[1] // H]) * gl.expand_dims(factor, 2)
    return gl.convert_layout(blocks.reshape([M, acc.shape[1]]), acc_layout, assert_trivial=True)


@gluon.jit
def wait_turn(turns, half: gl.constexpr, count):
    """Before partition `half` issues the MMA of its ring block `count`: wait
    until the other's first half of its MMA of the block before (partition 0)
    or of this block (partition 1) is done (each arrives on turns[half])."""
    if half == 0:
        mbarrier.wait(turns.index(1), (count + 1) & 1, pred=count > 0)
    else:
        mbarrier.wait(turns.index(0), count & 1)


@gluon.jit
def accumulate_blockwise(a_bufs, b_bufs, ready, empty, turns, count, k_end, scales, g, part_m,
                         end, K, N, off_n, half: gl.constexpr, PART_M: gl.constexpr,
                         BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                         acc_layout: gl.constexpr, SCALING: gl.constexpr = BLOCKWISE,
                         GLU: gl.constexpr = NO_GLU, gather=None,
                         BLOCK_COLUMNS: gl.constexpr = SCALE_BLOCK):
    """accumulate() with each 128-deep K block's product scaled before it is
    added, in one accumulator kept in units of the current block's scale
    (unit_of): before block j's MMA adds its product the accumulator is
    multiplied by unit[j-1] / unit[j], and at the end by the last unit.  The
    quotient is unit[j-1] x fast_math.reciprocal(unit[j]), the same bits while
    units stay below 2^126 (a scale that large, whose products overflow
    float32 from an fp8 product of 4 on, zeroes the blocks before it).  One
    multiply an element a block, as many as scaling a separate product tile
    would take, without that tile's registers: 256-column tiles, whose wgmma
    reads A once for twice the columns of a 128-column one.

    The two partitions of a split tile take turns (wait_turn), each issuing a
    block's MMA in two halves and letting the other go once its first half
    is done: one's multiplies then run while the other's MMA does (left alone
    they drift into step and multiply at the same time: slower, measured);
    turns None (PINGPONG): their tiles are apart already.
    SCALING: BLOCKWISE, or BLOCKWISE_ROWWISE (b's per-channel scales come
    after: one unit per row); GLU and BLOCK_COLUMNS: the tile's columns and
    the width of those one weight scale takes (column_blocks); gather:
    accumulate()'s, whose rows' tokens take their scales (token_rows)."""
    gl.static_assert(BK == SCALE_BLOCK, "one MMA a scale block")
    H: gl.constexpr = column_block_count(BN, SCALING, BLOCK_COLUMNS)
    acc = gl.zeros([PART_M, BN], gl.float32, acc_layout)
    # One unit per row and column block, in the layout of acc's column blocks.
    layout: gl.constexpr = gl.SliceLayout(2, acc.reshape([PART_M, H, BN // H]).type.layout)
    rows = part_m + gl.arange(0, PART_M, gl.SliceLayout(1, layout))
    row_ok = rows < end
    rows = token_rows(gather, rows, row_ok)
    col_block = tile_column_blocks(off_n, N, H, SCALING, GLU, BLOCK_COLUMNS,
                                   gl.SliceLayout(0, layout))
    k_blocks = (K + SCALE_BLOCK - 1) // SCALE_BLOCK
    n_blocks = (N + SCALE_BLOCK - 1) // SCALE_BLOCK
    unit = gl.full([PART_M, H], 1.0, gl.float32, layout)
    largest = gl.zeros([PART_M, H], gl.float32, layout)
    scale = block_scales(scales, g, rows, row_ok, k_end, k_blocks, n_blocks, 0, col_block)
    HALF_K: gl.constexpr = BK // 2
    for k0 in range(0, k_end, BK):
        slot = count % STAGES
        # A block ahead: the loads' latency hides behind a whole MMA.
        next_scale = block_scales(scales, g, rows, row_ok, k_end, k_blocks, n_blocks,
                                  k0 // SCALE_BLOCK + 1, col_block)
        largest = gl.maximum(largest, gl.abs(scale))
        new_unit = unit_of(scale, largest)
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        if gather is not None:  # noqa: SIM102 (a constexpr, then a runtime test)
            if gather[3] != 0:  # the loader's threads wrote A's block (accumulate())
                fence_async_shared()
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k0 > 0)
        acc = rescale(acc, unit * reciprocal(new_unit), acc_layout)
        unit = new_unit
        scale = next_scale
        a, b = operands(a_bufs, b_bufs, slot, half, PART_M, False, True)
        if turns is None:  # the partitions' tiles are their own (PINGPONG)
            acc = warpgroup_mma(a, b, acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))  # still in flight (a loop-carried tensor)
        else:
            wait_turn(turns, half, count)
            acc = warpgroup_mma(a.slice(0, HALF_K, dim=1), b.slice(0, HALF_K), acc,
                                is_async=True)
            acc = warpgroup_mma(a.slice(HALF_K, HALF_K, dim=1), b.slice(HALF_K, HALF_K), acc,
                                is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))  # the first half is done
            mbarrier.arrive(turns.index(half))
        count += 1
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k_end > 0)
    return rescale(acc, unit, acc_layout), count


@gluon.jit
def accumulate_blockwise_promoted(a_bufs, b_bufs, ready, empty, count, k_end, scales, g, part_m,
                                  end, K, N, off_n, half: gl.constexpr, PART_M: gl.constexpr,
                                  BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                                  acc_layout: gl.constexpr, SCALING: gl.constexpr):
    """accumulate_blockwise() without fast accumulation: each 128-deep K
    block's product is made from zero by the tensor cores, then scaled and
    added to the float32 accumulator by the CUDA cores (the DeepSeek-V3
    recipe), while the other partition's MMA runs.  SCALING as
    accumulate_blockwise's."""
    gl.static_assert(BK == SCALE_BLOCK, "one MMA a scale block")
    H: gl.constexpr = column_block_count(BN, SCALING, SCALE_BLOCK)
    acc = gl.zeros([PART_M, BN], gl.float32, acc_layout)
    layout: gl.constexpr = gl.SliceLayout(2, acc.reshape([PART_M, H, BN // H]).type.layout)
    rows = part_m + gl.arange(0, PART_M, gl.SliceLayout(1, layout))
    row_ok = rows < end
    col_block = tile_column_blocks(off_n, N, H, SCALING, NO_GLU, SCALE_BLOCK,
                                   gl.SliceLayout(0, layout))
    k_blocks = (K + SCALE_BLOCK - 1) // SCALE_BLOCK
    n_blocks = (N + SCALE_BLOCK - 1) // SCALE_BLOCK
    for k0 in range(0, k_end, BK):
        slot = count % STAGES
        scale = block_scales(scales, g, rows, row_ok, k_end, k_blocks, n_blocks, k0 // SCALE_BLOCK,
                             col_block)
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        a, b = operands(a_bufs, b_bufs, slot, half, PART_M, False, True)
        product = warpgroup_mma(a, b, acc, use_acc=False, is_async=True)
        product = warpgroup_mma_wait(0, deps=(product, ))
        mbarrier.arrive(empty.index(slot))
        acc = acc + rescale(product, scale, acc_layout)
        count += 1
    return acc, count


@gluon.jit
def pass_blocks(ready, empty, turns, count, k_end, half: gl.constexpr, BK: gl.constexpr,
                STAGES: gl.constexpr):
    """Free the tile's slots unread (each once it is filled, so that a slot is
    never released for a round the loader has not reached), and pass each
    block's turn where the partitions take turns (turns: their barriers, as
    accumulate_blockwise's; None where they do not)."""
    for k0 in range(0, k_end, BK):
        slot = count % STAGES
        if turns is not None:
            wait_turn(turns, half, count)
            mbarrier.arrive(turns.index(half))
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        mbarrier.arrive(empty.index(slot))
        count += 1
    return count
