"""scaled_experts_decode_kernel (kernels/experts_decode.py: its contract,
units and quantities) as a warp-specialised persistent kernel for sm90, in
Gluon: one stream of weight reads an SM, never drained between units.

The loader partition (a warpgroup) walks the program's units and fills a
ring of STAGES slots, each of BK / 128 x BN = 256 rows of 128 weight bytes
and the BM token rows of each 128-column block in e4m3: for a unit, its
cdiv(H, BK) up-projection steps (the gate's and the up's 128 rows of w13 and
the tokens, BK columns), then its down-projection steps (BK / 128 x BN rows
of w2's 128 columns), then the next unit's.  A step reads BK bytes of each
weight row at once (128 at a time measured slower:
docs/notes/2026-11-27-fp8-decode-ws-256-byte-steps.md).  Tokens in e4m3
(per-channel weights) the loader's threads copy (loader_ws.copy_rows); with
128 x 128 weight blocks the tokens come in 16 bits and a second producer,
the quantizer partition (a warpgroup), loads each step's blocks a step
ahead and quantizes them into the slot: the MMA partition, which did it
between its MMAs, spent about half of the up projection's time on it
(docs/notes/2026-11-30-fp8-decode-tokens-quantized-beside-the-mmas.md).
The quantizer takes every slot of the ring in turn, the down steps' too
(an arrival with no blocks): a producer that skipped slots could wait for a
slot's phase that its reader had already passed, or take a later one for
it, once a program walks several units.
The MMA partition (one warpgroup) takes the slots in the same order, scales
each 128-deep block's gate and up products into their accumulators,
applies the activation, quantizes h per slot row, keeps it in shared memory
as the down projection's operand, and stores each block's part.  So the next
unit's weights are on their way while a unit's epilogue runs, where a single
warpgroup would wait for them.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from .epilogue_ws import transposed_shared
from .experts_decode import MAX_SLOTS
from .glu import CONCATENATED
from .glu_ws import activate, to_e4m3
from .gluon_api import thread_barrier, tma_load
from .loader_ws import claim_slot, copy_rows, gather_layout
from .quantize import AMAX_FLOOR, E4M3_MAX_RECIPROCAL
from .scaled import BLOCKWISE, SCALE_BLOCK
from .ws import GATHER_WARPS, accumulator_layout, plus, shared_layout, vector_layout

CHUNK_COLUMNS = gl.constexpr(128)  # h's columns a unit: one scale block
# The quantizer partition (BLOCKWISE): a warpgroup, each thread 16 of a
# [16, 128] block's values at a time, two blocks a step and the next step's
# two loaded ahead.  The launch's count of registers makes room for it
# (ws.max_registers); under it the loader spills at GATHER_REGISTERS, and
# both fit here with the MMA partition's 256 (64K = 128 x (256 + 80 + 128)).
QUANTIZER_WARPS = gl.constexpr(4)
QUANTIZER_REGISTERS = gl.constexpr(128)
LOADER_REGISTERS = gl.constexpr(80)


@gluon.jit
def w13_rows(j, half, inter, GLU: gl.constexpr):
    """w13's rows of h's columns j: their gate's (half 0) or up's (half 1).
    kernels/experts_decode.py's w13_rows in Gluon (a Gluon kernel cannot call
    a Triton function): change them together."""
    if GLU == CONCATENATED:
        return half * inter + j
    else:
        return 2 * j + half


@gluon.jit
def w13_origin(g, half, first, k0, GLU: gl.constexpr):
    """The coordinates of the w13 box of h's columns first .. first + 128, gate
    (half 0) or up (half 1) rows, at K step k0, in the 4-D view of w13."""
    if GLU == CONCATENATED:
        return [g, half, first, k0]
    else:
        return [g, first, half, k0]


@gluon.constexpr_function
def routing_layout(warps):
    """The routing's [rows, MAX_SLOTS] tiles: a slot a lane along a row."""
    return gl.BlockedLayout([1, MAX_SLOTS // 32], [1, 32], [warps, 1], [1, 0])


@gluon.jit
def slot_groups(ids_ptr, S, G, chunks, BM: gl.constexpr):
    """kernels/experts_decode.py's slot_groups in Gluon (change them
    together), each vector along the slots of routing_layout's rows."""
    layout: gl.constexpr = routing_layout(gl.num_warps())
    lanes: gl.constexpr = gl.SliceLayout(0, layout)
    s = gl.arange(0, MAX_SLOTS, gl.SliceLayout(1, layout))
    ids = gl.load(ids_ptr + s, mask=s < S, other=-1)
    kept = (ids >= 0) & (ids < G)
    expert = gl.where(kept, ids, -1).to(gl.int32)
    same = (gl.expand_dims(expert, 1) == gl.expand_dims(gl.convert_layout(expert, lanes), 0)) \
        & gl.expand_dims(kept, 1)
    before = gl.expand_dims(gl.arange(0, MAX_SLOTS, lanes), 0) < gl.expand_dims(s, 1)
    rank = gl.sum((same & before).to(gl.int32), 1)
    size = gl.sum(same.to(gl.int32), 1)
    units = gl.where(kept & (rank == 0), (size + BM - 1) // BM * chunks, 0)
    # (scans take a blocked layout, not a slice of one; Triton 3.6 has no gl.cumsum)
    ends = gl.associative_scan(
        gl.convert_layout(units, vector_layout(MAX_SLOTS, gl.num_warps())), 0, plus)
    return (gl.convert_layout(expert, lanes), gl.convert_layout(rank, lanes),
            gl.convert_layout(units, lanes), gl.convert_layout(ends, lanes))


@gluon.jit
def locate_unit(t, groups, chunks, BM: gl.constexpr, slot_layout: gl.constexpr):
    """kernels/experts_decode.py's locate_unit in Gluon (change them
    together): (g, slots [BM] and row_ok in slot_layout, h's chunk)."""
    layout: gl.constexpr = routing_layout(gl.num_warps())
    expert, rank, units, ends = groups
    here = (ends - units <= t) & (t < ends)
    g = gl.sum(gl.where(here, expert, 0), 0)
    local = t - gl.sum(gl.where(here, ends - units, 0), 0)
    ranks = (local // chunks) * BM + gl.arange(0, BM, gl.SliceLayout(1, layout))
    match = (gl.expand_dims(expert, 0) == g) & \
        (gl.expand_dims(rank, 0) == gl.expand_dims(ranks, 1))
    lanes = gl.expand_dims(gl.arange(0, MAX_SLOTS, gl.SliceLayout(0, layout)), 0)
    slots = gl.sum(gl.where(match, lanes, 0), 1)
    row_ok = gl.sum(match.to(gl.int32), 1) > 0
    return (g, gl.convert_layout(slots, slot_layout), gl.convert_layout(row_ok, slot_layout),
            local % chunks)


@gluon.jit
def load_unit(work, count, t, groups, SCALING: gl.constexpr, GLU: gl.constexpr,
              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The loader's steps of unit t (walk_units' visit); returns the ring
    count after them.  A slot's `ready` counts, besides the boxes' bytes,
    the tokens' rows: e4m3 rows copied by this partition's threads (a down
    step, with no rows, gets their arrivals from here), or (BLOCKWISE) the
    quantizer's one arrival."""
    descs, bufs, ready, empty, tokens, chunks, H = work
    w13_desc, w2_desc = descs
    boxes, w2_boxes, x_bufs = bufs
    x_ptr, _, k = tokens
    SUB: gl.constexpr = BK // SCALE_BLOCK
    rows_layout: gl.constexpr = gl.SliceLayout(
        1, gather_layout(BM, SCALE_BLOCK, gl.num_warps(), x_ptr.dtype.element_ty))
    g, slots, row_ok, column = locate_unit(t, groups, chunks, BM, rows_layout)
    # The TMA flavour's rules (csrc/run.cc): a 16-byte aligned base and row
    # stride, so each thread's elements are one 16-byte copy.
    rows = gl.expand_dims(gl.multiple_of(x_ptr + (slots // k).to(gl.int64) * H, 16), 1)
    row_ok = gl.expand_dims(row_ok, 1)
    first = column * CHUNK_COLUMNS
    SLOT_BYTES: gl.constexpr = 2 * CHUNK_COLUMNS * BK * boxes.dtype.primitive_bitwidth // 8
    for k0 in range(0, H, BK):
        slot, bar = claim_slot(ready, empty, count, SLOT_BYTES, STAGES)
        for sub in gl.static_range(SUB):
            kk = k0 + sub * SCALE_BLOCK
            if SCALING != BLOCKWISE:
                copy_rows(x_bufs.index(slot * SUB + sub), rows, row_ok, kk, H, bar, SCALE_BLOCK)
            for half in gl.static_range(2):
                buf = boxes.index((2 * slot + half) * SUB + sub)
                tma_load(w13_desc, w13_origin(g, half, first, kk, GLU), bar,
                         buf.reinterpret(w13_desc.dtype, w13_desc.block_shape, w13_desc.layout))
        count += 1
    for n0 in range(0, H, BN * SUB):
        slot, bar = claim_slot(ready, empty, count, SLOT_BYTES, STAGES)
        if SCALING != BLOCKWISE:
            mbarrier.arrive(bar, count=SUB * 32 * gl.num_warps())  # no rows to copy
        for part in gl.static_range(SUB):
            buf = w2_boxes.index(slot * SUB + part)
            tma_load(w2_desc, [g, n0 + part * BN, first], bar,
                     buf.reinterpret(w2_desc.dtype, w2_desc.block_shape, w2_desc.layout))
        count += 1
    return count


@gluon.jit
def token_blocks(rows, row_ok, cols, k0, H):
    """The tokens' two 128-column blocks from column k0 (16-bit, zeros past
    H or the rows), rows and row_ok [BM, 1] and cols [128] in their layout."""
    VECTOR: gl.constexpr = 8  # 16-byte loads
    first = gl.max_contiguous(gl.multiple_of(k0 + cols, VECTOR), VECTOR)
    second = gl.max_contiguous(gl.multiple_of(k0 + SCALE_BLOCK + cols, VECTOR), VECTOR)
    # H is a multiple of 16 bytes (the fp8 rules): whole vectors are in or out.
    first_ok = gl.expand_dims(gl.max_constancy(first < H, VECTOR), 0)
    second_ok = gl.expand_dims(gl.max_constancy(second < H, VECTOR), 0)
    return (gl.load(rows + gl.expand_dims(first, 0), mask=row_ok & first_ok, other=0.0),
            gl.load(rows + gl.expand_dims(second, 0), mask=row_ok & second_ok, other=0.0))


@gluon.jit
def quantize_unit(work, count, t, groups, SCALING: gl.constexpr, GLU: gl.constexpr,
                  BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  STAGES: gl.constexpr):
    """The quantizer's steps of unit t (walk_units' visit; BLOCKWISE): each
    up-projection step's two token blocks, loaded a step ahead, quantized
    into the slot once it is free (quantized_block), then one arrival on its
    `ready`; each down step's slot, once free, one arrival with no blocks.
    Returns the ring count after the unit."""
    gl.static_assert(BK == 2 * SCALE_BLOCK, "the quantizer takes two blocks a step")
    x_bufs, x_scales, ready, empty, tokens, chunks, H = work
    x_ptr, _, k = tokens
    layout: gl.constexpr = gather_layout(BM, SCALE_BLOCK, gl.num_warps(), x_ptr.dtype.element_ty)
    g, slots, row_ok, column = locate_unit(t, groups, chunks, BM, gl.SliceLayout(1, layout))
    rows = gl.expand_dims(gl.multiple_of(x_ptr + (slots // k).to(gl.int64) * H, 16), 1)
    row_ok = gl.expand_dims(row_ok, 1)
    cols = gl.arange(0, SCALE_BLOCK, gl.SliceLayout(0, layout))
    x0, x1 = token_blocks(rows, row_ok, cols, 0, H)
    for k0 in range(0, H, BK):
        next0, next1 = token_blocks(rows, row_ok, cols, k0 + BK, H)
        slot = count % STAGES
        mbarrier.wait(empty.index(slot), (count // STAGES & 1) ^ 1)
        quantized_block(x0, x_bufs.index(2 * slot), x_scales.index(2 * slot))
        quantized_block(x1, x_bufs.index(2 * slot + 1), x_scales.index(2 * slot + 1))
        fence_async_shared()  # the MMAs (the async proxy) read the blocks
        thread_barrier()  # every thread's blocks are written before the one arrival
        mbarrier.arrive(ready.index(slot))
        x0 = next0
        x1 = next1
        count += 1
    for _ in range(0, H, BN * 2):  # the down steps
        slot = count % STAGES
        mbarrier.wait(empty.index(slot), (count // STAGES & 1) ^ 1)
        mbarrier.arrive(ready.index(slot))
        count += 1
    return count


@gluon.jit
def walk_units(walk, visit: gl.constexpr, work, SCALING: gl.constexpr, GLU: gl.constexpr,
               BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """A partition's walk of its program's units, the same in both:
    count = visit(work, count, t, groups, the constexprs) for each of its
    units t of slot_groups' groups, the ring count from 0.  The constexprs
    are arguments of their own: in a tuple they would arrive as values."""
    ids_ptr, S, G, chunks = walk
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    count = 0
    for t in range(gl.program_id(0), gl.sum(groups[2], 0), gl.num_programs(0)):
        count = visit(work, count, t, groups, SCALING, GLU, BM, BN, BK, STAGES)


@gluon.jit
def quantized_block(xs, xq_buf, scale_buf):
    """Each token's 128 columns of xs [BM, 128] (16-bit) quantized by their
    amax into xq_buf (e4m3), the scales into scale_buf [BM]."""
    xs = xs.to(gl.float32)
    scale = gl.maximum(gl.max(gl.abs(xs), 1), AMAX_FLOOR) * E4M3_MAX_RECIPROCAL
    xq_buf.store(to_e4m3(xs, gl.expand_dims(scale, 1)))
    scale_buf.store(scale)


@gluon.jit
def up_projection(boxes, x_bufs, x_scales, ready, empty, count, w_scales, j_ok, H,
                  SCALING: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                  acc_layout: gl.constexpr):
    """(gate, up, ring count): the unit's gate and up products [128, BM], each
    row scaled by its weight scales and each column by its token's
    (BLOCKWISE: each 128-deep block by its own, x_scales'; else by the
    caller).  w_scales: the gate's and up's rows' first block scales."""
    BM: gl.constexpr = x_bufs.shape[1]
    SUB: gl.constexpr = BK // SCALE_BLOCK
    columns: gl.constexpr = gl.SliceLayout(0, acc_layout)
    gate = gl.zeros([CHUNK_COLUMNS, BM], gl.float32, acc_layout)
    up = gl.zeros([CHUNK_COLUMNS, BM], gl.float32, acc_layout)
    for k0 in range(0, H, BK):
        slot = count % STAGES
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        if SCALING != BLOCKWISE:
            fence_async_shared()  # the loader's threads wrote the tokens' rows
        for sub in gl.static_range(SUB):
            gate_box = boxes.index(2 * slot * SUB + sub)
            up_box = boxes.index((2 * slot + 1) * SUB + sub)
            if SCALING == BLOCKWISE:
                x = x_bufs.index(slot * SUB + sub).permute((1, 0))
                block = k0 // SCALE_BLOCK + sub
                live = block * SCALE_BLOCK < H
                gate_scale = gl.load(w_scales[0] + block, mask=j_ok & live, other=0.0)
                up_scale = gl.load(w_scales[1] + block, mask=j_ok & live, other=0.0)
                x_scale = gl.expand_dims(x_scales.index(slot * SUB + sub).load(columns), 0)
                gate_step = warpgroup_mma(gate_box, x, gate, use_acc=False, is_async=True)
                up_step = warpgroup_mma(up_box, x, up, use_acc=False, is_async=True)
                gate_step, up_step = warpgroup_mma_wait(0, deps=(gate_step, up_step))
                gate += gate_step * x_scale * gl.expand_dims(gate_scale, 1)
                up += up_step * x_scale * gl.expand_dims(up_scale, 1)
            else:
                x = x_bufs.index(slot * SUB + sub).permute((1, 0))
                gate = warpgroup_mma(gate_box, x, gate, is_async=True)
                up = warpgroup_mma(up_box, x, up, is_async=True)
        if SCALING != BLOCKWISE:
            gate, up = warpgroup_mma_wait(0, deps=(gate, up))
        mbarrier.arrive(empty.index(slot))
        count += 1
    return gate, up, count


@gluon.jit
def unit_h(gate, up, w13_scale_ptr, biases, g, first, inter, x_scale, SCALING: gl.constexpr,
           GLU: gl.constexpr):
    """(h [128, BM] in e4m3, its scales [BM]): the activation of the unit's
    gate and up (per-channel scales, with the tokens' x_scale, and b13
    applied here), each slot row's 128 columns one 1x128 block (columns past
    I are 0)."""
    b13_ptr, has_b13, activation = biases
    layout: gl.constexpr = gate.type.layout
    j = first + gl.arange(0, CHUNK_COLUMNS, gl.SliceLayout(1, layout))
    j_ok = j < inter
    g64 = g.to(gl.int64)
    gate_rows = w13_rows(j, 0, inter, GLU)
    up_rows = w13_rows(j, 1, inter, GLU)
    if SCALING != BLOCKWISE:
        x_scale = gl.expand_dims(x_scale, 0)
        channels = w13_scale_ptr + g64 * 2 * inter
        gate *= x_scale * gl.expand_dims(gl.load(channels + gate_rows, mask=j_ok, other=0.0), 1)
        up *= x_scale * gl.expand_dims(gl.load(channels + up_rows, mask=j_ok, other=0.0), 1)
    if has_b13 != 0:
        bias = b13_ptr + g64 * 2 * inter
        gate += gl.expand_dims(gl.load(bias + gate_rows, mask=j_ok, other=0.0).to(gl.float32), 1)
        up += gl.expand_dims(gl.load(bias + up_rows, mask=j_ok, other=0.0).to(gl.float32), 1)
    h = gl.where(gl.expand_dims(j_ok, 1), activate(gate, up, activation), 0.0)
    h_scale = gl.maximum(gl.max(gl.abs(h), 0), AMAX_FLOOR) * E4M3_MAX_RECIPROCAL
    return to_e4m3(h, gl.expand_dims(h_scale, 0)), h_scale


@gluon.jit
def store_part(acc, ns, row_scale, column_scale, b2, parts, row_ok, g64, column, H):
    """A box's part of the down projection: acc [BN, BM] (w2's rows ns times
    h) scaled, plus b2 (b2 = (b2_ptr, has_b2), chunk 0 only), stored at
    parts (the slot rows' part bases)."""
    b2_ptr, has_b2 = b2
    n_ok = ns < H
    part_sum = acc * column_scale * gl.expand_dims(row_scale, 1)
    if has_b2 != 0 and column == 0:
        bias = gl.load(b2_ptr + g64 * H + ns, mask=n_ok, other=0.0).to(gl.float32)
        part_sum += gl.expand_dims(bias, 1)
    gl.store(parts + gl.expand_dims(ns, 1), part_sum,
             mask=gl.expand_dims(n_ok, 1) & gl.expand_dims(row_ok, 0))


@gluon.jit
def down_projection(w2_boxes, h_buf, ready, empty, count, w2_scale_ptr, b2, h_scale, parts,
                    row_ok, g, column, chunks, H, SCALING: gl.constexpr, SUB: gl.constexpr,
                    STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """The ring count after the unit's down-projection steps: each step's
    two boxes of BN rows of w2's chunk times h (h_buf), each stored by
    store_part; the second box's MMA runs while the first's part is stored
    (docs/notes/2026-11-30-fp8-decode-tokens-quantized-beside-the-mmas.md)."""
    gl.static_assert(SUB == 2, "two boxes a step")
    BN: gl.constexpr = w2_boxes.shape[1]
    BM: gl.constexpr = h_buf.shape[1]
    g64 = g.to(gl.int64)
    acc = gl.zeros([BN, BM], gl.float32, acc_layout)
    column_scale = gl.expand_dims(h_scale, 0)
    h_blocks = (H + SCALE_BLOCK - 1) // SCALE_BLOCK
    rows = gl.arange(0, BN, gl.SliceLayout(1, acc_layout))
    for n0 in range(0, H, 2 * BN):
        slot = count % STAGES
        first_ns = n0 + rows
        second_ns = n0 + BN + rows
        if SCALING == BLOCKWISE:
            first_at = (g64 * h_blocks + first_ns // SCALE_BLOCK) * chunks + column
            second_at = (g64 * h_blocks + second_ns // SCALE_BLOCK) * chunks + column
        else:
            first_at = g64 * H + first_ns
            second_at = g64 * H + second_ns
        first_scale = gl.load(w2_scale_ptr + first_at, mask=first_ns < H, other=0.0)
        second_scale = gl.load(w2_scale_ptr + second_at, mask=second_ns < H, other=0.0)
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        first = warpgroup_mma(w2_boxes.index(2 * slot), h_buf, acc, use_acc=False, is_async=True)
        second = warpgroup_mma(w2_boxes.index(2 * slot + 1), h_buf, acc, use_acc=False,
                               is_async=True)
        first = warpgroup_mma_wait(1, deps=(first, ))
        store_part(first, first_ns, first_scale, column_scale, b2, parts, row_ok, g64, column, H)
        second = warpgroup_mma_wait(0, deps=(second, ))
        store_part(second, second_ns, second_scale, column_scale, b2, parts, row_ok, g64, column,
                   H)
        mbarrier.arrive(empty.index(slot))
        count += 1
    return count


@gluon.jit
def run_unit(work, count, t, groups, SCALING: gl.constexpr, GLU: gl.constexpr,
             BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The MMA partition's work of unit t (walk_units' visit); returns the
    ring count after it."""
    bufs, ready, empty, scales, biases, tokens, parts_ptr, chunks, H, inter = work
    boxes, w2_boxes, x_bufs, x_scales, h_buf = bufs
    w13_scale_ptr, w2_scale_ptr = scales
    b13_ptr, has_b13, b2_ptr, has_b2, activation = biases
    _, x_scale_ptr, k = tokens
    acc_layout: gl.constexpr = accumulator_layout(BM, gl.num_warps(), 8)
    g, slots, row_ok, column = locate_unit(t, groups, chunks, BM, gl.SliceLayout(0, acc_layout))
    x_scale = 1.0  # BLOCKWISE scales each block's product as it comes
    if SCALING != BLOCKWISE:
        x_scale = gl.load(x_scale_ptr + slots // k, mask=row_ok, other=0.0)
    first = column * CHUNK_COLUMNS
    j = first + gl.arange(0, CHUNK_COLUMNS, gl.SliceLayout(1, acc_layout))
    j_ok = j < inter
    k_blocks = (H + SCALE_BLOCK - 1) // SCALE_BLOCK
    row_blocks = g.to(gl.int64) * ((2 * inter + SCALE_BLOCK - 1) // SCALE_BLOCK)
    w_scales = (w13_scale_ptr + (row_blocks + w13_rows(j, 0, inter, GLU) // SCALE_BLOCK) * k_blocks,
                w13_scale_ptr + (row_blocks + w13_rows(j, 1, inter, GLU) // SCALE_BLOCK) * k_blocks)
    gate, up, count = up_projection(boxes, x_bufs, x_scales, ready, empty, count, w_scales,
                                    j_ok, H, SCALING, BK, STAGES, acc_layout)
    h, h_scale = unit_h(gate, up, w13_scale_ptr, (b13_ptr, has_b13, activation), g, first, inter,
                        x_scale, SCALING, GLU)
    h_buf.store(h)  # the last unit's down projection has read it (its MMAs were waited for)
    fence_async_shared()
    parts = gl.expand_dims(parts_ptr + (slots.to(gl.int64) * chunks + column) * H, 0)
    return down_projection(w2_boxes, h_buf, ready, empty, count, w2_scale_ptr, (b2_ptr, has_b2),
                           h_scale, parts, row_ok, g, column, chunks, H, SCALING,
                           BK // SCALE_BLOCK, STAGES, acc_layout)


@gluon.jit
def mma_partition(walk, work, SCALING: gl.constexpr, GLU: gl.constexpr, BM: gl.constexpr,
                  BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The MMA warpgroup: run_unit on each of the program's units (a function
    passed through warp_specialize is more than Triton 3.6 takes)."""
    walk_units(walk, run_unit, work, SCALING, GLU, BM, BN, BK, STAGES)


@gluon.jit
def load_partition(walk, work, SCALING: gl.constexpr, GLU: gl.constexpr, BM: gl.constexpr,
                   BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The loader: load_unit on each of the program's units."""
    walk_units(walk, load_unit, work, SCALING, GLU, BM, BN, BK, STAGES)


@gluon.jit
def quantize_partition(walk, work, SCALING: gl.constexpr, GLU: gl.constexpr, BM: gl.constexpr,
                       BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The quantizer (BLOCKWISE): quantize_unit on each of the program's units."""
    walk_units(walk, quantize_unit, work, SCALING, GLU, BM, BN, BK, STAGES)


@gluon.jit
def weight_descriptors(w13_ptr, w2_ptr, G, inter, H, w13_group_stride, ld13, w2_group_stride,
                       ld2, GLU: gl.constexpr, BN: gl.constexpr):
    """The TMA descriptors of w13's 128-row boxes and w2's BN-row boxes."""
    dtype: gl.constexpr = w13_ptr.dtype.element_ty
    # w13 seen as [G, half, I, H] (CONCATENATED) or [G, I, half, H]
    # (INTERLEAVED): a box of 128 gate (half 0) or up (half 1) rows either way.
    if GLU == CONCATENATED:
        block: gl.constexpr = [1, 1, CHUNK_COLUMNS, SCALE_BLOCK]
        w13_desc = tma.make_tensor_descriptor(
            w13_ptr, [G, 2, inter, H], [w13_group_stride, inter * ld13, ld13, 1], block,
            shared_layout(block, dtype))
    else:
        block: gl.constexpr = [1, CHUNK_COLUMNS, 1, SCALE_BLOCK]
        w13_desc = tma.make_tensor_descriptor(
            w13_ptr, [G, inter, 2, H], [w13_group_stride, 2 * ld13, ld13, 1], block,
            shared_layout(block, dtype))
    w2_block: gl.constexpr = [1, BN, CHUNK_COLUMNS]
    w2_desc = tma.make_tensor_descriptor(
        w2_ptr, [G, H, inter], [w2_group_stride, ld2, 1], w2_block, shared_layout(w2_block, dtype))
    return w13_desc, w2_desc


@gluon.jit
def ring(dtype: gl.constexpr, SCALING: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
         BK: gl.constexpr, STAGES: gl.constexpr):
    """((boxes, w2_boxes, x_bufs, x_scales, h_buf), ready, empty): the ring's
    shared memory and its barriers, initialised.  A slot: SUB x BN weight
    rows of 128 bytes (boxes: BK / 128 blocks of the gate's 128 rows, then as
    many of the up's; w2_boxes: SUB of BN w2 rows) and the tokens' BM rows of
    each block in e4m3 (x_bufs: copied, or BLOCKWISE quantized, their scales
    in x_scales); h_buf: a unit's h."""
    SUB: gl.constexpr = BK // SCALE_BLOCK
    box: gl.constexpr = [CHUNK_COLUMNS, SCALE_BLOCK]
    boxes = gl.allocate_shared_memory(dtype, [STAGES * 2 * SUB] + box, shared_layout(box, dtype))
    w2_boxes = boxes.reinterpret(dtype, [STAGES * SUB, BN, SCALE_BLOCK],
                                 shared_layout([BN, SCALE_BLOCK], dtype))
    x_bufs = gl.allocate_shared_memory(dtype, [STAGES * SUB, BM, SCALE_BLOCK],
                                       shared_layout([BM, SCALE_BLOCK], dtype))
    x_scales = gl.allocate_shared_memory(gl.float32, [STAGES * SUB, BM],
                                         gl.SwizzledSharedLayout(1, 1, 1, [0]))
    h_buf = gl.allocate_shared_memory(dtype, [CHUNK_COLUMNS, BM], transposed_shared(dtype))
    # A slot is `ready` when its boxes have landed and its tokens' rows are
    # in e4m3: the copiers' arrivals, or (BLOCKWISE) the quantizer's one (a
    # down step's too).
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        if SCALING == BLOCKWISE:
            mbarrier.init(ready.index(i), count=2)
        else:
            mbarrier.init(ready.index(i), count=1 + SUB * 32 * GATHER_WARPS)
        mbarrier.init(empty.index(i), count=1)
    return (boxes, w2_boxes, x_bufs, x_scales, h_buf), ready, empty


@gluon.jit
def scaled_experts_decode_ws_kernel(x_ptr, xq_ptr, x_scale_ptr, ids_ptr, k, w13_ptr,
                                    w13_scale_ptr, w2_ptr,
                                    w2_scale_ptr, b13_ptr, has_b13, b2_ptr, has_b2, activation,
                                    parts_ptr, S, H, N, G, w13_group_stride, ld13,
                                    w2_group_stride, ld2, SCALING: gl.constexpr,
                                    GLU: gl.constexpr, USE_TMA: gl.constexpr, BM: gl.constexpr,
                                    BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                                    PRECISION: gl.constexpr, STAGES: gl.constexpr):
    """scaled_experts_decode_kernel's contract; USE_TMA, CHUNK and PRECISION
    are taken for the common signature; STAGES: the ring's slots."""
    gl.static_assert(USE_TMA, "the warp-specialised kernel is TMA-only")
    gl.static_assert(BK % SCALE_BLOCK == 0, "a K step of whole scale blocks")
    gl.static_assert(BN == 2 * CHUNK_COLUMNS, "a box of w2 as large as a block's gate and up rows")
    dtype: gl.constexpr = w13_ptr.dtype.element_ty
    # The tokens' rows: 16-bit, quantized here (BLOCKWISE), or e4m3.
    if SCALING == BLOCKWISE:
        rows_ptr = x_ptr
    else:
        rows_ptr = xq_ptr
    inter = N // 2
    chunks = (inter + CHUNK_COLUMNS - 1) // CHUNK_COLUMNS
    w13_desc, w2_desc = weight_descriptors(w13_ptr, w2_ptr, G, inter, H, w13_group_stride, ld13,
                                           w2_group_stride, ld2, GLU, BN)
    bufs, ready, empty = ring(dtype, SCALING, BM, BN, BK, STAGES)
    boxes, w2_boxes, x_bufs, x_scales, h_buf = bufs
    walk = (ids_ptr, S, G, chunks)
    tokens = (rows_ptr, x_scale_ptr, k)
    mma_work = (bufs, ready, empty, (w13_scale_ptr, w2_scale_ptr),
                (b13_ptr, has_b13, b2_ptr, has_b2, activation), tokens, parts_ptr, chunks, H, inter)
    load_work = ((w13_desc, w2_desc), (boxes, w2_boxes, x_bufs), ready, empty, tokens, chunks,
                 H)
    if SCALING == BLOCKWISE:
        quantize_work = (x_bufs, x_scales, ready, empty, tokens, chunks, H)
        gl.warp_specialize(
            [(mma_partition, (walk, mma_work, SCALING, GLU, BM, BN, BK, STAGES)),
             (load_partition, (walk, load_work, SCALING, GLU, BM, BN, BK, STAGES)),
             (quantize_partition, (walk, quantize_work, SCALING, GLU, BM, BN, BK, STAGES))],
            [GATHER_WARPS, QUANTIZER_WARPS], [LOADER_REGISTERS, QUANTIZER_REGISTERS])
    else:
        gl.warp_specialize(
            [(mma_partition, (walk, mma_work, SCALING, GLU, BM, BN, BK, STAGES)),
             (load_partition, (walk, load_work, SCALING, GLU, BM, BN, BK, STAGES))],
            [GATHER_WARPS], [LOADER_REGISTERS])
