"""grouped_gemm's kernel (the tutorial's problem): G independent C_g = A_g @ B_g with
per-group pointers, sizes and leading dimensions, all any value.

Metadata is int64 words the runtime copies to the GPU in one copy:
    group_table[g * len(GROUP_FIELDS) + i] = field i of group g (GROUP_FIELDS order)
    tile_ends[g]                            = tiles of groups 0..g (inclusive prefix sum)
The host knows every size, so it computes the prefix; the kernel only looks it up.
"""
import triton
import triton.language as tl

from .tiles import first_step_past, tile_mma, tile_store

# The word order of one group's entry; the family description gives each a role.
GROUP_FIELDS = ("a", "b", "c", "M", "N", "K", "lda", "ldb", "ldc")
FIELDS = tl.constexpr(len(GROUP_FIELDS))


def _word(name: str) -> tl.constexpr:
    return tl.constexpr(GROUP_FIELDS.index(name))


A_, B_, C_, M_, N_, K_ = _word("a"), _word("b"), _word("c"), _word("M"), _word("N"), _word("K")
LDA_, LDB_, LDC_ = _word("lda"), _word("ldb"), _word("ldc")


@triton.jit
def grouped_gemm_kernel(group_table, tile_ends, G,
                     DTYPE: tl.constexpr, B_T: tl.constexpr, USE_TMA: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                     PRECISION: tl.constexpr):
    """A_g [M, K] row-major, B_g [K, N] (B_T=0) or [N, K] (B_T=1), C_g [M, N] row-major.

    Persistent: program p takes tiles p, p + P, ... of the list made of every
    group's tiles (m-tile fastest).  Groups are visited CHUNK at a time; inside
    a slice the owner of a tile is a vector compare against the tile prefix.
    """
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    lane = tl.arange(0, CHUNK)
    for chunk in range(0, G, CHUNK):
        in_range = chunk + lane < G
        ends = tl.load(tile_ends + chunk + lane, mask=in_range, other=0)
        chunk_end = tl.max(ends).to(tl.int32)
        chunk_start = tl.load(tile_ends + chunk - 1, mask=chunk > 0, other=0).to(tl.int32)
        # Derived, not carried from the previous chunk: Triton 3.6's
        # remove-layout-conversions pass drops a loop-carried scalar that is
        # used as an inner loop's lower bound (seen in the TTGIR; wrong tiles ran).
        for t in range(first_step_past(pid, chunk_start, num_programs), chunk_end, num_programs):
            g = chunk + tl.sum((in_range & (ends <= t)).to(tl.int32))
            first_tile = tl.load(tile_ends + g - 1, mask=g > 0, other=0)
            row = group_table + g.to(tl.int64) * FIELDS
            a_ptr = tl.load(row + A_).to(tl.pointer_type(DTYPE))
            b_ptr = tl.load(row + B_).to(tl.pointer_type(DTYPE))
            c_ptr = tl.load(row + C_).to(tl.pointer_type(DTYPE))
            M = tl.load(row + M_).to(tl.int32)
            N = tl.load(row + N_).to(tl.int32)
            K = tl.load(row + K_).to(tl.int32)
            lda = tl.load(row + LDA_)
            ldb = tl.load(row + LDB_)
            ldc = tl.load(row + LDC_)
            in_group = (t - first_tile).to(tl.int32)
            m_tiles = tl.cdiv(M, BM)
            off_m = (in_group % m_tiles) * BM
            off_n = (in_group // m_tiles) * BN
            acc = tile_mma(a_ptr, b_ptr, off_m, off_n, 0, K, M, N, lda, ldb,
                           False, B_T, USE_TMA, BM, BN, BK, PRECISION)
            tile_store(c_ptr, acc, off_m, off_n, M, N, ldc, USE_TMA, BM, BN)
