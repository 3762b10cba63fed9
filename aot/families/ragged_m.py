"""ragged_m: out[T, N], rows offs[g-1]:offs[g] of a [T, K] times b[g] -- the MoE
forward (grouped_mm 2-D x 3-D) and its dA."""
from ..family import Family, Param
from ..kernels.ragged import ragged_m_kernel

# Ragged TMA descriptors clip rows with a 2**30-row dimension (kernels/ragged.py).
RAGGED_ROWS_LIMIT = 2 ** 30
# The ragged families' first parameters: operands, output, group end offsets.
POINTERS = (
    Param("a_ptr", "*T", "operand", aligned=True),
    Param("b_ptr", "*T", "operand", aligned=True),
    Param("c_ptr", "*O", "output", aligned=True),
    Param("offs_ptr", "*i32", "offsets"),
)

FAMILY = Family(
    name="ragged_m",
    kernel=ragged_m_kernel,
    params=POINTERS + (
        Param("T", "i32", "extent", tma_limit=RAGGED_ROWS_LIMIT),
        Param("N", "i32", "extent", aligned=True),
        Param("K", "i32", "extent", aligned=True),
        Param("G", "i32", "count"),
        Param("lda", "i64", "stride", aligned=True),
        Param("b_group_stride", "i64", "stride", aligned=True),
        Param("ldb", "i64", "stride", aligned=True),
        Param("ldc", "i64", "stride", aligned=True),
    ),
    # a [T, K] row-major ('n.') or a transposed view of [K, T] ('t.', as in 3-D x 2-D);
    # b [G, K, N] row-major ('.n') or a transposed view of [G, N, K] ('.t').
    layouts={"nn": {"A_T": False, "B_T": False}, "nt": {"A_T": False, "B_T": True},
             "tn": {"A_T": True, "B_T": False}, "tt": {"A_T": True, "B_T": True}},
    # With A stored [K, T] its ragged rows lie along the contiguous dimension:
    # no 16-byte vectors, and a TMA variant (boxes [BK, BM] at any column,
    # transposed in shared memory) gave wrong results on an H100 (Triton 3.6,
    # 2026-11-22): those layouts run `basic`.
    tma_layouts=("nn", "nt"),
    aligned_layouts=("nn", "nt"),
    float32_output=True,
    # Each group boundary adds at most one partial m-tile; +1 for the rows past
    # the last group (written with zeros).
    tiles="0 if T == 0 else (cdiv(T, BM) + G + 1) * cdiv(N, BN)",
    rows="T // max(G, 1)",
)
