"""Routing for moe_experts, a stable counting sort of the token slots by
expert in three launches (phases), int32 counts in a scratch `hist`
[CHUNKS + 1, BN]:

ids [N] int64, the expert of each token slot (t * k + j).  A slot's bin is its
id where 0 <= id < E, else E (a dropped slot: sorted after every group).
Slots are taken BM at a time (chunk c holds slots c * BM ...).

count (PHASE 0):  hist[c, b] = the slots of chunk c in bin b
scan  (PHASE 1):  hist[c, b] = the slots in bin b of the chunks before c,
                  hist[CHUNKS, b] = bin b's total
place (PHASE 2):  offs[e] = the end of group e (e < E); a slot's sorted
                  position is where its bin starts + hist[c, b] + its rank
                  among chunk c's slots of bin b (a sort of the chunk's
                  (bin, slot) keys gives it): order[position] = slot,
                  inverse[slot] = position.
single (PHASE 3): all three for CHUNKS = 1, in one program (hist not used).
The bins need E + 1 <= BN.
"""
import triton
import triton.language as tl

SCAN_BINS = tl.constexpr(32)  # bins per step of the scan
SCAN_CHUNKS = tl.constexpr(64)  # chunks per step of the scan


@triton.jit
def route_kernel(ids_ptr, hist_ptr, order_ptr, inverse_ptr, offs_ptr, N, E, CHUNKS,
                 PHASE: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                 PRECISION: tl.constexpr):
    """Persistent: program p takes chunks (count, place) or blocks of
    SCAN_BINS bins (scan) p, p + P, ...  USE_TMA, BK, CHUNK and PRECISION
    (GEMM constexprs every variant receives) are unused."""
    if PHASE == 0:
        for c in range(tl.program_id(0), CHUNKS, tl.num_programs(0)):
            count_chunk(ids_ptr, hist_ptr, c, N, E, BM, BN)
    elif PHASE == 1:
        for block in range(tl.program_id(0), BN // SCAN_BINS, tl.num_programs(0)):
            scan_bins(hist_ptr, block, CHUNKS, BN)
    elif PHASE == 2:
        totals = tl.load(hist_ptr + CHUNKS.to(tl.int64) * BN + tl.arange(0, BN))
        ends = tl.cumsum(totals, 0)
        if tl.program_id(0) == 0:
            tl.store(offs_ptr + tl.arange(0, BN), ends, mask=tl.arange(0, BN) < E)
        for c in range(tl.program_id(0), CHUNKS, tl.num_programs(0)):
            before = tl.load(hist_ptr + c.to(tl.int64) * BN + tl.arange(0, BN))
            place_chunk(ids_ptr, order_ptr, inverse_ptr, c, ends - totals, before, N, E, BM, BN)
    else:
        bins, exists = bins_of(ids_ptr, 0, N, E, BM)
        totals = tl.histogram(bins, BN, mask=exists)
        ends = tl.cumsum(totals, 0)
        tl.store(offs_ptr + tl.arange(0, BN), ends, mask=tl.arange(0, BN) < E)
        place_chunk(ids_ptr, order_ptr, inverse_ptr, 0, ends - totals, totals * 0, N, E, BM, BN)


@triton.jit
def bins_of(ids_ptr, c, N, E, BM: tl.constexpr):
    """Chunk c's slots' bins (int32) and which slots exist (< N)."""
    slots = c * BM + tl.arange(0, BM)
    exists = slots < N
    ids = tl.load(ids_ptr + slots, mask=exists, other=-1)
    return tl.where((ids >= 0) & (ids < E), ids, E).to(tl.int32), exists


@triton.jit
def count_chunk(ids_ptr, hist_ptr, c, N, E, BM: tl.constexpr, BN: tl.constexpr):
    bins, exists = bins_of(ids_ptr, c, N, E, BM)
    counts = tl.histogram(bins, BN, mask=exists)
    tl.store(hist_ptr + c.to(tl.int64) * BN + tl.arange(0, BN), counts)


@triton.jit
def scan_bins(hist_ptr, block, CHUNKS, BN: tl.constexpr):
    """Bins block * SCAN_BINS ...: each chunk's count becomes the sum over the
    chunks before it; their totals go to row CHUNKS."""
    bins = block * SCAN_BINS + tl.arange(0, SCAN_BINS)
    carry = tl.zeros((SCAN_BINS,), dtype=tl.int32)
    for c0 in range(0, CHUNKS, SCAN_CHUNKS):
        chunks = c0 + tl.arange(0, SCAN_CHUNKS)
        at = hist_ptr + chunks.to(tl.int64)[:, None] * BN + bins[None, :]
        mask = (chunks < CHUNKS)[:, None] & (bins < BN)[None, :]
        counts = tl.load(at, mask=mask, other=0)
        tl.store(at, tl.cumsum(counts, 0) - counts + carry[None, :], mask=mask)
        carry += tl.sum(counts, 0)
    tl.store(hist_ptr + CHUNKS.to(tl.int64) * BN + bins, carry)


@triton.jit
def place_chunk(ids_ptr, order_ptr, inverse_ptr, c, starts, before, N, E, BM: tl.constexpr,
                BN: tl.constexpr):
    """Chunk c's slots to their sorted positions: the chunk's (bin, slot) keys
    sorted give each slot's rank within its bin (slots past N sort last);
    `before`: each bin's slots in the chunks before c."""
    bins, exists = bins_of(ids_ptr, c, N, E, BM)
    keys = tl.sort(tl.where(exists, bins, BN) * BM + tl.arange(0, BM))
    sorted_bin = tl.minimum(keys // BM, BN - 1)
    slot = c * BM + keys % BM
    counts = tl.histogram(bins, BN, mask=exists)
    # Position of the i-th sorted slot: its bin's start, the slots of that bin in
    # earlier chunks, then i less the index of the bin's first slot in this chunk.
    base = starts + before - (tl.cumsum(counts, 0) - counts)
    position = tl.gather(base, sorted_bin, 0) + tl.arange(0, BM)
    placed = slot < N
    tl.store(order_ptr + position, slot.to(tl.int64), mask=placed)
    tl.store(inverse_ptr + slot, position.to(tl.int64), mask=placed)
