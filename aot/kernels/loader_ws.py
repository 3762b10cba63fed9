"""The loader partition of the warp-specialised kernels: it walks its
program's tiles and, K block by K block, waits until a ring slot is free
(`empty`), then has TMA fill it (`ready` completes when the bytes have
landed); a loader that gathers A's rows through an index (ragged_glu) is a
warpgroup whose threads copy them (gather_rows, copy_rows).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, mbarrier

from .gluon_api import cp_async_load, tma_load, tma_load_multicast
from .ws import chunk_groups, first_step_past, locate, row_alignment


@gluon.jit
def claim_slot(ready, empty, count, nbytes: gl.constexpr, STAGES: gl.constexpr):
    """(slot, its ready barrier) for the loader's load number `count`: waits
    until the slot's last reader has freed it, then has its barrier expect
    nbytes (the full boxes land, zero-filled past the bounds)."""
    slot = count % STAGES
    mbarrier.wait(empty.index(slot), (count // STAGES & 1) ^ 1)
    bar = ready.index(slot)
    mbarrier.expect(bar, nbytes)
    return slot, bar


@gluon.constexpr_function
def copy_elements(dtype):
    """Elements of `dtype` in one 16-byte copy."""
    return 128 // dtype.primitive_bitwidth


@gluon.constexpr_function
def gather_layout(BM, BK, warps, dtype):
    """The loader's [BM, BK] copy of gathered rows of `dtype`: 16 bytes
    (copy_elements) a copy, a row's BK elements across BK / copy_elements threads."""
    vector = copy_elements(dtype)
    lanes = BK // vector
    return gl.BlockedLayout([1, vector], [32 // lanes, lanes], [warps, 1], [1, 0])


@gluon.jit
def gather_rows(gather, off_m, end, BM: gl.constexpr, BK: gl.constexpr):
    """([BM, 1] addresses, [BM, 1] mask) of the tile's rows off_m .. (those
    below end), row r being a[rows[r] // rows_div] for gather = (a_ptr, lda,
    rows_ptr, rows_div); rows_div = 0: a[r] (rows not read)."""
    a_ptr, lda, rows_ptr, rows_div = gather
    layout: gl.constexpr = gather_layout(BM, BK, gl.num_warps(), a_ptr.dtype.element_ty)
    rm = off_m + gl.arange(0, BM, gl.SliceLayout(1, layout))
    ok = rm < end
    src = gl.load(rows_ptr + rm, mask=ok & (rows_div != 0), other=0) // gl.maximum(rows_div, 1)
    src = gl.where(rows_div != 0, src, rm)
    # The TMA flavour's rules (csrc/run.cc): a 16-byte aligned base and row
    # stride, so each thread's elements are one 16-byte copy.
    rows = gl.multiple_of(a_ptr + src * lda, 16)
    return gl.expand_dims(rows, 1), gl.expand_dims(ok, 1)


@gluon.jit
def copy_rows(buf, rows, row_ok, k0, K, bar, BK: gl.constexpr):
    """Columns k0 .. k0 + BK of gather_rows' rows into buf (zeros past K or the
    rows), each thread's copies arriving on bar when they land."""
    layout: gl.constexpr = gather_layout(buf.shape[0], BK, gl.num_warps(), buf.dtype)
    VECTOR: gl.constexpr = copy_elements(buf.dtype)
    cols = gl.max_contiguous(
        gl.multiple_of(k0 + gl.arange(0, BK, gl.SliceLayout(0, layout)), VECTOR), VECTOR)
    # K is a row_length where this runs (a multiple of 16 bytes: its role in
    # the gathering families): whole copies are in or out.
    in_k = gl.max_constancy(cols < K, VECTOR)
    cp_async_load(buf, rows + gl.expand_dims(cols, 0), row_ok & gl.expand_dims(in_k, 0))
    async_copy.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def fill_a(a_desc, a_bufs, ready, empty, count, gathered, rows, row_ok, off_m, k0, K,
           A_BYTES: gl.constexpr, B_BYTES: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """(slot, its ready barrier) of a loader that may gather (load_partition's
    gather), A's block in it: gathered, its threads copy the rows; else TMA
    loads them and one arrival stands for the threads'."""
    if gathered:
        slot, bar = claim_slot(ready, empty, count, B_BYTES, STAGES)
        copy_rows(a_bufs.index(slot), rows, row_ok, k0, K, bar, BK)
    else:
        slot, bar = claim_slot(ready, empty, count, A_BYTES + B_BYTES, STAGES)
        tma_load(a_desc, [off_m, k0], bar, a_bufs.index(slot))
        mbarrier.arrive(bar, count=32 * gl.num_warps())
    return slot, bar


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, T, N, K, G,
                   A_T: gl.constexpr, B_T: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                   BK: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr,
                   CTAS: gl.constexpr = 1, HALVES: gl.constexpr = False, gather=None,
                   C_T: gl.constexpr = False):
    """HALVES: b's block is the rows of its two halves (ring_setup).  gather
    (gather_rows'; None: A's blocks come by TMA): each slot's `ready` also
    counts one arrival of each of this partition's threads (ring_setup's
    COPIERS), and where gather's rows_div is not 0, A's rows are gathered and
    copied by those threads (gather_rows); where it is 0, A's block is loaded
    by TMA and the arrivals made in one.  C_T: c is stored transposed (tiles
    start as row_alignment says)."""
    ALIGN: gl.constexpr = row_alignment(A_T, C_T, a_bufs.dtype)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_tiles = (N + BN - 1) // BN
    # Bytes TMA lands in each CTA: its share of A's rows (unless gathered) and
    # all of B's block.
    A_BYTES: gl.constexpr = BM // CTAS * BK * a_bufs.dtype.primitive_bitwidth // 8
    B_BYTES: gl.constexpr = BN * BK * a_bufs.dtype.primitive_bitwidth // 8
    count = 0
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = chunk_groups(
            offs_ptr, chunk, T, G, rows_before, tiles_before, n_tiles, BM, ALIGN, CHUNK,
            gl.num_warps(), CTAS)
        chunk_end = tiles_before + gl.sum(group_tiles, 0)
        for t in range(first_step_past(pid, tiles_before, programs), chunk_end, programs):
            g, start, end, off_m, off_n, k_end = locate(t, chunk, starts, ends, group_tiles,
                                                        tiles_end, n_tiles, G, K, BM, BN, ALIGN)
            if gather is not None:
                rows, row_ok = gather_rows(gather, off_m, end, BM, BK)
            for k0 in range(0, k_end, BK):
                if gather is not None:
                    slot, bar = fill_a(a_desc, a_bufs, ready, empty, count, gather[3] != 0, rows,
                                       row_ok, off_m, k0, K, A_BYTES, B_BYTES, BK, STAGES)
                else:
                    slot, bar = claim_slot(ready, empty, count, A_BYTES + B_BYTES, STAGES)
                    a_origin = [k0, off_m] if A_T else [off_m, k0]
                    tma_load(a_desc, a_origin, bar, a_bufs.index(slot))
                b_buf = b_bufs.index(slot).reinterpret(b_desc.dtype, b_desc.block_shape,
                                                       b_desc.layout)
                if HALVES:
                    b_origin = [g, 0, off_n // 2, k0]
                else:
                    b_origin = [g, off_n, k0] if B_T else [g, k0, off_n]
                if CTAS == 1:
                    tma_load(b_desc, b_origin, bar, b_buf)
                else:
                    tma_load_multicast(b_desc, b_origin, bar, b_buf)
                count += 1
        tiles_before = chunk_end
        rows_before = gl.max(ends, 0)
