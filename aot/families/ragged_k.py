"""ragged_k: out[G, M, N], out[g] = a[:, rows of g] @ b[rows of g] for a [M, T] and
b [T, N] -- the weight gradient of the MoE layer (grouped_mm 2-D x 2-D)."""
from ..family import Family, Param
from ..kernels.ragged import ragged_k_kernel
from .ragged_m import POINTERS, RAGGED_ROWS_LIMIT

FAMILY = Family(
    name="ragged_k",
    kernel=ragged_k_kernel,
    params=POINTERS + (
        Param("M", "i32", "extent", aligned=True),
        Param("N", "i32", "extent", aligned=True),
        Param("T", "i32", "extent", tma_limit=RAGGED_ROWS_LIMIT),
        Param("G", "i32", "count"),
        Param("lda", "i64", "stride", aligned=True),
        Param("ldb", "i64", "stride", aligned=True),
        Param("ldc", "i64", "stride", aligned=True),
    ),
    # a row-major [M, T] ('nn') or a transposed view of [T, M] ('tn', as in dB).
    # Row-major A has no tma flavour: its K ranges start at any column of its
    # contiguous dimension, so the columns a box reads past a group's end would
    # need masking in registers (an inf there times B's zero rows is NaN); that
    # variant raised an illegal instruction on an H100 (Triton 3.6, 2026-11-22).
    layouts={"nn": {"A_T": False}, "tn": {"A_T": True}},
    tma_layouts=("tn",),
    aligned_layouts=("tn",),
    float32_output=True,
    tiles="G * cdiv(M, BM) * cdiv(N, BN)",
    rows="M",
)
