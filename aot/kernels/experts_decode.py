"""moe_experts' fp8 forward for few slots (serving's decode) in one kernel,
the scaled_experts_decode family: the routing, the tokens' quantization
(BLOCKWISE) and both projections of each work unit, one tile of BM slots routed to an expert
g and one chunk of 128 of h's columns j:

    gate, up = w13[g][gate and up rows of j] @ q(x[token])^T  [128, BM] each
    h        = act(gate (+ b13), up (+ b13))                  quantized per row
                                                              over the chunk
    part     = w2[g][:, j] @ h                                [H, BM]
                                                              (+ b2 in chunk 0)

written to parts [S, C, H] float32 (S slots, C = cdiv(I, 128) chunks):
part[slot, chunk].  combine.combine_parts_kernel sums each token's slots'
chunks.  Why one kernel: with few rows an expert the forward is a read of the
touched experts' weights, and in two kernels the down projection's read waits
for the whole up projection's; here every unit reads its w13 rows and w2
columns in one stream, h never leaves the SM.  The weights are the MMAs'
first operand (an expert's 128 rows are M, its few rows N).  The routing, a
kernel of its own in the other forward, is done here on the way (a call
has at most MAX_SLOTS slots); so is the tokens' quantization per 128
columns (BLOCKWISE), each block's amax at hand as it is read.  A per-token
scale (ROWWISE) needs the whole row first: those tokens come quantized
(quantize_fp8).

The routing: slot s (token s // k's j-th, s = token * k + j) is kept where
its id is an expert (0 <= id < G); an expert's kept slots are its group, in
slot order, cut into tiles of BM (slot_groups).  A unit's slots are found by
their rank in their group (locate_unit).

The quantities are the unfused forward's (expert_products_fp8.cc): x quantized
as quantize_fp8 does it (kernels/quantize.py scale_of and to_e4m3, per token
per 128 columns with 128 x 128 weight blocks, per token with per-channel
weights); h per token per 128 columns, a chunk being one such block; each
block's product scaled as scaled.py's SCALING says.  Only the sums' order and
roundings differ: the down projection's sum over chunks is the combine's, in
float32.

GLU (glu.py) places h's column j's gate and up rows in w13: j and I + j
(CONCATENATED) or 2j and 2j + 1 (INTERLEAVED); a 4-D view of w13 makes
either a box of 128 gate or up rows.  Each row's scale is read for its own
128-row block, so either layout and any I (a multiple of 16) scale right.

kernels/experts_decode_ws.py runs the same units warp-specialised, in Gluon;
kernels/experts_decode_split.py cuts each unit's H into parts over two kernels.

Persistent: program p takes units p, p + programs, ...  BM: slots a unit
(the MMAs' N); BN: H rows of w2 a step of the down projection; BK: 128, the
up projection's step and the scales' block.  CHUNK is unused.
"""
import triton
import triton.language as tl

from .glu import CONCATENATED, act
from .quantize import scale_of, to_e4m3
from .scaled import BLOCKWISE, ROWWISE, SCALE_BLOCK

CHUNK_COLUMNS = tl.constexpr(128)  # h's columns a unit: one scale block
MAX_SLOTS = tl.constexpr(64)  # the most slots a call (the family's kMaxSlots)


@triton.jit
def scaled_experts_decode_kernel(x_ptr, xq_ptr, x_scale_ptr, ids_ptr, k, w13_ptr,
                                 w13_scale_ptr, w2_ptr, w2_scale_ptr, b13_ptr, has_b13, b2_ptr,
                                 has_b2, activation, parts_ptr, S, H, N, G, w13_group_stride, ld13,
                                 w2_group_stride, ld2, SCALING: tl.constexpr,
                                 GLU: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                                 BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                                 PRECISION: tl.constexpr):
    """x [*, H] the tokens (16-bit, contiguous; BLOCKWISE's), or xq [*, H]
    e4m3 (contiguous) and x_scale [*] (quantize_fp8's per token: ROWWISE's);
    ids [S] int64, the slots' experts (S = tokens * k <= MAX_SLOTS); w13
    [G, N = 2I, H] and w2 [G, H, I] e4m3 (K-major) and their scales
    (SCALING: blocks or channels, contiguous); b13 [G, 2I], b2 [G, H]
    bfloat16 where has_*; parts [S, C, H] float32 (a dropped slot's left as
    they are).  The weights come by TMA (every variant is the `tma`
    flavour's: USE_TMA), the tokens' rows by pointer loads; CHUNK and
    PRECISION (GEMM constexprs every variant receives) are unused."""
    tl.static_assert(BK == SCALE_BLOCK, "one K step a scale block")
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    w13_desc = w13_descriptor(w13_ptr, G, inter, H, w13_group_stride, ld13, GLU, BK)
    w2_desc = w2_descriptor(w2_ptr, G, inter, H, w2_group_stride, ld2, BN)
    weights = (x_ptr, xq_ptr, x_scale_ptr, k, w13_desc, w13_scale_ptr, w2_desc, w2_scale_ptr)
    biases = (b13_ptr, has_b13, b2_ptr, has_b2, activation)
    extents = (H, inter)
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    units = tl.sum(groups[2])
    for t in range(tl.program_id(0), units, tl.num_programs(0)):
        g, slots, row_ok, column = locate_unit(t, groups, chunks, BM)
        unit(weights, biases, extents, parts_ptr, g, slots, row_ok, column, chunks, SCALING,
             GLU, BM, BN, BK)


@triton.jit
def w13_descriptor(w13_ptr, G, inter, H, group_stride, ld, GLU: tl.constexpr, BK: tl.constexpr):
    """w13 [G, 2I, H] seen as [G, half, I, H] (CONCATENATED) or [G, I, half,
    H] (INTERLEAVED): a box of 128 gate (half 0) or up (half 1) rows either
    way."""
    if GLU == CONCATENATED:
        return tl.make_tensor_descriptor(w13_ptr, shape=[G, 2, inter, H],
                                         strides=[group_stride, inter * ld, ld, 1],
                                         block_shape=[1, 1, CHUNK_COLUMNS, BK])
    else:
        return tl.make_tensor_descriptor(w13_ptr, shape=[G, inter, 2, H],
                                         strides=[group_stride, 2 * ld, ld, 1],
                                         block_shape=[1, CHUNK_COLUMNS, 1, BK])


@triton.jit
def w2_descriptor(w2_ptr, G, inter, H, group_stride, ld, BN: tl.constexpr):
    """w2 [G, H, I] in boxes of BN rows by one chunk of h's columns."""
    return tl.make_tensor_descriptor(w2_ptr, shape=[G, H, inter], strides=[group_stride, ld, 1],
                                     block_shape=[1, BN, CHUNK_COLUMNS])


@triton.jit
def slot_groups(ids_ptr, S, G, chunks, BM: tl.constexpr):
    """The call's groups, over the slots s < MAX_SLOTS: (expert (-1: dropped
    or past S), rank (s's place in its group), units (at a group's first
    slot, cdiv(its slots, BM) x chunks; else 0), their inclusive prefix)."""
    s = tl.arange(0, MAX_SLOTS)
    ids = tl.load(ids_ptr + s, mask=s < S, other=-1)
    kept = (ids >= 0) & (ids < G)
    expert = tl.where(kept, ids, -1).to(tl.int32)
    same = (expert[:, None] == expert[None, :]) & kept[:, None]
    rank = tl.sum((same & (s[None, :] < s[:, None])).to(tl.int32), axis=1)
    size = tl.sum(same.to(tl.int32), axis=1)
    units = tl.where(kept & (rank == 0), tl.cdiv(size, BM) * chunks, 0)
    return expert, rank, units, tl.cumsum(units, axis=0)


@triton.jit
def locate_unit(t, groups, chunks, BM: tl.constexpr):
    """(expert g, the slots of the unit's tile [BM], which of them are g's,
    h's chunk) of unit t of slot_groups' groups: each group's units tile by
    tile, the chunks of a tile in order."""
    expert, rank, units, ends = groups
    here = (ends - units <= t) & (t < ends)
    g = tl.sum(tl.where(here, expert, 0))
    local = t - tl.sum(tl.where(here, ends - units, 0))
    ranks = (local // chunks) * BM + tl.arange(0, BM)
    match = (expert[None, :] == g) & (rank[None, :] == ranks[:, None])
    slots = tl.sum(tl.where(match, tl.arange(0, MAX_SLOTS)[None, :], 0), axis=1)
    return g, slots, tl.sum(match.to(tl.int32), axis=1) > 0, local % chunks


@triton.jit
def unit(weights, biases, extents, parts_ptr, g, slots, row_ok, column, chunks,
         SCALING: tl.constexpr, GLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
         BK: tl.constexpr):
    """One unit: slots (those in row_ok) of group g, h's chunk `column`."""
    x_ptr, xq_ptr, x_scale_ptr, k, w13_desc, w13_scale_ptr, w2_desc, w2_scale_ptr = weights
    H, inter = extents
    x = token_rows(x_ptr, xq_ptr, x_scale_ptr, k, slots, row_ok, H, SCALING)
    w13 = (w13_desc, w13_scale_ptr, g, column * CHUNK_COLUMNS, inter)
    # Gate's and up's rows in loops of their own: a unit keeps half the
    # stages, so more units share an SM (measured faster at decode).
    gate = w13_product(w13, 0, x, (0, H, H), SCALING, GLU, BM, BK).T
    up = w13_product(w13, 1, x, (0, H, H), SCALING, GLU, BM, BK).T
    h, h_scale = quantized_h(gate, up, biases, g, column, inter, GLU)
    down_parts((w2_desc, w2_scale_ptr, biases), h, h_scale, parts_ptr, g, slots, row_ok, column,
               chunks, (0, H, H), SCALING, BN)


@triton.jit
def token_rows(x_ptr, xq_ptr, x_scale_ptr, k, slots, row_ok, H, SCALING: tl.constexpr):
    """The slots' token rows as w13_product reads them: (the rows' first
    elements, ROWWISE's per-token scales, row_ok)."""
    tokens = (slots // k).to(tl.int64)
    # 16-byte aligned rows (run.cc's TMA rules; H a multiple of 16).
    if SCALING == BLOCKWISE:
        return tl.multiple_of(x_ptr + tokens * H, 16), 1.0, row_ok
    else:
        return (tl.multiple_of(xq_ptr + tokens * H, 16),
                tl.load(x_scale_ptr + tokens, mask=row_ok, other=0.0), row_ok)


@triton.jit
def quantized_h(gate, up, biases, g, column, inter, GLU: tl.constexpr):
    """h's chunk `column` [128, BM] e4m3 from gate and up [BM, 128] float32
    (b13 added where given), and its scales [BM]: per slot, its 1x128 block."""
    b13_ptr, has_b13, b2_ptr, has_b2, activation = biases
    j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
    j_ok = j < inter
    if has_b13 != 0:
        bias = b13_ptr + g.to(tl.int64) * 2 * inter
        gate += tl.load(bias + w13_rows(j, 0, inter, GLU), mask=j_ok,
                        other=0.0).to(tl.float32)[None, :]
        up += tl.load(bias + w13_rows(j, 1, inter, GLU), mask=j_ok,
                      other=0.0).to(tl.float32)[None, :]
    h = tl.where(j_ok[None, :], act(gate, up, activation), 0.0)
    h_scale = scale_of(tl.max(tl.abs(h), axis=1))
    return to_e4m3(h, h_scale[:, None]).T, h_scale


@triton.jit
def down_parts(w2, h, h_scale, parts_ptr, g, slots, row_ok, column, chunks, rows,
               SCALING: tl.constexpr, BN: tl.constexpr):
    """The down projection of h's chunk `column` ([128, BM] e4m3, scales
    [BM]) over w2[g]'s rows n_lo .. n_hi (rows = (n_lo, n_hi, H); n_lo a
    multiple of BN), written to the slots' parts (b2 added in chunk 0)."""
    w2_desc, w2_scale_ptr, biases = w2
    b13_ptr, has_b13, b2_ptr, has_b2, activation = biases
    n_lo, n_hi, H = rows
    g64 = g.to(tl.int64)
    first = column * CHUNK_COLUMNS
    parts = parts_ptr + (slots.to(tl.int64) * chunks + column) * H
    for n0 in range(n_lo, n_hi, BN):
        ns = n0 + tl.arange(0, BN)
        n_ok = ns < n_hi
        w = w2_desc.load([g, n0, first]).reshape(BN, CHUNK_COLUMNS)
        if SCALING == BLOCKWISE:
            w_scale = tl.load(w2_scale_ptr + (g64 * tl.cdiv(H, SCALE_BLOCK) + ns // SCALE_BLOCK)
                              * chunks + column, mask=n_ok, other=0.0)
        else:
            w_scale = tl.load(w2_scale_ptr + g64 * H + ns, mask=n_ok, other=0.0)
        part = tl.dot(w, h) * h_scale[None, :] * w_scale[:, None]
        if has_b2 != 0 and column == 0:
            part += tl.load(b2_ptr + g64 * H + ns, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(parts[None, :] + ns[:, None], part, mask=row_ok[None, :] & n_ok[:, None])


@triton.jit
def w13_rows(j, half, inter, GLU: tl.constexpr):
    """w13's rows of h's columns j: their gate's (half 0) or up's (half 1)."""
    if GLU == CONCATENATED:
        return half * inter + j
    else:
        return 2 * j + half


@triton.jit
def w13_product(w13, half, x, k_range, SCALING: tl.constexpr, GLU: tl.constexpr,
                BM: tl.constexpr, BK: tl.constexpr):
    """[128, BM] float32: the gate (half 0) or up (half 1) rows of w13[g] of
    h's columns first .. first + 128 (w13 = (its descriptor, scale_ptr, g,
    first, I); columns past I read 0) times the slots' token rows (x,
    token_rows'), over K's k_lo .. k_hi (k_range = (k_lo, k_hi, K); k_lo a
    multiple of BK), scaled: each row by its own 128-row block's scales
    (BLOCKWISE: 16-bit rows, quantized per block as they are read) or its
    channel's (ROWWISE: e4m3 rows)."""
    desc, scale_ptr, g, first, inter = w13
    k_lo, k_hi, K = k_range
    x_rows, row_scale, row_ok = x
    g64 = g.to(tl.int64)
    j = first + tl.arange(0, CHUNK_COLUMNS)
    j_ok = j < inter
    w_rows = w13_rows(j, half, inter, GLU)
    ks = tl.arange(0, BK)
    acc = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
    if SCALING == BLOCKWISE:
        w_scales = scale_ptr + (g64 * tl.cdiv(2 * inter, SCALE_BLOCK) + w_rows // SCALE_BLOCK) \
            * tl.cdiv(K, SCALE_BLOCK)
    for k0 in range(k_lo, k_hi, BK):
        in_k = tl.max_constancy(k0 + ks < k_hi, 16)
        xs = tl.load(x_rows[:, None] + k0 + ks[None, :], mask=row_ok[:, None] & in_k[None, :],
                     other=0.0)
        if GLU == CONCATENATED:
            w = desc.load([g, half, first, k0]).reshape(CHUNK_COLUMNS, BK)
        else:
            w = desc.load([g, first, half, k0]).reshape(CHUNK_COLUMNS, BK)
        if SCALING == BLOCKWISE:
            xs = xs.to(tl.float32)
            x_scale = scale_of(tl.max(tl.abs(xs), axis=1))
            w_scale = tl.load(w_scales + k0 // SCALE_BLOCK, mask=j_ok, other=0.0)[:, None]
            acc += tl.dot(w, to_e4m3(xs, x_scale[:, None]).T) * x_scale[None, :] * w_scale
        else:
            acc = tl.dot(w, xs.T, acc)
    if SCALING == ROWWISE:
        w_scale = tl.load(scale_ptr + g64 * 2 * inter + w_rows, mask=j_ok, other=0.0)[:, None]
        acc = acc * row_scale[None, :] * w_scale
    return acc
