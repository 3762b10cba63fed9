"""W4A8 at decode with the packed weights in a TMA ring: lab/w4a8_probe.py's
warp-specialised register-A kernel (GROUPED, REPLICATED), whose MMA
partitions load each step's packed words from global memory one step ahead
(one step of bytes in flight a warpgroup: a third of the 4-bit bound at
decode, lab/w4a8_experts_probe.py), here fed by its loader warp: the tokens'
block, the weights' packed words and their groups' shifts of each step
TMA'd into a ring of STAGES slots, the MMA partitions reading their words
from shared memory into the fragment's registers (ld.shared, 16 bytes a
thread a row) and widening them there.

The shifts are read transposed ([G, K / 32, N]: a step's 4 groups of 128
rows are one TMA box), a layout a load-time conversion would make.

w4a8_ring_kernel has w4a8_ragged_kernel's contract, but for d_t.
lab/w4a8_experts_probe.py runs it (--ring-configs)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from aot.kernels.gluon_api import tma_load
from lab.w4a8_probe import BK, grouped_words_layout, store_scaled, widened_grouped


@gluon.constexpr_function
def flat_words_layout(warps):
    """grouped_words_layout as [16 x warps, 16] (word 4 group + j): each
    thread's 16 bytes of a row contiguous, for ld.shared.v4."""
    return gl.DistributedLinearLayout([[0, 1], [0, 2], [8, 0]],
                                      [[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
                                      [[16 * 2 ** i, 0] for i in range(warps.bit_length() - 1)],
                                      [], [16 * warps, 16])


@gluon.constexpr_function
def shifts_transposed_layout(warps):
    """The layout of a part's shifts [4 groups, 16 x warps rows] whose
    transpose is grouped_words_layout's shifts' (SliceLayout(2, W3)): a
    thread's groups and rows those of its words, no data moved."""
    return gl.DistributedLinearLayout([[0, 0], [0, 0], [0, 8]],
                                      [[1, 0], [2, 0], [0, 1], [0, 2], [0, 4]],
                                      [[0, 16 * 2 ** i] for i in range(warps.bit_length() - 1)],
                                      [], [4, 16 * warps])


@gluon.jit
def ring_mma(part: gl.constexpr, x_bufs, w_bufs, d_bufs, ready, empty, out_ptr, w_scale_ptr,
             x_scale_ptr, d_ptr, N, T, K, off_n, off_t, BT: gl.constexpr, STAGES: gl.constexpr,
             D_GLOBAL: gl.constexpr):
    """One warpgroup's 64 weight rows: each step's words and shifts from the
    ring, widened, multiplied, the slot freed once the MMA is done.
    D_GLOBAL: the shifts from d [N, K / 32] (the expert's) in global memory,
    loaded a step ahead, instead of the ring's transposed box."""
    warps: gl.constexpr = gl.num_warps()
    ROWS: gl.constexpr = 16 * warps
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                                  instr_shape=[16, BT, 32])
    A_L: gl.constexpr = gl.DotOperandLayout(0, ACC, 4)
    W3: gl.constexpr = grouped_words_layout(warps)
    W2: gl.constexpr = flat_words_layout(warps)
    D_L: gl.constexpr = gl.SliceLayout(2, W3)
    D_T: gl.constexpr = shifts_transposed_layout(warps)
    acc = gl.zeros([ROWS, BT], gl.float32, ACC)
    rows = off_n + part * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, D_L))
    groups = gl.arange(0, 4, gl.SliceLayout(0, D_L))
    d_at = d_ptr + gl.expand_dims(rows, 1).to(gl.int64) * (K // 32) + gl.expand_dims(groups, 0)
    d_ok = gl.expand_dims(rows < N, 1)
    next_d = gl.load(d_at, mask=d_ok & gl.expand_dims(groups < K // 32, 0), other=0)
    for s in range(gl.cdiv(K, BK)):
        slot = s % STAGES
        if D_GLOBAL:
            d = next_d
            in_k = gl.expand_dims(4 * (s + 1) + groups < K // 32, 0)
            next_d = gl.load(d_at + 4 * (s + 1), mask=d_ok & in_k, other=0)
        mbarrier.wait(ready.index(slot), s // STAGES & 1)
        flat = w_bufs.index(slot).slice(part * ROWS, ROWS).load(W2)
        words = gl.convert_layout(gl.reshape(flat, [ROWS, 4, 4]), W3, assert_trivial=True)
        if not D_GLOBAL:
            # The part's own [4, 64] box, turned in registers (a permuted or
            # column-sliced view of the ring's box loaded wrong values).
            d_t = d_bufs.index(slot).slice(4 * part, 4).load(D_T)
            d = gl.convert_layout(gl.permute(d_t, (1, 0)), D_L, assert_trivial=True)
        a = widened_grouped(words, d.to(gl.int32), A_L, True)
        acc = warpgroup_mma(a, x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index(slot))
    store_scaled(acc, out_ptr, w_scale_ptr, x_scale_ptr, off_n + part * ROWS, off_t, N, T)


@gluon.jit
def ring_loader(x_desc, w_desc, d_desc, x_bufs, w_bufs, d_bufs, ready, empty, off_t, w_row,
                d_row, off_n, K, BT: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr,
                D_RING: gl.constexpr = True):
    """Each step's tokens, words and (D_RING) shifts into the ring, a slot
    once every MMA partition has freed it."""
    for s in range(gl.cdiv(K, BK)):
        slot = s % STAGES
        mbarrier.wait(empty.index(slot), (s // STAGES & 1) ^ 1)
        mbarrier.expect(ready.index(slot), BT * BK + ROWS * (BK // 2) + 4 * ROWS * D_RING)
        tma_load(x_desc, [off_t, s * BK], ready.index(slot), x_bufs.index(slot))
        tma_load(w_desc, [w_row, s * (BK // 8)], ready.index(slot), w_bufs.index(slot))
        if D_RING:
            for p in gl.static_range(ROWS // 64):
                tma_load(d_desc, [d_row + 4 * s, off_n + 64 * p], ready.index(slot),
                         d_bufs.index(slot).slice(4 * p, 4))


@gluon.jit
def step_mma(part: gl.constexpr, x_bufs, w_bufs, ready, empty, out_ptr, e_ptr, x_scale_ptr, N,
             T, K, off_n, off_t, BT: gl.constexpr, STAGES: gl.constexpr):
    """ring_mma's step from the checkpoint's own scales: e [N, K / 32] the
    expert's e8m0 exponents, loaded two steps ahead; each step's shifts below
    the row's largest of the step's four groups (a quad's shuffles), the
    step's product scaled by that row's 2^(largest - 133) and the tokens'
    1 x 128 scales x_scale [T, cdiv(K, 128)] before it is added.  (Groups
    more than 14 binades below the step's largest, and exponent 0, are not
    handled: the probe's scales span 8.)"""
    warps: gl.constexpr = gl.num_warps()
    ROWS: gl.constexpr = 16 * warps
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                                  instr_shape=[16, BT, 32])
    A_L: gl.constexpr = gl.DotOperandLayout(0, ACC, 4)
    W3: gl.constexpr = grouped_words_layout(warps)
    W2: gl.constexpr = flat_words_layout(warps)
    D_L: gl.constexpr = gl.SliceLayout(2, W3)
    acc = gl.zeros([ROWS, BT], gl.float32, ACC)
    rows = off_n + part * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, D_L))
    groups = gl.arange(0, 4, gl.SliceLayout(0, D_L))
    e_at = e_ptr + gl.expand_dims(rows, 1).to(gl.int64) * (K // 32) + gl.expand_dims(groups, 0)
    e_ok = gl.expand_dims(rows < N, 1)
    tokens = off_t + gl.arange(0, BT, gl.SliceLayout(0, ACC))
    xs_at = x_scale_ptr + tokens.to(gl.int64) * gl.cdiv(K, BK)
    xs_ok = tokens < T
    steps = gl.cdiv(K, BK)
    e_next = gl.load(e_at, mask=e_ok & gl.expand_dims(groups < K // 32, 0), other=0)
    e_after = gl.load(e_at + 4, mask=e_ok & gl.expand_dims(4 + groups < K // 32, 0), other=0)
    for s in range(steps):
        slot = s % STAGES
        e = e_next.to(gl.int32)
        e_next = e_after
        in_k = gl.expand_dims(4 * (s + 2) + groups < K // 32, 0)
        e_after = gl.load(e_at + 4 * (s + 2), mask=e_ok & in_k, other=0)
        xs = gl.load(xs_at + s, mask=xs_ok, other=0.0)
        largest = gl.max(e, 1)
        d = gl.expand_dims(largest, 1) - e
        row_scale = gl.convert_layout((largest << 23).to(gl.float32, bitcast=True) * 0.015625,
                                      gl.SliceLayout(1, ACC))
        mbarrier.wait(ready.index(slot), s // STAGES & 1)
        flat = w_bufs.index(slot).slice(part * ROWS, ROWS).load(W2)
        words = gl.convert_layout(gl.reshape(flat, [ROWS, 4, 4]), W3, assert_trivial=True)
        a = widened_grouped(words, d, A_L, True)
        part_acc = warpgroup_mma(a, x_bufs.index(slot).permute((1, 0)), acc, use_acc=False,
                                 is_async=True)
        part_acc = warpgroup_mma_wait(0, deps=(part_acc, ))
        mbarrier.arrive(empty.index(slot))
        acc += part_acc * gl.expand_dims(row_scale, 1) * gl.expand_dims(xs, 0)
    n = off_n + part * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, ACC))
    at = out_ptr + gl.expand_dims(tokens, 0).to(gl.int64) * N + gl.expand_dims(n, 1)
    gl.store(at, acc.to(gl.bfloat16), mask=gl.expand_dims(n < N, 1) & gl.expand_dims(xs_ok, 0))


@gluon.jit
def w4a8_ring_kernel(w_ptr, d_ptr, d_t_ptr, x_ptr, out_ptr, w_scale_ptr, x_scale_ptr,
                     tiles_ptr, ends_ptr, N, T, K, G, BT: gl.constexpr, STAGES: gl.constexpr,
                     PARTS: gl.constexpr, D_GLOBAL: gl.constexpr, REGISTERS: gl.constexpr):
    """w4a8_ragged_kernel's products (GROUPED, REPLICATED) with d_t [G, K / 32, N]
    the shifts transposed (D_GLOBAL: d [G, N, K / 32] read instead); K a
    multiple of 32, N of 16; REGISTERS a thread of the MMA partitions."""
    ROWS: gl.constexpr = 64 * PARTS
    tile = gl.program_id(1)
    g = gl.load(tiles_ptr + 2 * tile)
    off_t = gl.load(tiles_ptr + 2 * tile + 1)
    end = gl.load(ends_ptr + g)
    off_n = gl.program_id(0) * ROWS
    KX = gl.cdiv(K, BK) * BK
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BK], gl.float8e4nv)
    x_desc = tma.make_tensor_descriptor(x_ptr, [T, KX], [KX, 1], [BT, BK], x_layout)
    w_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32,
                                                  rank=2)
    w_desc = tma.make_tensor_descriptor(w_ptr.to(gl.pointer_type(gl.int32)), [G * N, K // 8],
                                        [K // 8, 1], [ROWS, BK // 8], w_layout)
    d_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8,
                                                  rank=2)
    d_desc = tma.make_tensor_descriptor(d_t_ptr, [G * (K // 32), N], [N, 1], [4, 64], d_layout)
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BT, BK], x_layout)
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, ROWS, BK // 8], w_layout)
    d_bufs = gl.allocate_shared_memory(gl.uint8, [STAGES, 4 * PARTS, 64], d_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=PARTS)
    expert = g.to(gl.int64)
    gl.warp_specialize(
        [(ring_mma, (p, x_bufs, w_bufs, d_bufs, ready, empty, out_ptr, w_scale_ptr + expert * N,
                     x_scale_ptr, d_ptr + expert * N * (K // 32), N, end, K, off_n, off_t, BT,
                     STAGES, D_GLOBAL))
         if p < PARTS else
         (ring_loader, (x_desc, w_desc, d_desc, x_bufs, w_bufs, d_bufs, ready, empty, off_t,
                        g * N + off_n, g * (K // 32), off_n, K, BT, STAGES, ROWS))
         for p in ((0, 1, 2) if PARTS == 2 else (0, 1, 2, 3) if PARTS == 3 else (0, 1, 2, 3, 4))],
        [4] * (PARTS - 1) + [1], [REGISTERS] * (PARTS - 1) + [40])


@gluon.jit
def w4a8_step_kernel(w_ptr, e_ptr, x_ptr, out_ptr, x_scale_ptr, tiles_ptr, ends_ptr, N, T, K, G,
                     BT: gl.constexpr, STAGES: gl.constexpr, PARTS: gl.constexpr,
                     REGISTERS: gl.constexpr):
    """w4a8_ring_kernel's products from the checkpoint's MXFP4 as it is (w
    [G, N, K / 2], e [G, N, K / 32] e8m0) and x fp8 in 1 x 128 blocks (scales
    [T, cdiv(K, 128)]), its K in grouped slot order: step_mma's scaling."""
    ROWS: gl.constexpr = 64 * PARTS
    tile = gl.program_id(1)
    g = gl.load(tiles_ptr + 2 * tile)
    off_t = gl.load(tiles_ptr + 2 * tile + 1)
    end = gl.load(ends_ptr + g)
    off_n = gl.program_id(0) * ROWS
    KX = gl.cdiv(K, BK) * BK
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BK], gl.float8e4nv)
    x_desc = tma.make_tensor_descriptor(x_ptr, [T, KX], [KX, 1], [BT, BK], x_layout)
    w_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32,
                                                  rank=2)
    w_desc = tma.make_tensor_descriptor(w_ptr.to(gl.pointer_type(gl.int32)), [G * N, K // 8],
                                        [K // 8, 1], [ROWS, BK // 8], w_layout)
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BT, BK], x_layout)
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, ROWS, BK // 8], w_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=PARTS)
    expert = g.to(gl.int64)
    gl.warp_specialize(
        [(step_mma, (p, x_bufs, w_bufs, ready, empty, out_ptr,
                     e_ptr + expert * N * (K // 32), x_scale_ptr, N, end, K, off_n, off_t, BT,
                     STAGES))
         if p < PARTS else
         (ring_loader, (x_desc, w_desc, w_desc, x_bufs, w_bufs, w_bufs, ready, empty, off_t,
                        g * N + off_n, 0, off_n, K, BT, STAGES, ROWS, False))
         for p in ((0, 1, 2) if PARTS == 2 else (0, 1, 2, 3) if PARTS == 3 else (0, 1, 2, 3, 4))],
        [4] * (PARTS - 1) + [1], [REGISTERS] * (PARTS - 1) + [40])
