"""moe_experts' fp8 forward for few rows an expert (serving's decode) in one
kernel, the scaled_experts_decode family: both projections of a work unit,
one tile of BM slot rows of an expert g (the rows as the routing sorts them)
and one chunk of 128 of h's columns j:

    gate, up = w13[g][gate and up rows of j] @ x[token]^T     [128, BM] each
    h        = act(gate (+ b13), up (+ b13))                  quantized per row
                                                              over the chunk
    part     = w2[g][:, j] @ h                                [H, BM]
                                                              (+ b2 in chunk 0)

written to parts [S, C, H] float32 (S slot rows, C = cdiv(I, 128) chunks):
part[row, chunk].  combine.combine_parts_kernel sums each token's slots'
chunks.  Why one kernel: with few rows an expert the forward is a read of the
touched experts' weights, and in two kernels the down projection's read waits
for the whole up projection's; here every unit reads its w13 rows and w2
columns in one stream, h never leaves the SM.  The weights are the MMAs'
first operand (an expert's 128 rows are M, its few rows N).

The quantities are the unfused forward's (moe_experts_fp8.cc): x as
quantize_fp8 gives it (per token per 128 columns with 128 x 128 weight blocks,
per token with per-channel weights); h per token per 128 columns, a chunk
being one such block; each block's product scaled as scaled.py's SCALING
says.  Only the sums' order and roundings differ: the down projection's sum
over chunks is the combine's, in float32.

GLU (glu.py) places h's column j's gate and up rows in w13: j and I + j
(CONCATENATED) or 2j and 2j + 1 (INTERLEAVED); a 4-D view of w13 makes
either a box of 128 gate or up rows.  Each row's scale is read for its own
128-row block, so either layout and any I (a multiple of 16) scale right.

kernels/experts_decode_ws.py runs the same units warp-specialised, in Gluon.

Persistent: the units are the tiles of a ragged-M product with C column
tiles (tiles.py walk_groups / locate_tile); rows past the last group (dropped
slots) have none.  BM: slot rows a unit (the MMAs' N); BN: H rows of w2 a step
of the down projection; BK: 128, the up projection's step and the scales'
block.
"""
import triton
import triton.language as tl

from .glu import CONCATENATED, act
from .quantize import scale_of, to_e4m3
from .scaled import BLOCKWISE, ROWWISE, SCALE_BLOCK
from .tiles import first_step_past, locate_tile, walk_groups

CHUNK_COLUMNS = tl.constexpr(128)  # h's columns a unit: one scale block


@triton.jit
def scaled_experts_decode_kernel(x_ptr, x_scale_ptr, rows_ptr, rows_div, offs_ptr, w13_ptr,
                                 w13_scale_ptr, w2_ptr, w2_scale_ptr, b13_ptr, has_b13, b2_ptr,
                                 has_b2, gpt_oss, parts_ptr, S, H, N, G, ldx, w13_group_stride,
                                 ld13, w2_group_stride, ld2, SCALING: tl.constexpr,
                                 GLU: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                                 BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                                 PRECISION: tl.constexpr):
    """x [*, H] e4m3 (rows ldx apart) and its scales; slot row r is token
    rows[r] // rows_div; offs [G] the groups' ends; w13 [G, N = 2I, H] and w2
    [G, H, I] e4m3 (K-major) and their scales (SCALING: blocks or channels,
    contiguous); b13 [G, 2I], b2 [G, H] bfloat16 where has_*; parts [S, C, H]
    float32.  The weights come by TMA (every variant is the `tma` flavour's:
    USE_TMA), the tokens' rows by pointer loads; PRECISION (a GEMM constexpr
    every variant receives) is unused."""
    tl.static_assert(BK == SCALE_BLOCK, "one K step a scale block")
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    rows_end = tl.minimum(tl.load(offs_ptr + G - 1), S)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    # w13 seen as [G, half, I, H] (CONCATENATED) or [G, I, half, H]
    # (INTERLEAVED): a box of 128 gate (half 0) or up (half 1) rows either way.
    if GLU == CONCATENATED:
        w13_desc = tl.make_tensor_descriptor(w13_ptr, shape=[G, 2, inter, H],
                                             strides=[w13_group_stride, inter * ld13, ld13, 1],
                                             block_shape=[1, 1, CHUNK_COLUMNS, BK])
    else:
        w13_desc = tl.make_tensor_descriptor(w13_ptr, shape=[G, inter, 2, H],
                                             strides=[w13_group_stride, 2 * ld13, ld13, 1],
                                             block_shape=[1, CHUNK_COLUMNS, 1, BK])
    w2_desc = tl.make_tensor_descriptor(w2_ptr, shape=[G, H, inter],
                                        strides=[w2_group_stride, ld2, 1],
                                        block_shape=[1, BN, CHUNK_COLUMNS])
    weights = (x_ptr, x_scale_ptr, rows_ptr, rows_div, w13_desc, w13_scale_ptr, w2_desc,
               w2_scale_ptr)
    biases = (b13_ptr, has_b13, b2_ptr, has_b2, gpt_oss)
    extents = (H, inter, ldx)
    tiles_before = 0
    rows_before = 0
    lane = tl.arange(0, CHUNK)
    for chunk in range(0, G, CHUNK):
        starts, ends, group_tiles, tiles_end = walk_groups(offs_ptr, chunk + lane, G, rows_end,
                                                           rows_before, tiles_before, chunks, BM)
        chunk_end = tiles_before + tl.sum(group_tiles)
        # The start from tiles_before, not carried: ragged.py ragged_m_program says why.
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            g, _, end, off_m, column = locate_tile(t, chunk, starts, ends, group_tiles,
                                                   tiles_end, BM, 1, CHUNK)
            unit(weights, biases, extents, parts_ptr, g, off_m, end, column, chunks, SCALING,
                 GLU, BM, BN, BK)
        tiles_before = chunk_end
        rows_before = tl.max(ends)


@triton.jit
def unit(weights, biases, extents, parts_ptr, g, off_m, end, column, chunks,
         SCALING: tl.constexpr, GLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
         BK: tl.constexpr):
    """One unit: rows off_m .. end (at most BM) of group g, h's chunk `column`."""
    x_ptr, x_scale_ptr, rows_ptr, rows_div, w13_desc, w13_scale_ptr, w2_desc, w2_scale_ptr = weights
    b13_ptr, has_b13, b2_ptr, has_b2, gpt_oss = biases
    H, inter, ldx = extents
    rows = off_m + tl.arange(0, BM)
    row_ok = rows < end
    tokens = tl.load(rows_ptr + rows, mask=row_ok, other=0) // rows_div
    j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
    j_ok = j < inter
    g64 = g.to(tl.int64)
    x = (tl.multiple_of(x_ptr + tokens * ldx, 16), x_scale_ptr, tokens, row_ok)
    first = column * CHUNK_COLUMNS
    w13 = (w13_desc, w13_scale_ptr, g, first, inter)
    # Gate's and up's rows in loops of their own: a unit keeps half the
    # stages, so more units share an SM (measured faster at decode).
    gate = w13_product(w13, 0, x, H, SCALING, GLU, BM, BK).T
    up = w13_product(w13, 1, x, H, SCALING, GLU, BM, BK).T
    gate_rows = w13_rows(j, 0, inter, GLU)
    up_rows = w13_rows(j, 1, inter, GLU)
    if has_b13 != 0:
        bias = b13_ptr + g64 * 2 * inter
        gate += tl.load(bias + gate_rows, mask=j_ok, other=0.0).to(tl.float32)[None, :]
        up += tl.load(bias + up_rows, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    h = tl.where(j_ok[None, :], act(gate, up, gpt_oss), 0.0)
    h_scale = scale_of(tl.max(tl.abs(h), axis=1))  # per slot row: its 1x128 block
    h = to_e4m3(h, h_scale[:, None]).T
    parts = parts_ptr + (rows.to(tl.int64) * chunks + column) * H
    for n0 in range(0, H, BN):
        ns = n0 + tl.arange(0, BN)
        n_ok = ns < H
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
def w13_product(w13, half, x, K, SCALING: tl.constexpr, GLU: tl.constexpr, BM: tl.constexpr,
                BK: tl.constexpr):
    """[128, BM] float32: the gate (half 0) or up (half 1) rows of w13[g] of
    h's columns first .. first + 128 (w13 = (its descriptor, scale_ptr, g,
    first, I); columns past I read 0) times the slots' token rows (x = (their
    first elements, the scales' base, the token of each, row_ok)), scaled:
    each row by its own 128-row block's scales (BLOCKWISE) or its channel's
    (ROWWISE)."""
    desc, scale_ptr, g, first, inter = w13
    x_rows, x_scale_ptr, token, row_ok = x
    g64 = g.to(tl.int64)
    j = first + tl.arange(0, CHUNK_COLUMNS)
    j_ok = j < inter
    w_rows = w13_rows(j, half, inter, GLU)
    ks = tl.arange(0, BK)
    acc = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
    if SCALING == BLOCKWISE:
        k_blocks = tl.cdiv(K, SCALE_BLOCK)
        row_blocks = g64 * tl.cdiv(2 * inter, SCALE_BLOCK) + w_rows // SCALE_BLOCK
        w_scales = scale_ptr + row_blocks * k_blocks
        x_scales = x_scale_ptr + token * k_blocks
    for k0 in range(0, K, BK):
        in_k = tl.max_constancy(k0 + ks < K, 16)
        xs = tl.load(x_rows[:, None] + k0 + ks[None, :], mask=row_ok[:, None] & in_k[None, :],
                     other=0.0).T
        if GLU == CONCATENATED:
            w = desc.load([g, half, first, k0]).reshape(CHUNK_COLUMNS, BK)
        else:
            w = desc.load([g, first, half, k0]).reshape(CHUNK_COLUMNS, BK)
        if SCALING == BLOCKWISE:
            block = k0 // SCALE_BLOCK
            x_scale = tl.load(x_scales + block, mask=row_ok, other=0.0)[None, :]
            w_scale = tl.load(w_scales + block, mask=j_ok, other=0.0)[:, None]
            acc += tl.dot(w, xs) * x_scale * w_scale
        else:
            acc = tl.dot(w, xs, acc)
    if SCALING == ROWWISE:
        x_scale = tl.load(x_scale_ptr + token, mask=row_ok, other=0.0)[None, :]
        w_scale = tl.load(scale_ptr + g64 * 2 * inter + w_rows, mask=j_ok, other=0.0)[:, None]
        acc = acc * x_scale * w_scale
    return acc
