"""grouped_gemm: independent C_g = A_g @ B_g of any sizes, per-group pointers and strides
in a table the runtime copies to the GPU (grouped_gemm, the tutorial's problem)."""
from ..axes import EVERY, MAJOR, Axis
from ..family import Family, Param
from ..kernels.grouped_gemm import GROUP_FIELDS, grouped_gemm_kernel
from ..kernels.grouped_gemm_ws import grouped_gemm_ws_kernel

_GROUP_FIELD = {
    "a": Param("a", "*T", "operand"), "b": Param("b", "*T", "operand"),
    "c": Param("c", "*T", "output"),
    "M": Param("M", "i32", "extent"), "N": Param("N", "i32", "extent"),
    "K": Param("K", "i32", "extent"),
    "lda": Param("lda", "i64", "stride"), "ldb": Param("ldb", "i64", "stride"),
    "ldc": Param("ldc", "i64", "stride"),
}

FAMILY = Family(
    name="grouped_gemm",
    kernel=grouped_gemm_kernel,
    ws_kernel=grouped_gemm_ws_kernel,
    params=(
        Param("group_table", "*i64", "group_table"),
        Param("tile_ends", "*i64", "tile_prefix"),
        Param("G", "i32", "count"),
    ),
    # B_g [K, N] row-major, or column-major: stored [N, K] (the nn.Linear weight layout).
    axes=(Axis("b_major", MAJOR),),
    constexprs=lambda v: {"B_T": v["b_major"] == "column"},
    tma=EVERY,
    group_fields=tuple(_GROUP_FIELD[name] for name in GROUP_FIELDS),  # the kernel's order
    group_tiles="cdiv(M, BM) * cdiv(N, BN)",
    group_rows="M",
    dtype_constexpr=True,
    dtypes=("float16", "bfloat16"),
)
