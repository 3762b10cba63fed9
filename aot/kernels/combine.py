"""The weighted combine that ends an MoE layer's experts: each token's k
expert outputs, read where the down projection wrote them (rows sorted by
expert), scaled by the token's routing weights and summed; float32
arithmetic, one rounding per output.

out[t] = sum_j weights[t, j] * rows[index[t, j]]   over the j with
         0 <= index[t, j] < min(offs[G - 1], R) (the rows of the G groups; a
         slot past them is a dropped one and adds nothing, whatever its weight)

rows [R, H] (row-major, row stride H), index [T, K] int64, weights [T, K]
float32 and out [T, H] are contiguous; offs [G] int32 holds the groups' end
offsets.  It replaces an index_select of [T * K, H] rows and a batched
product over K: the rows are read once, the [T, K, H] copy is never written.
"""
import triton
import triton.language as tl


@triton.jit
def combine_kernel(rows_ptr, index_ptr, weights_ptr, offs_ptr, out_ptr, R, T, H, K, G,
                   USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """Persistent: program p takes tiles p, p + P, ... of BM tokens x BN
    columns (the runtime launches min(`tiles`, one wave) programs).  USE_TMA,
    BK, CHUNK and PRECISION (GEMM constexprs every variant receives) are unused."""
    end = 0
    if G > 0:
        end = tl.minimum(tl.load(offs_ptr + G - 1), R)
    col_tiles = tl.cdiv(H, BN)
    for tile in range(tl.program_id(0), tl.cdiv(T, BM) * col_tiles, tl.num_programs(0)):
        tokens = (tile // col_tiles) * BM + tl.arange(0, BM)
        cols = (tile % col_tiles) * BN + tl.arange(0, BN)
        combine_tile(rows_ptr, index_ptr, weights_ptr, out_ptr, tokens, cols, end, T, H, K,
                     BM, BN)


# Slots read at once: the loop over a token's k slots is unrolled this far,
# so that a program's k index loads, then its k row loads, are in flight
# together rather than one slot's after another's.
SLOTS = tl.constexpr(4)


@triton.jit
def combine_tile(rows_ptr, index_ptr, weights_ptr, out_ptr, tokens, cols, end, T, H, K,
                 BM: tl.constexpr, BN: tl.constexpr):
    token_ok = tokens < T
    col_ok = cols < H
    slots = tokens.to(tl.int64) * K
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for first in range(0, K, SLOTS):
        for s in tl.static_range(SLOTS):  # in slot order: one sum whatever SLOTS is
            j = first + s
            slot_ok = token_ok & (j < K)
            row = tl.load(index_ptr + slots + j, mask=slot_ok, other=-1)
            kept = slot_ok & (row >= 0) & (row < end)
            weight = tl.load(weights_ptr + slots + j, mask=kept, other=0.0)
            values = tl.load(rows_ptr + row[:, None] * H + cols[None, :],
                             mask=kept[:, None] & col_ok[None, :], other=0.0)
            acc += weight[:, None] * values.to(tl.float32)
    out = out_ptr + tokens.to(tl.int64)[:, None] * H + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=token_ok[:, None] & col_ok[None, :])


@triton.jit
def combine_parts_kernel(parts_ptr, ids_ptr, weights_ptr, out_ptr, T, H, K, G, P,
                         USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """The combine of rows made in P parts (the decode forward's, kernels/
    experts_decode.py): parts [T * K, P, H] float32, slot s = t * K + j's
    parts at s * P .. s * P + P - 1, contiguous, in the slots' own order;

    out[t] = sum over j, c of weights[t, j] * parts[t * K + j, c]

    over the j with 0 <= ids[t, j] < G (a dropped slot's parts are never
    written, and add nothing whatever its weight).  Persistent: program p
    takes tiles p, p + P, ... of one token x BN columns; a tile's K * P parts
    are read BK at a time (the loads of a step in flight together), each
    step summed in one fixed order.  USE_TMA, BM, CHUNK and PRECISION are
    unused."""
    col_tiles = tl.cdiv(H, BN)
    for tile in range(tl.program_id(0), T * col_tiles, tl.num_programs(0)):
        token = tile // col_tiles
        cols = (tile % col_tiles) * BN + tl.arange(0, BN)
        col_ok = cols < H
        slots = token.to(tl.int64) * K
        acc = tl.zeros((BN,), dtype=tl.float32)
        for first in range(0, K * P, BK):
            pair = first + tl.arange(0, BK)
            pair_ok = pair < K * P
            j = pair // P
            expert = tl.load(ids_ptr + slots + j, mask=pair_ok, other=-1)
            kept = pair_ok & (expert >= 0) & (expert < G)
            weight = tl.load(weights_ptr + slots + j, mask=kept, other=0.0)
            values = tl.load(parts_ptr + ((slots + j) * P + pair % P)[:, None] * H + cols[None, :],
                             mask=kept[:, None] & col_ok[None, :], other=0.0)
            acc += tl.sum(values * weight[:, None], axis=0)
        tl.store(out_ptr + token.to(tl.int64) * H + cols, acc.to(out_ptr.dtype.element_ty),
                 mask=col_ok)
