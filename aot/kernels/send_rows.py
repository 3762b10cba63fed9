"""Rows written into other GPUs' memory: expert parallelism's transport
(gg_runtime/moe/expert_parallelism.py).  Each rank's receive buffer is a
symmetric allocation (torch's SymmetricMemory) that every peer can address;
the kernel reads a table of those buffers' addresses and stores each row of
its input straight into the buffers the row goes to, over NVLink.

For every row r < R and each of its C destinations c with dest[r, c] >= 0:

    buffer of rank ranks[r, c], row dest[r, c]  <-  rows[r]

rows [R, H] 16-bit words (any 2-byte dtype, copied bit for bit), ranks
[R, C] int32 and dest [R, C] int64 are contiguous; peers [W] int64 holds
each rank's buffer address, 16-byte aligned, its rows H words apart.  Each
row is read once, however many buffers it goes to.
"""
import triton
import triton.language as tl


@triton.jit
def send_rows_kernel(rows_ptr, peers_ptr, ranks_ptr, dest_ptr, R, H, C, first_row,
                     USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """Persistent: program p takes tiles p, p + P, ... of BM rows x BN
    columns, counted from first_row's tile.  USE_TMA, BK, CHUNK and PRECISION
    are unused."""
    col_tiles = tl.cdiv(H, BN)
    tiles = tl.cdiv(R, BM) * col_tiles
    first_tile = (first_row // BM) * col_tiles
    for step in range(tl.program_id(0), tiles, tl.num_programs(0)):
        tile = (step + first_tile) % tiles
        rows = (tile // col_tiles) * BM + tl.arange(0, BM)
        cols = (tile % col_tiles) * BN + tl.arange(0, BN)
        row_ok = rows < R
        col_ok = cols < H
        first = rows.to(tl.int64)
        values = tl.load(rows_ptr + first[:, None] * H + cols[None, :],
                         mask=row_ok[:, None] & col_ok[None, :])
        for c in range(C):
            dest = tl.load(dest_ptr + first * C + c, mask=row_ok, other=-1)
            sent = dest >= 0
            rank = tl.load(ranks_ptr + first * C + c, mask=sent, other=0)
            address = tl.load(peers_ptr + rank, mask=sent, other=0)
            # The buffers are 16-byte aligned: the aligned flavour's stores
            # (H a multiple of 16) go in 16-byte vectors.
            base = tl.multiple_of(address.to(tl.pointer_type(rows_ptr.dtype.element_ty)), 16)
            tl.store(base[:, None] + dest[:, None] * H + cols[None, :], values,
                     mask=sent[:, None] & col_ok[None, :])
