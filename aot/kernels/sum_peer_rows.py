"""Each token's rows summed where the peers made them: expert parallelism's
return on one host (gg_runtime/moe/transport.py).  Every rank's experts
write their outputs into a region of its symmetric buffer (torch's
SymmetricMemory), block s the rows of rank s's tokens; each rank then reads
its own block of every rank's region straight over NVLink and sums, so the
outputs travel once and are not stored again before the sum.

For every token t < T, with float32 arithmetic and one rounding:

    out[t] = sum over r in 0 .. W - 1 with index[t, r] >= 0 of
             (rank r's region at peers[r]) row FIRST + t

the ranks summed in order r = 0, 1, ...  peers [W] int64 holds each rank's
region address (16-byte aligned, rows H elements apart), index [T, W]
int64 says which ranks made token t's row (>= 0: one did), out [T, H] is
contiguous.  A rank whose index is negative is not read.
"""
import triton
import triton.language as tl

# Ranks read at once: the loop over the ranks is unrolled this far, so that a
# program's loads from different peers are in flight together.
RANKS = tl.constexpr(4)


@triton.jit
def sum_peer_rows_kernel(peers_ptr, index_ptr, out_ptr, T, H, W, FIRST, USE_TMA: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """Persistent: program p takes tiles p, p + P, ... of BM tokens x BN
    columns.  USE_TMA, BK, CHUNK and PRECISION are unused."""
    col_tiles = tl.cdiv(H, BN)
    for tile in range(tl.program_id(0), tl.cdiv(T, BM) * col_tiles, tl.num_programs(0)):
        tokens = ((tile // col_tiles) * BM + tl.arange(0, BM)).to(tl.int64)
        cols = (tile % col_tiles) * BN + tl.arange(0, BN)
        token_ok = tokens < T
        col_ok = cols < H
        rows = FIRST + tokens
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for first in range(0, W, RANKS):
            for s in tl.static_range(RANKS):  # in rank order: one sum whatever RANKS is
                rank = first + s
                made = tl.load(index_ptr + tokens * W + rank, mask=token_ok & (rank < W),
                               other=-1) >= 0
                address = tl.load(peers_ptr + rank, mask=rank < W, other=0)
                # The regions are 16-byte aligned: the aligned flavour's loads
                # (H a multiple of 8) go in 16-byte vectors.
                base = tl.multiple_of(address.to(tl.pointer_type(out_ptr.dtype.element_ty)), 16)
                values = tl.load(base + rows[:, None] * H + cols[None, :],
                                 mask=made[:, None] & col_ok[None, :], other=0.0)
                acc += values.to(tl.float32)
        tl.store(out_ptr + tokens[:, None] * H + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=token_ok[:, None] & col_ok[None, :])
