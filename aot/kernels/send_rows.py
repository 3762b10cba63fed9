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
row is read once, however many buffers it goes to, and a row going nowhere
is not read.  Up to two more row sets travel with the rows in the same
launch (a token's metadata, its scales): rows2 [R, H2] to row dest[r, c]
of the buffers at peers2 (rows H2 words apart), rows3 likewise; H2 = 0 or
H3 = 0 where there are none.

The rows are BLOCKS equal blocks (R a multiple of BLOCKS), taken in turns:
the first tile of every block, then the second of every block, and so on.
A caller whose blocks go to different ranks (rows sent home, block s to
rank s) so stores into every peer at once, its own memory too, rather than
into one rank at a time.

send_fp8_rows_kernel sends 16-bit tokens quantized on the way, as
quantize_fp8 quantizes them per 128 columns (aot/kernels/quantize.py): for
every row r < R and destination c with dest[r, c] >= 0, of rank
q = ranks[r, c]:

    buffer at peers[q], row dest[r, c]        <-  x[r] / scale[r] (fp8 e4m3)
    buffer at scale_peers[q], row dest[r, c]  <-  scale[r, :] (float32)
    buffer at meta_peers[q], row dest[r, c]   <-  meta[r] (HM 16-bit words)

x [R, H] 16-bit, its rows' fp8 values H bytes apart there, their
cdiv(H, 128) scales that many float32 apart.  Each 128 columns of a row are
read once and quantized once, however many buffers they go to.
"""
import triton
import triton.language as tl

from .quantize import BLOCK, scale_of, to_e4m3


@triton.jit
def store_tile(rows_ptr, peers_ptr, ranks_ptr, dest_ptr, first, row_ok, sent_anywhere, cols, H,
               C):
    """The tile's rows (first [BM] of rows [R, H]) at columns cols, stored
    into each of their destinations."""
    col_ok = cols < H
    values = tl.load(rows_ptr + first[:, None] * H + cols[None, :],
                     mask=sent_anywhere[:, None] & col_ok[None, :])
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


@triton.jit
def sent_anywhere(dest_ptr, first, row_ok, C):
    """Whether each row (first [BM]) goes to at least one of its C destinations."""
    sent = tl.zeros(first.shape, dtype=tl.int1)
    for c in range(C):
        dest = tl.load(dest_ptr + first * C + c, mask=row_ok, other=-1)
        sent = sent | (dest >= 0)
    return sent


@triton.jit
def send_rows_kernel(rows_ptr, peers_ptr, ranks_ptr, dest_ptr, R, H, C, BLOCKS, rows2_ptr,
                     peers2_ptr, H2, rows3_ptr, peers3_ptr, H3, USE_TMA: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                     PRECISION: tl.constexpr):
    """Persistent: program p takes steps p, p + P, ..., each a tile of BM rows
    x BN columns of block step % BLOCKS, its columns those of rows, then of
    rows2, then of rows3.  USE_TMA, BK, CHUNK and PRECISION are unused."""
    tiles1 = tl.cdiv(H, BN)
    tiles2 = tl.cdiv(H2, BN)
    col_tiles = tiles1 + tiles2 + tl.cdiv(H3, BN)
    block_rows = R // BLOCKS
    block_tiles = tl.cdiv(block_rows, BM) * col_tiles
    for step in range(tl.program_id(0), block_tiles * BLOCKS, tl.num_programs(0)):
        block = step % BLOCKS
        tile = step // BLOCKS
        in_block = (tile // col_tiles) * BM + tl.arange(0, BM)
        first = (block * block_rows + in_block).to(tl.int64)
        row_ok = in_block < block_rows
        sent = sent_anywhere(dest_ptr, first, row_ok, C)
        col_tile = tile % col_tiles
        if col_tile < tiles1:
            store_tile(rows_ptr, peers_ptr, ranks_ptr, dest_ptr, first, row_ok, sent,
                       col_tile * BN + tl.arange(0, BN), H, C)
        elif col_tile < tiles1 + tiles2:
            store_tile(rows2_ptr, peers2_ptr, ranks_ptr, dest_ptr, first, row_ok, sent,
                       (col_tile - tiles1) * BN + tl.arange(0, BN), H2, C)
        else:
            store_tile(rows3_ptr, peers3_ptr, ranks_ptr, dest_ptr, first, row_ok, sent,
                       (col_tile - tiles1 - tiles2) * BN + tl.arange(0, BN), H3, C)


@triton.jit
def store_quantized_tile(x_ptr, peers_ptr, scale_peers_ptr, ranks_ptr, dest_ptr, first, row_ok,
                         sent, block, H, C, BN: tl.constexpr):
    """The tile's rows' 128 columns `block` (first [BM] of x [R, H]) quantized
    and stored, with their scales, into each of their destinations."""
    cols = block * BN + tl.arange(0, BN)
    col_ok = cols < H
    x = tl.load(x_ptr + first[:, None] * H + cols[None, :],
                mask=sent[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    scale = scale_of(tl.max(tl.abs(x), axis=1))
    q = to_e4m3(x, scale[:, None])
    blocks = tl.cdiv(H, BN)
    for c in range(C):
        dest = tl.load(dest_ptr + first * C + c, mask=row_ok, other=-1)
        to_rank = dest >= 0
        rank = tl.load(ranks_ptr + first * C + c, mask=to_rank, other=0)
        values = tl.load(peers_ptr + rank, mask=to_rank, other=0)
        values = tl.multiple_of(values.to(tl.pointer_type(tl.float8e4nv)), 16)
        scales = tl.load(scale_peers_ptr + rank, mask=to_rank, other=0)
        scales = scales.to(tl.pointer_type(tl.float32))
        tl.store(values[:, None] + dest[:, None] * H + cols[None, :], q,
                 mask=to_rank[:, None] & col_ok[None, :])
        tl.store(scales + dest * blocks + block, scale, mask=to_rank)


@triton.jit
def send_fp8_rows_kernel(x_ptr, peers_ptr, scale_peers_ptr, ranks_ptr, dest_ptr, R, H, C,
                         meta_ptr, meta_peers_ptr, HM, USE_TMA: tl.constexpr, BM: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                         PRECISION: tl.constexpr):
    """Persistent: program p takes steps p, p + P, ..., each a tile of BM rows
    and BN columns: of x, quantized (BN = 128, a scale's columns), then of
    meta.  USE_TMA, BK, CHUNK and PRECISION are unused."""
    tl.static_assert(BN == BLOCK, "a tile's columns are one scale's")
    blocks = tl.cdiv(H, BN)
    col_tiles = blocks + tl.cdiv(HM, BN)
    for step in range(tl.program_id(0), tl.cdiv(R, BM) * col_tiles, tl.num_programs(0)):
        rows = (step // col_tiles) * BM + tl.arange(0, BM)
        first = rows.to(tl.int64)
        row_ok = rows < R
        sent = sent_anywhere(dest_ptr, first, row_ok, C)
        col_tile = step % col_tiles
        if col_tile < blocks:
            store_quantized_tile(x_ptr, peers_ptr, scale_peers_ptr, ranks_ptr, dest_ptr, first,
                                 row_ok, sent, col_tile, H, C, BN)
        else:
            store_tile(meta_ptr, meta_peers_ptr, ranks_ptr, dest_ptr, first, row_ok, sent,
                       (col_tile - blocks) * BN + tl.arange(0, BN), HM, C)
