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

With ARRIVE = 1 the launch ends in a barrier of the W ranks (flags [W]
int64: each rank's flags, W + 1 int32 words in its symmetric buffer, zero
before the first launch): the last program to finish its stores, found by
a counter (word W of this rank's flags, back to zero after), marks its
arrival in each peer's word RANK (0 to 1) and waits until each peer has
marked its own (1 to 0, ready for the next launch), every step release /
acquire at system scope, so that when the launch ends every peer's rows to
this rank have landed.  After timeout_ns it traps (a CUDA error on this
rank).  This saves the barrier kernel a send would otherwise be followed
by; the barrier before a send (every rank done reading the region) stays
the caller's.

The rows are BLOCKS equal blocks (R a multiple of BLOCKS), taken in turns:
the first tile of every block, then the second of every block, and so on.
A caller whose blocks go to different ranks (rows sent home, block s to
rank s) so stores into every peer at once, its own memory too, rather than
into one rank at a time.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer


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
def flag_of(flags_ptr, rank, word):
    """Word `word` of rank `rank`'s flags."""
    return tl.load(flags_ptr + rank).to(tl.pointer_type(tl.int32)) + word


@triton.jit
def swap_until(flag, expected, value, deadline, SEM: tl.constexpr):
    """Sets `flag` from `expected` to `value` once it holds `expected` (a
    compare-and-swap, system scope), or traps past `deadline` (globaltimer ns)."""
    while tl.atomic_cas(flag, expected, value, sem=SEM, scope="sys") != expected:
        if globaltimer() > deadline:
            tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def arrive(flags_ptr, RANK, W, timeout_ns):
    """The launch's barrier (the module's docstring), from every program once
    its stores are issued; the last one to arrive meets the peers."""
    tl.debug_barrier()  # every thread's stores before this program's arrival
    counter = flag_of(flags_ptr, RANK, W)
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="sys") == tl.num_programs(0) - 1:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
        deadline = globaltimer() + timeout_ns
        for peer in range(W):
            if peer != RANK:
                swap_until(flag_of(flags_ptr, peer, RANK), 0, 1, deadline, "release")
        for peer in range(W):
            if peer != RANK:
                swap_until(flag_of(flags_ptr, RANK, peer), 1, 0, deadline, "acquire")


@triton.jit
def send_rows_kernel(rows_ptr, peers_ptr, ranks_ptr, dest_ptr, R, H, C, BLOCKS, rows2_ptr,
                     peers2_ptr, H2, rows3_ptr, peers3_ptr, H3, flags_ptr, RANK, W, ARRIVE,
                     timeout_ns, USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
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
        sent_anywhere = tl.zeros((BM,), dtype=tl.int1)
        for c in range(C):
            dest = tl.load(dest_ptr + first * C + c, mask=row_ok, other=-1)
            sent_anywhere = sent_anywhere | (dest >= 0)
        col_tile = tile % col_tiles
        if col_tile < tiles1:
            store_tile(rows_ptr, peers_ptr, ranks_ptr, dest_ptr, first, row_ok, sent_anywhere,
                       col_tile * BN + tl.arange(0, BN), H, C)
        elif col_tile < tiles1 + tiles2:
            store_tile(rows2_ptr, peers2_ptr, ranks_ptr, dest_ptr, first, row_ok, sent_anywhere,
                       (col_tile - tiles1) * BN + tl.arange(0, BN), H2, C)
        else:
            store_tile(rows3_ptr, peers3_ptr, ranks_ptr, dest_ptr, first, row_ok, sent_anywhere,
                       (col_tile - tiles1 - tiles2) * BN + tl.arange(0, BN), H3, C)
    if ARRIVE != 0:
        arrive(flags_ptr, RANK, W, timeout_ns)
