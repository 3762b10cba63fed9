"""ragged_k: out[G, M, N], out[g] = a[:, rows of g] @ b[rows of g] for a [M, T] and
b [T, N] -- the weight gradient of the MoE layer (grouped_mm 2-D x 2-D)."""
from ..axes import EVERY, MAJOR, Axis, Where
from ..family import Family, Param
from ..kernels.ragged import ragged_k_kernel
from ..kernels.ragged_k_ws import ragged_k_ws_kernel
from .ragged_m import POINTERS, RAGGED_ROWS_LIMIT

FAMILY = Family(
    name="ragged_k",
    kernel=ragged_k_kernel,
    ws_kernel=ragged_k_ws_kernel,
    params=POINTERS + (
        Param("M", "i32", "extent", aligned=True),
        Param("N", "i32", "extent", aligned=True),
        Param("T", "i32", "extent", tma_limit=RAGGED_ROWS_LIMIT),
        Param("G", "i32", "count"),
        Param("lda", "i64", "stride", aligned=True),
        Param("ldb", "i64", "stride", aligned=True),
        Param("ldc", "i64", "stride", aligned=True),
    ),
    # a [M, T] column-major, a transposed view of row-major [T, M] as in dB
    # (each group's K range a range of whole rows), or row-major (read in
    # place by sm90's kernels only; gg_runtime copies it elsewhere, and any
    # other a).
    axes=(Axis("a_major", MAJOR),),
    constexprs=lambda v: {"A_T": v["a_major"] == "column"},
    tma=EVERY,
    aligned=Where(a_major="column"),
    tma_only=Where(a_major="row"),
    float32_output=True,
    tiles="G * cdiv(M, BM) * cdiv(N, BN)",
    rows="M",
)
