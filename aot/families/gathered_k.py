"""gathered_k: ragged_k's product, out[g] = a[:, rows of g] @ b[rows of g],
with one operand's rows read through the routing's order (rows[r] //
rows_div) -- moe_experts' weight gradients from the tokens and the gradient
rows as they are stored, with no permuted copy (aot/kernels/ragged.py
gathered_k_kernel)."""
from ..axes import EVERY, Axis, Choice
from ..family import Config, Family, Param
from ..kernels.ragged import gathered_k_kernel
from ..kernels.ragged_k_ws import gathered_k_ws_kernel
from .ragged_m import POINTERS, RAGGED_ROWS_LIMIT

OPERAND = Choice("Operand", ("a", "b"))  # an operand of a product a @ b

FAMILY = Family(
    name="gathered_k",
    kernel=gathered_k_kernel,
    ws_kernel=gathered_k_ws_kernel,
    params=POINTERS + (
        # The gathered operand's rows are copied 16 bytes at a time (kernels/loader_ws.py).
        Param("M", "i32", "row_length"),
        Param("N", "i32", "row_length"),
        Param("T", "i32", "extent", tma_limit=RAGGED_ROWS_LIMIT),
        Param("G", "i32", "count"),
        Param("lda", "i64", "stride"),
        Param("ldb", "i64", "stride"),
        Param("ldc", "i64", "stride"),
        # The gathered operand's row r is its stored row rows[r] // rows_div (int64 rows [T]).
        Param("rows_ptr", "*i64", "operand"),
        Param("rows_div", "i32", "extent"),
    ),
    # a [M, T] stored as row-major [*, M] (the gradient's a^T rows), b [T, N]
    # row-major; `gathered`: the operand whose rows are read through rows.
    axes=(Axis("gathered", OPERAND),),
    constexprs=lambda v: {"GATHER_A": v["gathered"] == "a"},
    tma=EVERY,
    dtypes=("float16", "bfloat16"),
    # ragged_k's warp-specialised config (aot/tuning/sm90.json), for every size.
    configs={(90, "tma"): (Config(128, 256, 32, 8, 8, ws=True),)},
    tiles="G * cdiv(M, BM) * cdiv(N, BN)",
    rows="M",
)
