"""Expert parallelism's plan on the GPU (gg_runtime/moe/expert_parallelism.py),
both ends of a dispatch, each in one launch instead of a dozen of torch's.
W ranks, EPR experts each (rank r: experts r * EPR ..), CAP rows a block:
rank s's token t lands in row t of block s of the ranks it goes to.

dispatch_plan_kernel, on the sending rank RANK, for its T tokens of K slots
(ids [T, K] int64, weights [T, K] float32), a slot kept where its id is in
[0, W * EPR):

    dest  [T, W] int64: RANK * CAP + t where token t goes to rank r (one of
                        its kept ids is r's), else -1 (its row there)
    index [T, W] int64: r * CAP + t where it goes, else -1 (>= 0: rank r
                        makes an output for it)
    meta  [T, 2K] int32: its ids (-1 where not kept), then its weights' bits

received_slots_kernel, on the receiving rank RANK, for the R = W * CAP rows
of its metadata (meta [R, 2K] int32, all -1 where no rank sent the row):

    ids     [R, K] int64: id - RANK * EPR where the id is one of this rank's
                          experts, else -1
    weights [R, K] float32: the weight where ids >= 0, else 0

and meta left all -1 once read: blank for the next dispatch, no launch of its
own.

BM rows a program step, BK >= K slots (masked), BN ranks at a time.
"""
import triton
import triton.language as tl


@triton.jit
def dispatch_plan_kernel(ids_ptr, weights_ptr, dest_ptr, index_ptr, meta_ptr, T, K, W, EPR,
                         RANK, CAP, USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """Persistent: program p takes tiles p, p + P, ... of BM tokens.  USE_TMA,
    CHUNK and PRECISION are unused."""
    slots = tl.arange(0, BK)
    for tile in range(tl.program_id(0), tl.cdiv(T, BM), tl.num_programs(0)):
        tokens = (tile * BM + tl.arange(0, BM)).to(tl.int64)
        slot_ok = (tokens < T)[:, None] & (slots < K)[None, :]
        at = tokens[:, None] * K + slots[None, :]
        ids = tl.load(ids_ptr + at, mask=slot_ok, other=-1)
        kept = (ids >= 0) & (ids < W.to(tl.int64) * EPR)
        kept_ids = tl.where(kept, ids, -1)
        weights = tl.load(weights_ptr + at, mask=slot_ok, other=0.0)
        meta = meta_ptr + tokens[:, None] * (2 * K) + slots[None, :]
        tl.store(meta, kept_ids.to(tl.int32), mask=slot_ok)
        tl.store(meta + K, weights.to(tl.int32, bitcast=True), mask=slot_ok)
        owner = tl.where(kept, kept_ids // EPR, -1)
        for first in range(0, W, BN):
            ranks = first + tl.arange(0, BN)
            hits = (owner[:, :, None] == ranks[None, None, :]).to(tl.int32)
            goes = tl.max(hits, axis=1) > 0  # [BM, BN]
            at_rank = tokens[:, None] * W + ranks[None, :]
            rank_ok = (tokens < T)[:, None] & (ranks < W)[None, :]
            tl.store(dest_ptr + at_rank, tl.where(goes, RANK.to(tl.int64) * CAP + tokens[:, None],
                                                  -1), mask=rank_ok)
            tl.store(index_ptr + at_rank, tl.where(goes, ranks[None, :].to(tl.int64) * CAP
                                                   + tokens[:, None], -1), mask=rank_ok)


@triton.jit
def received_slots_kernel(meta_ptr, ids_ptr, weights_ptr, R, K, EPR, RANK,
                          USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """Persistent: program p takes tiles p, p + P, ... of BM rows.  USE_TMA,
    BN, CHUNK and PRECISION are unused."""
    slots = tl.arange(0, BK)
    for tile in range(tl.program_id(0), tl.cdiv(R, BM), tl.num_programs(0)):
        rows = (tile * BM + tl.arange(0, BM)).to(tl.int64)
        row_ok = rows < R
        slot_ok = row_ok[:, None] & (slots < K)[None, :]
        meta = meta_ptr + rows[:, None] * (2 * K) + slots[None, :]
        ids = tl.load(meta, mask=slot_ok, other=-1)
        weights = tl.load(meta + K, mask=slot_ok, other=0).to(tl.float32, bitcast=True)
        blank = tl.full((BM, BK), -1, tl.int32)
        tl.store(meta, blank, mask=slot_ok)
        tl.store(meta + K, blank, mask=slot_ok)
        local = ids - RANK * EPR
        here = (ids >= 0) & (local >= 0) & (local < EPR)
        at = rows[:, None] * K + slots[None, :]
        tl.store(ids_ptr + at, tl.where(here, local, -1).to(tl.int64), mask=slot_ok)
        tl.store(weights_ptr + at, tl.where(here, weights, 0.0), mask=slot_ok)
