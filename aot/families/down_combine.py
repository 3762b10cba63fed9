"""down_combine: moe_experts' down projection and weighted combine in one
launch (kernels/ragged.py's down_combine_kernel): ragged_m's product of the
token slots' rows (sorted by expert) and each expert's down projection, then
each token's k rows summed, weighted, into its output row by the tile that
completes them (per-token counters, no atomics on the output)."""
from ..family import Family, Param
from ..kernels.combine import COUNTER_COLS
from ..kernels.ragged import down_combine_kernel
from ..kernels.ragged_ws import down_combine_ws_kernel
from .ragged_m import BIAS, EXTENTS, POINTERS

# The routing (route.py's order and inverse), the routing weights, the
# output, and the runtime's counters.
COMBINE = (
    Param("order_ptr", "*i64", "operand"),
    Param("inverse_ptr", "*i64", "operand"),
    Param("weights_ptr", "*fp32", "scale"),
    Param("out_ptr", "*O", "output"),
    Param("counts_ptr", "*i32", "counters"),
    Param("TOKENS", "i32", "extent"),
    Param("TOP_K", "i32", "extent"),
)

FAMILY = Family(
    name="down_combine",
    kernel=down_combine_kernel,
    ws_kernel=down_combine_ws_kernel,
    params=POINTERS + EXTENTS + BIAS + COMBINE,
    # a [T, K] row-major; b [G, K, N] row-major ('n') or a transposed view of
    # [G, N, K] ('t': w2 as it is stored).
    layouts={"n" + b: {"B_T": b == "t"} for b in "nt"},
    tma_layouts=("nn", "nt"),
    aligned_layouts=("nn", "nt"),
    dtypes=("float16", "bfloat16"),
    tuned_as="ragged_m",
    tiles="0 if T == 0 else (cdiv(T, BM) + G + 1) * cdiv(N, BN)",
    rows="T // max(G, 1)",
    counters=f"TOKENS * cdiv(N, {COUNTER_COLS.value})",
)
