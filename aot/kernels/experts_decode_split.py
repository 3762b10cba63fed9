"""moe_experts' fp8 forward for a few slots with H spread over programs, the
scaled_decode_split family: one launch whose programs take tickets, in
order, from a counter:

    up (ticket < units x splits), unit u = slot x chunk of h's 128 columns,
        split p: gu[p, u] = the slot's expert's gate and up rows of the
        chunk over p's part of H (its K) times q(x[token]), float32 [256];
        the unit's last part to arrive sums its parts in split order,
        applies b13 and the activation, and writes h[u] quantized per 128
        columns (e4m3 [128] and its scale);
    down (the next T x cdiv(H, BN) tickets), a token's BN rows of H, once
        every unit's h is written: out[token, rows] = sum over the token's
        slots j and chunks c of weights[j] * (w2[g_j][rows, c] @ h[j, c]
        + b2[g_j][rows] in chunk 0).

Why: at decode a call has few units (DeepSeek-V3's tensor-parallel shards,
I = 128 or 256, have a token's k), and one unit a program leaves most SMs
idle while k of them read every weight byte; here a unit's bytes are read
by `splits` programs and the down projection's by every program, in one
launch with no routing of slots into groups (a slot is a unit; two slots of
one expert read its weights twice, rare at a few tokens) and no combine of
parts.  A ticket waits only on tickets handed out before it, which running
programs hold, so no assumption is made about which programs are resident:
the grid may be any size (gg_runtime.sm_limit).

The quantities are the one-kernel forward's (kernels/experts_decode.py: x
quantized per token per 128 columns, or given per token; h per slot per
128 columns; each block's product scaled as SCALING says): only the order
of the sums over H and over the slots differs.

counters [2 + units] int32, zeroed before the launch: [0] the next ticket,
[1] the units whose h is written, [2 + u] unit u's parts written.  gu
[splits, units, 256] float32, h [units, 128] e4m3, h_scale [units] float32
are scratch.  BM: the MMAs' N (one slot's row used); BN: H's rows a down
ticket; BK: 128, a K step and the scales' block; CHUNK, PRECISION unused.
"""
import triton
import triton.language as tl

from .experts_decode import CHUNK_COLUMNS, w13_descriptor, w13_rows
from .glu import CONCATENATED, act
from .quantize import scale_of, to_e4m3
from .scaled import BLOCKWISE, SCALE_BLOCK

GU_COLUMNS = tl.constexpr(2 * CHUNK_COLUMNS.value)  # a unit's gate then up sums in gu
# A down step's w2 tile: this many rows of one chunk (128 bytes each), BN
# rows of H for each of DOWN_ROWS // BN (slot, chunk) pairs.
DOWN_ROWS = tl.constexpr(256)


@triton.jit
def scaled_decode_split_kernel(x_ptr, xq_ptr, x_scale_ptr, ids_ptr, weights_ptr, k, w13_ptr,
                               w13_scale_ptr, w2_ptr, w2_scale_ptr, b13_ptr, has_b13, b2_ptr,
                               has_b2, activation, gu_ptr, h_ptr, h_scale_ptr, counters_ptr,
                               out_ptr, T, H, N, G, splits, w13_group_stride, ld13,
                               w2_group_stride, ld2, SCALING: tl.constexpr, GLU: tl.constexpr,
                               USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                               BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """x, xq, x_scale, ids, w13, w2, their scales, b13, b2 and activation as
    scaled_experts_decode_kernel's; weights [T * k] float32 (the slots'
    routing weights); out [T, H] 16-bit; the scratch and counters as the
    module says."""
    tl.static_assert(BK == SCALE_BLOCK, "one K step a scale block")
    # The operator's rules (csrc/ops/expert_products_fp8.cc): H, I and the
    # weights' strides multiples of 16, so that w2's rows load in vectors.
    H = tl.multiple_of(H, 16)
    inter = tl.multiple_of(N // 2, 16)
    w2_group_stride = tl.multiple_of(w2_group_stride, 16)
    ld2 = tl.multiple_of(ld2, 16)
    # Made first: its write and fence overlap the first ticket's round trip.
    w13_desc = w13_descriptor(w13_ptr, G, inter, H, w13_group_stride, ld13, GLU, BK)
    units = T * k * tl.cdiv(inter, CHUNK_COLUMNS)
    up_tickets = units * splits
    tickets = up_tickets + T * tl.cdiv(H, BN)
    biases = (b13_ptr, has_b13, b2_ptr, has_b2, activation)
    ticket = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
    while ticket < tickets:
        if ticket < up_tickets:
            up_part(ticket, (x_ptr, xq_ptr, x_scale_ptr, ids_ptr, k), (w13_desc, w13_scale_ptr),
                    biases, (gu_ptr, h_ptr, h_scale_ptr, counters_ptr), H, N, G, splits, units,
                    SCALING, GLU, BM, BK)
        else:
            down_rows(ticket - up_tickets, (ids_ptr, weights_ptr, k), (w2_ptr, w2_scale_ptr),
                      biases, (h_ptr, h_scale_ptr, counters_ptr), out_ptr, H, inter, G,
                      w2_group_stride, ld2, units, SCALING, BN)
        ticket = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")


@triton.jit
def up_part(ticket, tokens, w13, biases, scratch, H, N, G, splits, units,
            SCALING: tl.constexpr, GLU: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """Up ticket: unit ticket // splits' part ticket % splits of gu, then its
    arrival; the unit's last arrival writes its h."""
    x_ptr, xq_ptr, x_scale_ptr, ids_ptr, k = tokens
    w13_desc, w13_scale_ptr = w13
    gu_ptr, h_ptr, h_scale_ptr, counters_ptr = scratch
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    unit = ticket // splits
    split = ticket % splits
    slot = unit // chunks
    column = unit % chunks
    expert = tl.load(ids_ptr + slot)
    kept = (expert >= 0) & (expert < G)
    g = tl.where(kept, expert, 0).to(tl.int32)
    j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
    per_split = tl.cdiv(tl.cdiv(H, BK), splits) * BK
    k_lo = split * per_split
    part = gu_ptr + (split * units + unit).to(tl.int64) * GU_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
    if kept:
        token = (slot // k).to(tl.int64)
        gate, up = gate_up_sums((w13_desc, w13_scale_ptr, g, column * CHUNK_COLUMNS, inter),
                                (x_ptr, xq_ptr, x_scale_ptr, token),
                                (k_lo, tl.minimum(k_lo + per_split, H), H), SCALING, GLU, BM, BK)
        tl.store(part, gate)
        tl.store(part + CHUNK_COLUMNS, up)
    tl.debug_barrier()  # every thread's stores before the arrival's release
    arrived = tl.atomic_add(counters_ptr + 2 + unit, 1, sem="acq_rel", scope="gpu")
    if arrived == splits - 1:
        if kept:
            write_h(gu_ptr + unit.to(tl.int64) * GU_COLUMNS, units, splits, biases, g, j,
                    inter, GLU, h_ptr + unit.to(tl.int64) * CHUNK_COLUMNS, h_scale_ptr + unit)
        tl.debug_barrier()
        tl.atomic_add(counters_ptr + 1, 1, sem="release", scope="gpu")


@triton.jit
def gate_up_sums(w13, x, k_range, SCALING: tl.constexpr, GLU: tl.constexpr, BM: tl.constexpr,
                 BK: tl.constexpr):
    """(gate, up) [128] float32: w13[g]'s gate and up rows of h's columns
    first .. first + 128 (w13 = (descriptor, scale_ptr, g, first, I)) times
    the token's row over K's k_lo .. k_hi, both in one K loop, scaled as
    experts_decode.w13_product scales them.  The token is the MMAs' only
    used column of BM."""
    desc, scale_ptr, g, first, inter = w13
    x_ptr, xq_ptr, x_scale_ptr, token = x
    k_lo, k_hi, K = k_range
    g64 = g.to(tl.int64)
    j = first + tl.arange(0, CHUNK_COLUMNS)
    j_ok = j < inter
    gate_rows = w13_rows(j, 0, inter, GLU)
    up_rows = w13_rows(j, 1, inter, GLU)
    ks = tl.arange(0, BK)
    the_token = (tl.arange(0, BM) == 0)[:, None]
    gate = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
    up = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
    if SCALING == BLOCKWISE:
        block_row = g64 * tl.cdiv(2 * inter, SCALE_BLOCK)
        gate_scales = scale_ptr + (block_row + gate_rows // SCALE_BLOCK) * tl.cdiv(K, SCALE_BLOCK)
        up_scales = scale_ptr + (block_row + up_rows // SCALE_BLOCK) * tl.cdiv(K, SCALE_BLOCK)
    for k0 in range(k_lo, k_hi, BK):
        at = (k0 + ks)[None, :] + tl.zeros((BM, 1), dtype=tl.int32)
        row_mask = the_token & (at < k_hi)
        if GLU == CONCATENATED:
            w_gate = desc.load([g, 0, first, k0]).reshape(CHUNK_COLUMNS, BK)
            w_up = desc.load([g, 1, first, k0]).reshape(CHUNK_COLUMNS, BK)
        else:
            w_gate = desc.load([g, first, 0, k0]).reshape(CHUNK_COLUMNS, BK)
            w_up = desc.load([g, first, 1, k0]).reshape(CHUNK_COLUMNS, BK)
        if SCALING == BLOCKWISE:
            xs = tl.load(x_ptr + token * K + at, mask=row_mask, other=0.0).to(tl.float32)
            x_scale = scale_of(tl.max(tl.abs(xs), axis=1))
            xq = to_e4m3(xs, x_scale[:, None]).T
            gate_scale = tl.load(gate_scales + k0 // SCALE_BLOCK, mask=j_ok, other=0.0)
            up_scale = tl.load(up_scales + k0 // SCALE_BLOCK, mask=j_ok, other=0.0)
            gate += tl.dot(w_gate, xq) * x_scale[None, :] * gate_scale[:, None]
            up += tl.dot(w_up, xq) * x_scale[None, :] * up_scale[:, None]
        else:
            xq = tl.load(xq_ptr + token * K + at, mask=row_mask, other=0.0).T
            gate = tl.dot(w_gate, xq, gate)
            up = tl.dot(w_up, xq, up)
    gate = tl.sum(tl.where(the_token.T, gate, 0.0), axis=1)
    up = tl.sum(tl.where(the_token.T, up, 0.0), axis=1)
    if SCALING != BLOCKWISE:
        x_scale = tl.load(x_scale_ptr + token)
        gate *= x_scale * tl.load(scale_ptr + g64 * 2 * inter + gate_rows, mask=j_ok, other=0.0)
        up *= x_scale * tl.load(scale_ptr + g64 * 2 * inter + up_rows, mask=j_ok, other=0.0)
    return gate, up


@triton.jit
def write_h(unit_parts, units, splits, biases, g, j, inter, GLU: tl.constexpr, h_at, h_scale_at):
    """A unit's h from its `splits` parts of gu (unit_parts: its first part's
    gate sums; the parts units * 256 apart), summed in split order: b13 and
    the activation, quantized over the chunk (e4m3 into h_at, its scale
    into h_scale_at).  The parts come through L2 (.cg): other SMs wrote
    them."""
    b13_ptr, has_b13, b2_ptr, has_b2, activation = biases
    cols = tl.arange(0, CHUNK_COLUMNS)
    gate = tl.zeros((CHUNK_COLUMNS,), dtype=tl.float32)
    up = tl.zeros((CHUNK_COLUMNS,), dtype=tl.float32)
    for split in range(0, splits):
        at = unit_parts + split.to(tl.int64) * units * GU_COLUMNS + cols
        gate += tl.load(at, cache_modifier=".cg")
        up += tl.load(at + CHUNK_COLUMNS, cache_modifier=".cg")
    j_ok = j < inter
    if has_b13 != 0:
        bias = b13_ptr + g.to(tl.int64) * 2 * inter
        gate += tl.load(bias + w13_rows(j, 0, inter, GLU), mask=j_ok, other=0.0).to(tl.float32)
        up += tl.load(bias + w13_rows(j, 1, inter, GLU), mask=j_ok, other=0.0).to(tl.float32)
    h = tl.where(j_ok, act(gate, up, activation), 0.0)
    h_scale = scale_of(tl.max(tl.abs(h), axis=0))
    tl.store(h_at + cols, to_e4m3(h, h_scale))
    tl.store(h_scale_at, h_scale)


@triton.jit
def wait_for_every_h(counters_ptr, units):
    """Spin until every unit's h is written (counters[1] = units; acquire),
    then the CTA's threads."""
    while tl.atomic_add(counters_ptr + 1, 0, sem="acquire", scope="gpu") < units:
        pass
    tl.debug_barrier()


@triton.jit
def down_rows(d, routing, w2, biases, scratch, out_ptr, H, inter, G, w2_group_stride, ld2, units,
              SCALING: tl.constexpr, BN: tl.constexpr):
    """Down ticket d: token d // cdiv(H, BN)'s BN rows of out, from its slots'
    h and w2 rows, DOWN_ROWS // BN (slot, chunk) pairs a step; the first
    step's weights are loaded before the wait for every unit's h, so that
    they are on their way while the up tickets finish."""
    PARTS: tl.constexpr = DOWN_ROWS // BN
    ids_ptr, weights_ptr, k = routing
    w2_ptr, w2_scale_ptr = w2
    b13_ptr, has_b13, b2_ptr, has_b2, activation = biases
    h_ptr, h_scale_ptr, counters_ptr = scratch
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    row_tiles = tl.cdiv(H, BN)
    token = d // row_tiles
    n = (d % row_tiles) * BN + tl.arange(0, BN)
    n_ok = n < H
    cols = tl.arange(0, CHUNK_COLUMNS)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for first in range(0, k * chunks, PARTS):
        pair = first + tl.arange(0, PARTS)
        slot = token * k + pair // chunks
        column = pair % chunks
        expert = tl.load(ids_ptr + slot, mask=pair < k * chunks, other=-1)
        kept = (pair < k * chunks) & (expert >= 0) & (expert < G)
        g64 = tl.where(kept, expert, 0).to(tl.int64)
        c = column[:, None] * CHUNK_COLUMNS + cols[None, :]
        w = tl.load(w2_ptr + (g64 * w2_group_stride)[:, None, None]
                    + (n.to(tl.int64) * ld2)[None, :, None] + c[:, None, :],
                    mask=kept[:, None, None] & n_ok[None, :, None] & (c < inter)[:, None, :],
                    other=0.0)
        w_ok = kept[:, None] & n_ok[None, :]
        if SCALING == BLOCKWISE:
            w_scale = tl.load(w2_scale_ptr + (g64[:, None] * tl.cdiv(H, SCALE_BLOCK)
                                              + (n // SCALE_BLOCK)[None, :]) * chunks
                              + column[:, None], mask=w_ok, other=0.0)
        else:
            w_scale = tl.load(w2_scale_ptr + g64[:, None] * H + n[None, :], mask=w_ok, other=0.0)
        weight = tl.load(weights_ptr + slot, mask=kept, other=0.0)
        if has_b2 != 0:
            b2 = tl.load(b2_ptr + g64[:, None] * H + n[None, :], mask=w_ok & (column == 0)[:, None],
                         other=0.0).to(tl.float32)
            acc += tl.sum(b2 * weight[:, None], axis=0)
        if first == 0:
            wait_for_every_h(counters_ptr, units)
        unit = slot * chunks + column
        h = tl.load(h_ptr + unit.to(tl.int64)[:, None] * CHUNK_COLUMNS + cols[None, :],
                    mask=kept[:, None], other=0.0, cache_modifier=".cg")
        h_scale = tl.load(h_scale_ptr + unit, mask=kept, other=0.0, cache_modifier=".cg")
        product = tl.sum(w.to(tl.float32) * h.to(tl.float32)[:, None, :], axis=2)
        acc += tl.sum(product * w_scale * (h_scale * weight)[:, None], axis=0)
    tl.store(out_ptr + token.to(tl.int64) * H + n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)
