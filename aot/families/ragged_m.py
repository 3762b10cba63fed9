"""ragged_m: out[T, N], rows offs[g-1]:offs[g] of a [T, K] times b[g], plus
bias[g] where given -- the MoE forward (grouped_mm 2-D x 3-D) and its dA."""
from ..axes import EVERY, MAJOR, Axis, Where
from ..family import Family, Param
from ..kernels.ragged import ragged_m_kernel
from ..kernels.ragged_ws import ragged_m_ws_kernel

# Ragged TMA descriptors clip rows with a 2**30-row dimension (kernels/ragged.py).
RAGGED_ROWS_LIMIT = 2 ** 30
# The ragged families' first parameters: operands, output, group end offsets.
POINTERS = (
    Param("a_ptr", "*T", "operand", aligned=True),
    Param("b_ptr", "*T", "operand", aligned=True),
    Param("c_ptr", "*O", "output", aligned=True),
    Param("offs_ptr", "*i32", "offsets"),
)
# ragged_m's sizes and strides: a [T, K], b [G, K, N], c [T, N].
EXTENTS = (
    Param("T", "i32", "extent", tma_limit=RAGGED_ROWS_LIMIT),
    Param("N", "i32", "extent", aligned=True),
    Param("K", "i32", "extent", aligned=True),
    Param("G", "i32", "count"),
    Param("lda", "i64", "stride", aligned=True),
    Param("b_group_stride", "i64", "stride", aligned=True),
    Param("ldb", "i64", "stride", aligned=True),
    Param("ldc", "i64", "stride", aligned=True),
)
# ragged_m's last parameters: an optional per-group bias [G, N] in the output's
# dtype, added to the accumulator before the store.
BIAS = (
    Param("bias_ptr", "*O", "bias"),
    Param("has_bias", "i32", "flag"),
)

FAMILY = Family(
    name="ragged_m",
    kernel=ragged_m_kernel,
    ws_kernel=ragged_m_ws_kernel,
    params=POINTERS + EXTENTS + BIAS,
    # a [T, K] row-major or a transposed view of [K, T] (as 3-D x 2-D's b);
    # b [G, K, N] row-major or a transposed view of [G, N, K] (the nn.Linear
    # weight); c [T, N] row-major or a transposed view of [N, T] (3-D x 2-D's
    # output).  A column-major a is read in place by sm90's kernels only
    # (csrc/ops/grouped_mm.cc).
    axes=(Axis("a_major", MAJOR), Axis("b_major", MAJOR), Axis("c_major", MAJOR)),
    constexprs=lambda v: {"A_T": v["a_major"] == "column", "B_T": v["b_major"] == "column",
                          "C_T": v["c_major"] == "column"},
    tma=EVERY,
    aligned=Where(a_major="row", c_major="row"),
    tma_only=Where(a_major="column"),
    float32_output=True,
    # Each group boundary adds at most one partial m-tile; +1 for the rows past
    # the last group (written with zeros).  (A stored [K, T] starts a group's
    # tiles up to 7 rows early, ws.tiled_rows: at most 7G / BM more tiles,
    # which only the grid's size sees; each program walks the real list.)
    tiles="0 if T == 0 else (cdiv(T, BM) + G + 1) * cdiv(N, BN)",
    rows="T // max(G, 1)",
)
