"""moe_experts' 4-bit (MXFP4, INT4) forward for a few slots with H spread over
programs, the w4_decode_split family (Gluon): fp8's split forward
(kernels/experts_decode_split.py) with kernels/w4_decode.py's K step, one
launch whose programs take tickets, in order, from a counter:

    up (ticket < units x splits), unit u = slot x chunk of h's 128 columns,
        split p: the slot's expert's gate and up rows of the chunk over p's
        part of H times its token, float32 into gu[p, u]; the unit's last
        part to arrive sums its parts in split order, activates them and
        writes h[u] (the tokens' dtype, as the routed kernels store h);
    down (the next T x cdiv(H, BN) x down_splits tickets), a token's BN rows
        of H and part q of its (slot, chunk) pairs, once every unit's h is
        written: the sum over the part's pairs j of weights[j] x
        w2[g_j][rows, chunk] @ h[j, chunk]; with one part into out, else
        float32 into dsum[q, token], the last part to arrive summing the
        parts in part order into out.

Why: at decode the routed 4-bit kernels' units (an expert's 128 rows of
w13) are few where I is small (Kimi-K2's tensor-parallel shards: 32 units at
one token), and one unit a program leaves most SMs idle; here each unit's H
and each token's pairs are spread over programs, in one launch with no
routing and no combine.  A slot is a unit: two slots of one expert read its
weights twice, rare at a few tokens.

Each product is mma.sync's (m16n8k16) with the slot's token as row 0 of 16:
the packed weights are loaded straight into the operand registers and
widened there, kernels/w4_decode.py's step (and its layouts, loads and
widening, shared); a down pair is one K step of 128.  The next step's (or
pair's) words and scales are loaded before this one is widened; a down
ticket's first pair before its wait for h.  A ticket waits only on tickets
handed out before it, which running programs hold, so the grid may be any
size.

counters [2 + units + T x cdiv(H, BN)] int32, zeroed before the launch: [0]
the next ticket, [1] the units whose h is written, [2 + u] unit u's parts
written, then each down tile's parts written.  gu [splits, units, 256]
float32, h [units, 128], dsum [down_splits, T, H] float32 are scratch.  No
biases (the operator takes the routed kernels where there are).  BM: the
MMA's rows (16); BN: H's rows a down ticket; BK: the up tickets' K step;
USE_TMA, CHUNK and PRECISION unused."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .glu import CONCATENATED
from .glu_ws import activate
from .gluon_api import thread_barrier
from .w4 import INT4_G128, MXFP4
from .w4_decode import (along, eightfold, grouped, load_step, load_tokens, mma_layout, multiply,
                        widen)

CHUNK_COLUMNS = gl.constexpr(128)  # h's columns a unit, and a down pair's K


@gluon.jit
def w4_decode_split_kernel(x_ptr, ids_ptr, weights_ptr, k, w13_ptr, w13_scale_ptr, w2_ptr,
                           w2_scale_ptr, activation, gu_ptr, h_ptr, dsum_ptr, counters_ptr,
                           out_ptr, T, H, N, G, splits, down_splits, w13_group_stride, ld13,
                           w13_scale_group_stride, lds13, w2_group_stride, ld2,
                           w2_scale_group_stride, lds2, FORMAT: gl.constexpr, GLU: gl.constexpr,
                           USE_TMA: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                           BK: gl.constexpr, CHUNK: gl.constexpr, PRECISION: gl.constexpr):
    """x [T, H] 16-bit tokens; ids [T * k] int64 the slots' experts (out of
    [0, G): dropped); weights [T * k] float32; w13 [G, 2I, H / 2] and w2 [G,
    H, I / 2] packed as FORMAT says, their scales [G, rows, K / group]
    (MXFP4's bytes, INT4's bfloat16), each with its strides (bytes for the
    values, scales for the scales); out [T, H]; the scratch and counters as
    the module says."""
    inter = N // 2
    units = T * k * gl.cdiv(inter, CHUNK_COLUMNS)
    up_tickets = units * splits
    tickets = up_tickets + T * gl.cdiv(H, BN) * down_splits
    if FORMAT != MXFP4:  # INT4's scales are bfloat16: strides count them
        w13_scales = w13_scale_ptr.to(gl.pointer_type(gl.bfloat16))
        w2_scales = w2_scale_ptr.to(gl.pointer_type(gl.bfloat16))
    else:
        w13_scales = w13_scale_ptr
        w2_scales = w2_scale_ptr
    w13 = (w13_ptr, w13_scales, w13_group_stride, ld13, w13_scale_group_stride, lds13)
    w2 = (w2_ptr, w2_scales, w2_group_stride, ld2, w2_scale_group_stride, lds2)
    routing = (ids_ptr, weights_ptr, k, G)
    ticket = gl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
    while ticket < tickets:
        if ticket < up_tickets:
            up_ticket(ticket, x_ptr, routing, w13, (gu_ptr, h_ptr, counters_ptr), H, inter,
                      splits, units, activation, FORMAT, GLU, BM, BK)
        else:
            down_ticket(ticket - up_tickets, routing, w2, (h_ptr, dsum_ptr, counters_ptr),
                        out_ptr, T, H, inter, units, down_splits, FORMAT, BM, BN)
        ticket = gl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")


@gluon.constexpr_function
def scale_group(FORMAT):
    """Values along K a scale covers."""
    return 128 if FORMAT == INT4_G128 else 32


@gluon.jit
def up_ticket(ticket, x_ptr, routing, w13, scratch, H, inter, splits, units, activation,
              FORMAT: gl.constexpr, GLU: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr):
    """Unit ticket // splits' part ticket % splits of gu, then its arrival;
    the unit's last arrival writes its h."""
    ids_ptr, weights_ptr, k, G = routing
    gu_ptr, h_ptr, counters_ptr = scratch
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    chunks = gl.cdiv(inter, CHUNK_COLUMNS)
    unit = ticket // splits
    split = ticket % splits
    slot = unit // chunks
    first = (unit % chunks) * CHUNK_COLUMNS
    expert = gl.load(ids_ptr + slot)
    kept = (expert >= 0) & (expert < G)
    per_split = gl.cdiv(gl.cdiv(H, BK), splits) * BK
    k_lo = split * per_split
    if kept:
        gate, up = gate_up_sums(x_ptr + (slot // k).to(gl.int64) * H, w13, expert.to(gl.int64),
                                first, inter, k_lo, gl.minimum(k_lo + per_split, H), FORMAT, GLU,
                                BM, BK)
        r = along(BM, 0, MMA)
        c = along(CHUNK_COLUMNS, 1, MMA)
        at = gu_ptr + (split * units + unit).to(gl.int64) * (2 * CHUNK_COLUMNS) + r * 0 + c
        gl.store(at, gate, mask=(r == 0) & (c >= 0))
        gl.store(at + CHUNK_COLUMNS, up, mask=(r == 0) & (c >= 0))
    thread_barrier()  # every thread's stores before the arrival's release
    arrived = gl.atomic_add(counters_ptr + 2 + unit, 1, sem="acq_rel", scope="gpu")
    if arrived == splits - 1:
        if kept:
            write_h(gu_ptr + unit.to(gl.int64) * (2 * CHUNK_COLUMNS), units, splits,
                    h_ptr + unit.to(gl.int64) * CHUNK_COLUMNS, first, inter, activation)
        thread_barrier()
        gl.atomic_add(counters_ptr + 1, 1, sem="release", scope="gpu")


@gluon.jit
def gate_up_sums(x_row, w13, g, first, inter, k_lo, k_hi, FORMAT: gl.constexpr,
                 GLU: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr):
    """(gate, up) [BM, 128] float32, row 0 the token's (x_row) times expert
    g's gate and up rows of h's columns first .. first + 128 over K's k_lo ..
    k_hi (whole groups); the columns past I repeat its last."""
    w13_ptr, scales, group_stride, ld, scale_group_stride, lds = w13
    GROUP: gl.constexpr = scale_group(FORMAT)
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, BK // 64)
    B_L: gl.constexpr = gl.DotOperandLayout(1, MMA, BK // 64)
    W: gl.constexpr = BK // 8  # a row's words in a step
    X_L: gl.constexpr = eightfold(gl.to_linear_layout(A_L, [BM, W]))
    GROUPS: gl.constexpr = max(BK // GROUP, 1)  # scale groups in a step
    S_L: gl.constexpr = gl.SliceLayout(1, grouped(gl.to_linear_layout(B_L, [W, CHUNK_COLUMNS]),
                                                  GROUPS))
    n_b = gl.minimum(first + along(CHUNK_COLUMNS, 1, B_L), inter - 1).to(gl.int64)
    n_s = gl.minimum(first + along(CHUNK_COLUMNS, 1, S_L), inter - 1).to(gl.int64)
    if GLU == CONCATENATED:  # gate row j, up row I + j
        up_rows = inter.to(gl.int64)
    else:  # INTERLEAVED: gate row 2j, up row 2j + 1
        n_b = 2 * n_b
        n_s = 2 * n_s
        up_rows = 1
    word = along(W, 0, B_L)
    expert = w13_ptr.to(gl.pointer_type(gl.int32)) + g * (group_stride // 4)
    at = gl.multiple_of(expert + n_b * (ld // 4), [16, 16]) + word
    at_up = gl.multiple_of(expert + (n_b + up_rows) * (ld // 4), [16, 16]) + word
    group = along(GROUPS, 0, S_L) * (8 * W // GROUPS) // GROUP
    s_at = scales + g * scale_group_stride + n_s * lds + group
    s_at_up = s_at + up_rows * lds
    cols = along(8 * W, 1, X_L)
    r = along(BM, 0, X_L)
    x_at = gl.multiple_of(x_row + r * 0, [16, 16]) + cols
    gate = gl.zeros([BM, CHUNK_COLUMNS], gl.float32, MMA)
    up = gl.zeros([BM, CHUNK_COLUMNS], gl.float32, MMA)
    b, s = load_step(at, word, s_at, group, k_lo, k_hi, GROUP)
    b_up, s_up = load_step(at_up, word, s_at_up, group, k_lo, k_hi, GROUP)
    for k0 in range(k_lo, k_hi, BK):
        # the next step's loads first: in flight while this step widens and multiplies
        b_next, s_next = load_step(at, word, s_at, group, k0 + BK, k_hi, GROUP)
        b_up_next, s_up_next = load_step(at_up, word, s_at_up, group, k0 + BK, k_hi, GROUP)
        xs = load_tokens(x_at + k0, (r == 0) & gl.max_constancy(k0 + cols < k_hi, [1, 8]), A_L)
        gate = multiply(xs, widen(b, s, FORMAT), gate)
        up = multiply(xs, widen(b_up, s_up, FORMAT), up)
        b, s = b_next, s_next
        b_up, s_up = b_up_next, s_up_next
    return gate, up


@gluon.jit
def write_h(parts, units, splits, h_at, first, inter, activation):
    """A unit's h from its `splits` parts of gu (parts: its first part's gate
    sums; the parts units * 256 apart), summed in split order, activated,
    in h's dtype; the columns past I zero.  The parts come through L2 (.cg):
    other SMs wrote them."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    cols = gl.arange(0, CHUNK_COLUMNS, L)
    gate = gl.zeros([CHUNK_COLUMNS], gl.float32, L)
    up = gl.zeros([CHUNK_COLUMNS], gl.float32, L)
    for split in range(0, splits):
        at = parts + split.to(gl.int64) * units * (2 * CHUNK_COLUMNS) + cols
        gate += gl.load(at, cache_modifier=".cg")
        up += gl.load(at + CHUNK_COLUMNS, cache_modifier=".cg")
    h = gl.where(first + cols < inter, activate(gate, up, activation), 0.0)
    gl.store(h_at + cols, h.to(h_at.dtype.element_ty))


@gluon.jit
def pair_at(routing, token, chunks, p, p_hi):
    """(g, kept, its chunk's first column of h, routing weight) of the
    token's p-th (slot, chunk) pair; none at p_hi or past it."""
    ids_ptr, weights_ptr, k, G = routing
    slot = token * k + p // chunks
    expert = gl.load(ids_ptr + slot, mask=p < p_hi, other=-1)
    kept = (p < p_hi) & (expert >= 0) & (expert < G)
    weight = gl.load(weights_ptr + slot, mask=kept, other=0.0)
    return gl.where(kept, expert, 0).to(gl.int64), kept, (p % chunks) * CHUNK_COLUMNS, weight


@gluon.jit
def pair_words(w2, n_b, n_s, word, group, g, kept, first, inter, GROUP: gl.constexpr):
    """A pair's words of w2[g] (rows n_b, h's columns first .. first + 128)
    and their raw scales; nothing where not kept or past I."""
    w2_ptr, scales, group_stride, ld, scale_group_stride, lds = w2
    words = w2_ptr.to(gl.pointer_type(gl.int32)) + g * (group_stride // 4)
    # I is whole groups of 32 values (host-checked): runs of 4 words agree.
    b = gl.load(words + n_b * (ld // 4) + first // 8 + word,
                mask=kept & gl.max_constancy(first // 8 + word < inter // 8, [4, 1]), other=0)
    s = gl.load(scales + g * scale_group_stride + n_s * lds + first // GROUP + group,
                mask=kept & (first // GROUP + group < inter // GROUP), other=0)
    return b, s


@gluon.jit
def down_ticket(d, routing, w2, scratch, out_ptr, T, H, inter, units, down_splits,
                FORMAT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """Down ticket d: a token's BN rows of out over part d % down_splits of
    its (slot, chunk) pairs, once every unit's h is written."""
    ids_ptr, weights_ptr, k, G = routing
    h_ptr, dsum_ptr, counters_ptr = scratch
    GROUP: gl.constexpr = scale_group(FORMAT)
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, CHUNK_COLUMNS // 64)
    B_L: gl.constexpr = gl.DotOperandLayout(1, MMA, CHUNK_COLUMNS // 64)
    W: gl.constexpr = CHUNK_COLUMNS // 8  # a row's words in a step
    X_L: gl.constexpr = eightfold(gl.to_linear_layout(A_L, [BM, W]))
    GROUPS: gl.constexpr = max(CHUNK_COLUMNS // GROUP, 1)  # scale groups in a step
    S_L: gl.constexpr = gl.SliceLayout(1, grouped(gl.to_linear_layout(B_L, [W, BN]),
                                                  GROUPS))
    chunks = gl.cdiv(inter, CHUNK_COLUMNS)
    q = d % down_splits
    tile = d // down_splits
    row_tiles = gl.cdiv(H, BN)
    token = tile // row_tiles
    off_n = (tile % row_tiles) * BN
    n_b = gl.minimum(off_n + along(BN, 1, B_L), H - 1).to(gl.int64)  # past H: never stored
    n_s = gl.minimum(off_n + along(BN, 1, S_L), H - 1).to(gl.int64)
    word = along(W, 0, B_L)
    group = along(GROUPS, 0, S_L) * (8 * W // GROUPS) // GROUP
    cols = along(8 * W, 1, X_L)
    r = along(BM, 0, X_L)
    per_part = gl.cdiv(k * chunks, down_splits)
    p_lo = q * per_part
    p_hi = gl.minimum(p_lo + per_part, k * chunks)
    g, kept, first, weight = pair_at(routing, token, chunks, p_lo, p_hi)
    b, s = pair_words(w2, n_b, n_s, word, group, g, kept, first, inter, GROUP)
    while gl.atomic_add(counters_ptr + 1, 0, sem="acquire", scope="gpu") < units:
        pass
    thread_barrier()
    acc = gl.zeros([BM, BN], gl.float32, MMA)
    for p in range(p_lo, p_hi):
        g_next, kept_next, first_next, weight_next = pair_at(routing, token, chunks, p + 1, p_hi)
        b_next, s_next = pair_words(w2, n_b, n_s, word, group, g_next, kept_next, first_next,
                                    inter, GROUP)
        unit = (token * k + p // chunks) * chunks + p % chunks
        h_at = gl.multiple_of(h_ptr + unit.to(gl.int64) * CHUNK_COLUMNS + r * 0, [16, 16]) + cols
        hs = load_tokens(h_at, (r == 0) & kept, A_L)
        acc += weight * multiply(hs, widen(b, s, FORMAT), gl.zeros([BM, BN], gl.float32, MMA))
        g, kept, first, weight = g_next, kept_next, first_next, weight_next
        b, s = b_next, s_next
    r_out = along(BM, 0, MMA)
    c_out = off_n + along(BN, 1, MMA)
    row = token.to(gl.int64) * H + r_out * 0 + c_out
    mine = (r_out == 0) & (c_out < H)
    if down_splits == 1:
        gl.store(out_ptr + row, acc.to(out_ptr.dtype.element_ty), mask=mine)
    else:
        gl.store(dsum_ptr + q.to(gl.int64) * T * H + row, acc, mask=mine)
        thread_barrier()  # every thread's stores before the arrival's release
        arrived = gl.atomic_add(counters_ptr + 2 + units + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == down_splits - 1:
            total = gl.zeros([BM, BN], gl.float32, MMA)
            for part in range(0, down_splits):
                total += gl.load(dsum_ptr + part.to(gl.int64) * T * H + row, mask=mine,
                                 other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + row, total.to(out_ptr.dtype.element_ty), mask=mine)
