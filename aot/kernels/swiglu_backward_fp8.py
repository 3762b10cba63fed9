"""SwiGLU's backward for fp8 training with 1x128 blocks (DeepSeek-V3's
recipe): swiglu.py's backward with its outputs quantized as the backward's
fp8 products read them, in one pass over gu and the gradient instead of a
16-bit write and three quantizing reads.  In Gluon, for its layouts: the
composed kernels' work, the same per element, in one program.

Inputs as swiglu.py's backward: gu [R, 2C] (gate and up halves, concatenated
or INTERLEAVED), grad [R, C] (the gradient of h before the routing weight),
scale [R] float32; and offs int32 [G], the groups of rows (read as
ws.chunk_groups reads them).  Rows past the last group (dropped slots) are
not read and nothing of theirs is written.  Outputs:

dgu_q [R, 2C] fp8, dgu_scale [R, 2C / 128]   d(gu) quantized along its rows
                                               (quantize.py's BLOCK_1X128): the
                                               input gradient's operand
dgu_cols [2C, W] fp8, dgu_cols_scale          d(gu) quantized along T within
[R // 128 + G, 2C]                             the groups (quantize_columns.py's
                                               BLOCK_1X128 layout, W = 128 (R //
                                               128 + G)): w13's gradient's operand
h_cols [C, W] fp8, h_cols_scale               h scaled by the routing weight,
[R // 128 + G, C]                              the same way: w2's gradient's operand
dot [cdiv(C, 128), R] float32                 row r's sum of grad * h over
                                               columns 128 p .. 128 p + 128 at
                                               [p, r]: summed over p, swiglu.py's dot
dgu_cols_sum [R // 128 + G, 2C] float32       with SUMS, d(gu)'s sum over each
                                               row block of dgu_cols_scale (a
                                               block's row there): summed over
                                               a group's blocks, b13's
                                               gradient; blocks of no rows not
                                               written

Each value is rounded to gu's dtype before it is quantized, as swiglu.py
stores it: the fp8 outputs are quantize_fp8's and quantize_fp8_columns' of
swiglu_backward's outputs (the arithmetic is theirs: swiglu.activate,
quantize.scale_of and to_e4m3).  Concatenated halves need C to be a multiple
of 128 (each half's 1x128 blocks then start at a half's block boundary).

A tile is one 128-row block of a group by BN = 128 of h's columns: d(gu)'s
256 columns there (a gate block and an up block, or 128 gate/up pairs) and
h's 128, staged in shared memory in 16 bits, in three phases:

1. rows x BK columns at a time: gu and the gradient read from shared memory,
   where they were copied while the tile before ran (two buffers, rows 16
   bytes a copy: the operator aligns its inputs), the values computed and
   staged in place of the inputs they came from (d(gu) over gu, as its two
   128-column blocks, h over the gradient), the dot summed;
2. each staged 128-column block read whole, a warp on all 128 rows of its
   columns, 8 columns a thread (16-byte reads): amax within the warp, scale
   and quantize, a thread's rows of a column stored as one run of q's bytes
   (the transposed layouts);
3. the staged rows read SLAB at a time, a row's 128-column block across 16
   threads: amax, scale and quantize, the block's bytes stored in a run.

The quantized outputs are stored streaming (.cs): written once and never
read here, they should not evict the next tile's inputs on their way in.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy

from .gluon_api import cp_async_load, thread_barrier
from .quantize import BLOCK, scale_of, to_e4m3
from .swiglu import GPT_OSS_CODE, activate
from .ws import chunk_groups, first_step_past, locate

SLAB = gl.constexpr(64)  # rows a copy (phase 1's inputs) or a step of phase 3 takes


@gluon.constexpr_function
def load_layout(cols, warps):
    """A [BLOCK, cols] 16-bit block loaded along its rows: 16 bytes a thread."""
    lanes = cols // 8
    return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [warps, 1], [1, 0])


@gluon.constexpr_function
def column_layout(warps, q_order):
    """A staged [BLOCK, BLOCK] block in phase 2: a warp on BLOCK / warps
    columns, all its rows, 8 columns (a 16-byte vector of a row) of BLOCK /
    (its lanes down the rows) rows a thread.  A column's amax then stays
    within its warp, and a thread's rows of a column are contiguous bytes of
    q: ordered along the staged rows (loads), or along q's (q_order: the same
    elements in each thread, so converting between the two moves no data)."""
    lanes_c = BLOCK // warps // 8
    lanes_r = 32 // lanes_c
    return gl.BlockedLayout([BLOCK // lanes_r, 8], [lanes_r, lanes_c], [1, warps],
                            [0, 1] if q_order else [1, 0])


@gluon.constexpr_function
def row_layout(warps):
    """A row's 128 columns across 16 threads, 8 each (phase 3)."""
    return gl.BlockedLayout([1, 8], [2, 16], [warps, 1], [1, 0])


@gluon.constexpr_function
def half_layout(cols, warps):
    """A [BLOCK, cols] block of one half of concatenated gu, 4 values a thread:
    the layout of an interleaved block's halves after their split, so that
    the 16 warps cover the 128 rows once."""
    lanes = cols // 4
    return gl.BlockedLayout([1, 4], [32 // lanes, lanes], [warps, 1], [1, 0])


@gluon.jit
def copy_block(buf, src_ptr, ld, row0, end, col0, cols_end):
    """src[row0 + r, col0 + c] into buf[r, c] (zeros for rows at or past end or
    columns at or past cols_end) by the threads' copies, SLAB rows at a time,
    16 bytes a copy (`aligned`: rows and columns start at 16 bytes)."""
    layout: gl.constexpr = load_layout(buf.shape[1], gl.num_warps())
    rows = gl.arange(0, SLAB, gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, buf.shape[1], gl.SliceLayout(0, layout))
    cols = gl.max_contiguous(gl.multiple_of(cols, 8), 8)
    col_ok = gl.expand_dims(gl.max_constancy(cols < cols_end, 8), 0)
    for slab in gl.static_range(BLOCK // SLAB):
        r = row0 + slab * SLAB + rows
        at = gl.expand_dims(r.to(gl.int64) * ld, 1) + gl.expand_dims(cols, 0)
        cp_async_load(buf.slice(slab * SLAB, SLAB, 0), src_ptr + at,
                      gl.expand_dims(r < end, 1) & col_ok)


@gluon.jit
def prefetch(gu_ptr, grad_ptr, gu_in, grad_in, row0, end, c0, C, INTERLEAVED: gl.constexpr):
    """Start copying a tile's gu (its 128 gate/up pairs, or its gate block then
    its up block) and gradient into gu_in [BLOCK, 2 BLOCK] and grad_in
    [BLOCK, BLOCK]: they land while the tile before runs (the caller commits
    the copies as a group)."""
    if INTERLEAVED:
        copy_block(gu_in, gu_ptr, 2 * C, row0, end, 2 * c0, 2 * C)
    else:
        copy_block(gu_in.slice(0, BLOCK, 1), gu_ptr, 2 * C, row0, end, c0, C)
        copy_block(gu_in.slice(BLOCK, BLOCK, 1), gu_ptr + C, 2 * C, row0, end, c0, C)
    copy_block(grad_in, grad_ptr, C, row0, end, c0, C)


@gluon.jit
def gate_and_up(gu_in, step, INTERLEAVED: gl.constexpr, BK: gl.constexpr):
    """The gate and up halves of the prefetched tile's h columns step * BK ..
    + BK, float32 [BLOCK, BK] each, in one layout."""
    if INTERLEAVED:
        layout: gl.constexpr = load_layout(2 * BK, gl.num_warps())
        pairs = gu_in.slice(2 * step * BK, 2 * BK, 1).load(layout).reshape([BLOCK, BK, 2])
        gate, up = pairs.split()
    else:
        layout: gl.constexpr = half_layout(BK, gl.num_warps())
        gate = gu_in.slice(step * BK, BK, 1).load(layout)
        up = gu_in.slice(BLOCK + step * BK, BK, 1).load(layout)
    return gate.to(gl.float32), up.to(gl.float32)


@gluon.jit
def compute_and_stage(gu_in, grad_in, scale_ptr, row0, end, INTERLEAVED: gl.constexpr,
                      GPT_OSS: gl.constexpr, BK: gl.constexpr):
    """Phase 1, from the prefetched gu and gradient (zeros past the group's
    rows and C): d(gu) and h scaled staged in 16 bits in their place (gu_in
    and grad_in then hold d(gu) and h); returns each row's sum of grad * h
    over the tile's columns."""
    dtype: gl.constexpr = gu_in.dtype
    for step in gl.static_range(BLOCK // BK):
        gate, up = gate_and_up(gu_in, step, INTERLEAVED, BK)
        rows = row0 + gl.arange(0, BLOCK, gl.SliceLayout(1, gate.type.layout))
        grad = grad_in.slice(step * BK, BK, 1).load(gate.type.layout).to(gl.float32)
        scale = gl.expand_dims(gl.load(scale_ptr + rows, mask=rows < end, other=0.0), 1)
        h, d_gate, d_up = activate(gate, up, GPT_OSS)
        h = h.to(dtype).to(gl.float32)
        if step == 0:
            dot = gl.sum(grad * h, 1)
        else:
            dot += gl.sum(grad * h, 1)
        dh = grad * scale
        d_gate = (dh * d_gate).to(dtype)
        d_up = (dh * d_up).to(dtype)
        thread_barrier()  # the step's inputs are read, by every thread, before they are replaced
        grad_in.slice(step * BK, BK, 1).store((h * scale).to(dtype))
        if INTERLEAVED:
            gu_in.slice(2 * step * BK, 2 * BK, 1).store(
                gl.join(d_gate, d_up).reshape([BLOCK, 2 * BK]))
        else:
            gu_in.slice(step * BK, BK, 1).store(d_gate)
            gu_in.slice(BLOCK + step * BK, BK, 1).store(d_up)
    return dot


@gluon.jit
def quantize_columns(staged, q_ptr, scale_ptr, first, limit, W, sum_ptr=None):
    """Phase 2: staged [BLOCK, BLOCK] quantized along its rows, in one read: its
    column i is q's row first + i, stored at q_ptr + (first + i) * W with its
    scale at scale_ptr[first + i] (and its sum at sum_ptr[first + i], if
    given), where first + i < limit.  The callers offset the pointers to the
    tile's row block."""
    loaded: gl.constexpr = column_layout(gl.num_warps(), False)
    stored: gl.constexpr = column_layout(gl.num_warps(), True)
    x = staged.load(loaded).to(gl.float32)
    scale = scale_of(gl.max(gl.abs(x), 0))
    index = first + gl.arange(0, BLOCK, gl.SliceLayout(0, loaded))
    gl.store(scale_ptr + index, scale, mask=index < limit)
    if sum_ptr is not None:
        gl.store(sum_ptr + index, gl.sum(x, 0), mask=index < limit)
    q = gl.convert_layout(to_e4m3(x, gl.expand_dims(scale, 0)), stored)
    index = first + gl.arange(0, BLOCK, gl.SliceLayout(0, stored))
    rows = gl.arange(0, BLOCK, gl.SliceLayout(1, stored))
    at = gl.expand_dims(index.to(gl.int64) * W, 0) + gl.expand_dims(rows, 1)
    gl.store(q_ptr + at, q, mask=gl.expand_dims(index < limit, 0), cache_modifier=".cs")


@gluon.jit
def quantize_rows(staged, q_ptr, scale_ptr, ld, blocks, rows_left, cols_left):
    """Phase 3: staged [BLOCK, 128] quantized along its rows: row r's (those
    below rows_left) columns c (below cols_left) to q_ptr + r * ld + c, its
    scale to scale_ptr[r * blocks]."""
    layout: gl.constexpr = row_layout(gl.num_warps())
    cols = gl.arange(0, BLOCK, gl.SliceLayout(0, layout))
    lanes = gl.arange(0, SLAB, gl.SliceLayout(1, layout))
    at = gl.expand_dims(lanes.to(gl.int64) * ld, 1) + gl.expand_dims(cols, 0)
    col_ok = gl.expand_dims(cols < cols_left, 0)
    for chunk in gl.static_range(BLOCK // SLAB):
        ok = (chunk * SLAB + lanes < rows_left) & (cols_left > 0)
        x = staged.slice(chunk * SLAB, SLAB, 0).load(layout).to(gl.float32)
        scale = scale_of(gl.max(gl.abs(x), 1))
        gl.store(scale_ptr + (chunk * SLAB + lanes).to(gl.int64) * blocks, scale, mask=ok)
        gl.store(q_ptr + chunk * SLAB * ld + at, to_e4m3(x, gl.expand_dims(scale, 1)),
                 mask=gl.expand_dims(ok, 1) & col_ok, cache_modifier=".cs")


@gluon.jit
def start_tile(t, chunk, starts, ends, group_tiles, tiles_end, n_tiles, G, gu_ptr, grad_ptr,
               gu_in, grad_in, C, INTERLEAVED: gl.constexpr, BM: gl.constexpr,
               BN: gl.constexpr):
    """Prefetch tile t's inputs (none for the pseudo-group's tiles)."""
    g, start, end, off_m, off_n, _ = locate(t, chunk, starts, ends, group_tiles, tiles_end,
                                            n_tiles, G, 0, BM, BN, 1)
    if g < G:
        prefetch(gu_ptr, grad_ptr, gu_in, grad_in, off_m, end, off_n, C, INTERLEAVED)


@gluon.jit
def quantize_tile(dgu_s, h_s, outputs, row0, end, block, c0, C, W, INTERLEAVED: gl.constexpr,
                  SUMS: gl.constexpr):
    """Phases 2 and 3 of the staged tile: rows row0 .. row0 + 128 (those
    below end) of a group, its column block `block`, by h's columns c0 .. c0
    + 128."""
    dgu_q_ptr, dgu_scale_ptr, dgu_cols_ptr, dgu_cols_scale_ptr, h_cols_ptr, h_cols_scale_ptr, \
        _, dgu_cols_sum_ptr = outputs
    quantize_columns(h_s, h_cols_ptr + block * BLOCK, h_cols_scale_ptr + block.to(gl.int64) * C,
                     c0, C, W)
    blocks = (2 * C + BLOCK - 1) // BLOCK
    for i in gl.static_range(2):
        # d(gu)'s column of the staged block i: the gate's and the up's, or pairs.
        first = 2 * c0 + i * BLOCK if INTERLEAVED else i * C + c0
        staged = dgu_s.slice(i * BLOCK, BLOCK, 1)
        sum_ptr = None
        if SUMS:
            sum_ptr = dgu_cols_sum_ptr + block.to(gl.int64) * (2 * C)
        quantize_columns(staged, dgu_cols_ptr + block * BLOCK,
                         dgu_cols_scale_ptr + block.to(gl.int64) * (2 * C), first, 2 * C, W,
                         sum_ptr)
        quantize_rows(staged, dgu_q_ptr + row0.to(gl.int64) * (2 * C) + first,
                      dgu_scale_ptr + row0.to(gl.int64) * blocks + first // BLOCK, 2 * C, blocks,
                      end - row0, 2 * C - first)


@gluon.jit
def swiglu_backward_fp8_kernel(gu_ptr, grad_ptr, scale_ptr, offs_ptr, dgu_q_ptr, dgu_scale_ptr,
                               dgu_cols_ptr, dgu_cols_scale_ptr, h_cols_ptr, h_cols_scale_ptr,
                               dot_ptr, dgu_cols_sum_ptr, R, C, G, activation,
                               INTERLEAVED: gl.constexpr, SUMS: gl.constexpr,
                               USE_TMA: gl.constexpr, BM: gl.constexpr,
                               BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                               PRECISION: gl.constexpr):
    """Persistent: program p takes tiles p, p + P, ... of every group's
    128-row blocks by BN columns, in group order (ws.chunk_groups' scan, the
    pseudo-group of the rows past the last one skipped).  The runtime
    launches min(the family's `tiles`, one wave) programs.  BK: h's columns
    phase 1 takes at once.  SUMS: dgu_cols_sum written (else not touched).
    USE_TMA and PRECISION (GEMM constexprs every variant receives) are
    unused."""
    gl.static_assert(not USE_TMA, "swiglu_backward_fp8 has no TMA path")
    gl.static_assert(BM == BLOCK and BN == BLOCK, "a tile is 128 rows by 128 of h's columns")
    dtype: gl.constexpr = gu_ptr.dtype.element_ty
    # 16-byte vectors permuted across 16 phases: the column reads of phase 2
    # fall on distinct banks, 2 ways at most.
    staged: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 16, order=[1, 0])
    # Two tiles' inputs: one's copies land while the other runs its phases.
    gu_in = gl.allocate_shared_memory(dtype, [2, BLOCK, 2 * BLOCK], staged)
    grad_in = gl.allocate_shared_memory(dtype, [2, BLOCK, BLOCK], staged)
    outputs = (dgu_q_ptr, dgu_scale_ptr, dgu_cols_ptr, dgu_cols_scale_ptr, h_cols_ptr,
               h_cols_scale_ptr, dot_ptr, dgu_cols_sum_ptr)
    # The activation chosen once: each form's loop compiled for it alone.
    if activation == GPT_OSS_CODE:
        backward_tiles(gu_ptr, grad_ptr, scale_ptr, offs_ptr, outputs, gu_in, grad_in, R, C, G,
                       INTERLEAVED, True, SUMS, BM, BN, BK, CHUNK)
    else:
        backward_tiles(gu_ptr, grad_ptr, scale_ptr, offs_ptr, outputs, gu_in, grad_in, R, C, G,
                       INTERLEAVED, False, SUMS, BM, BN, BK, CHUNK)


@gluon.jit
def backward_tiles(gu_ptr, grad_ptr, scale_ptr, offs_ptr, outputs, gu_in, grad_in, R, C, G,
                   INTERLEAVED: gl.constexpr, GPT_OSS: gl.constexpr, SUMS: gl.constexpr,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr):
    """The kernel's tiles, with the activation's form fixed."""
    dot_ptr = outputs[6]
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_tiles = (C + BN - 1) // BN
    W = (R // BLOCK + G) * BLOCK
    tiles_before = 0
    rows_before = 0
    started = 0  # the program's tiles begun: buffer started % 2 takes the next one's inputs
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = chunk_groups(
            offs_ptr, chunk, R, G, rows_before, tiles_before, n_tiles, BM, 1, CHUNK,
            gl.num_warps())
        chunk_end = tiles_before + gl.sum(group_tiles, 0)
        first = first_step_past(pid, tiles_before, programs)
        if first < chunk_end:
            start_tile(first, chunk, starts, ends, group_tiles, tiles_end, n_tiles, G, gu_ptr,
                       grad_ptr, gu_in.index(started % 2), grad_in.index(started % 2), C,
                       INTERLEAVED, BM, BN)
        async_copy.commit_group()
        for t in range(first, chunk_end, programs):
            g, start, end, off_m, off_n, _ = locate(t, chunk, starts, ends, group_tiles,
                                                    tiles_end, n_tiles, G, 0, BM, BN, 1)
            # The next tile's copies go to the other buffer (free: the tile
            # before this one ended with a barrier) and land while this one runs.
            if t + programs < chunk_end:
                start_tile(t + programs, chunk, starts, ends, group_tiles, tiles_end, n_tiles,
                           G, gu_ptr, grad_ptr, gu_in.index((started + 1) % 2),
                           grad_in.index((started + 1) % 2), C, INTERLEAVED, BM, BN)
            async_copy.commit_group()
            async_copy.wait_group(1)  # every group but the next tile's: this tile's copies
            thread_barrier()  # every thread's copies of the tile have landed
            gu_t = gu_in.index(started % 2)
            grad_t = grad_in.index(started % 2)
            if g < G:
                dot = compute_and_stage(gu_t, grad_t, scale_ptr, off_m, end, INTERLEAVED,
                                        GPT_OSS, BK)
                rows = off_m + gl.arange(0, BLOCK, dot.type.layout)
                gl.store(dot_ptr + (off_n // BLOCK) * R + rows, dot, mask=rows < end)
                thread_barrier()  # the stage is written, by every thread
                block = start // BLOCK + g + (off_m - start) // BLOCK
                quantize_tile(gu_t, grad_t, outputs, off_m, end, block, off_n, C, W, INTERLEAVED,
                              SUMS)
            thread_barrier()  # the buffer is read before the tile after next copies into it
            started += 1
        tiles_before = chunk_end
        rows_before = gl.max(ends, 0)
