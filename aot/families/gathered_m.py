"""gathered_m: ragged_m's product with a's rows read through the routing's
order, out[r] = tokens[rows[r] // rows_div] @ b[g] (+ bias[g]) for the rows r
of group g, stored as it is: moe_experts' backward's product of the
gradient's rows with w2 (dh), with no permuted copy.  ragged_glu's kernel
with no gate in its epilogue (aot/kernels/glu.py UNGATED)."""
from ..axes import EVERY, MAJOR, Axis
from ..family import Family
from ..kernels.glu import UNGATED
from ..kernels.ragged import ragged_glu_kernel
from ..kernels.ragged_ws import ragged_glu_ws_kernel
from .ragged_glu import PARAMS, SM90_TMA
from .ragged_m import FAMILY as RAGGED_M

FAMILY = Family(
    name="gathered_m",
    kernel=ragged_glu_kernel,
    ws_kernel=ragged_glu_ws_kernel,
    params=PARAMS,  # gu_ptr, save_gu and activation not read
    # b [G, K, N] row-major, or column-major: a transposed view of [G, N, K].
    axes=(Axis("b_major", MAJOR),),
    constexprs=lambda v: {"B_T": v["b_major"] == "column", "GLU": UNGATED},
    tma=EVERY,
    aligned=EVERY,
    dtypes=("float16", "bfloat16"),
    configs={(90, "tma"): SM90_TMA},
    tiles=RAGGED_M.tiles,
    rows=RAGGED_M.rows,
)
