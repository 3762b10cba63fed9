"""ragged_glu: moe_experts' up projection with its activation in the
epilogue (aot/kernels/glu.py): rows offs[g-1]:offs[g] of a [T, K] times
w13[g] (b [G, K, N], N = 2I gate and up columns) plus bias[g], then
h [T, I] = act(gate, up); gu [T, N] (the product plus bias) kept for the
backward where save_gu is 1."""
from ..family import Config, Family, Param
from ..kernels.glu import CONCATENATED, INTERLEAVED
from ..kernels.ragged import ragged_glu_kernel
from ..kernels.ragged_ws import ragged_glu_ws_kernel
from .ragged_m import BIAS, EXTENTS, FAMILY as RAGGED_M, POINTERS

# B_GATEUP.  Concatenated halves are read as two half blocks of a K-major b
# (w13 in nn.Linear's layout, viewed transposed); interleaved pairs from b in
# either layout (gpt-oss stores its gate_up_proj [E, H, 2I]).
LAYOUTS = {
    "t_concatenated": {"B_T": True, "GLU": CONCATENATED},
    "t_interleaved": {"B_T": True, "GLU": INTERLEAVED},
    "n_interleaved": {"B_T": False, "GLU": INTERLEAVED},
}

# sm90: ragged_m's tuned pair (aot/tuning/sm90.json): small groups on the
# Triton kernel, the rest warp-specialised (whose epilogue stages h and gu in
# halves of 128 columns).
SM90_TMA = (Config(64, 128, 64, 4, 3, max_rows=32), Config(128, 256, 64, 8, 4, ws=True))

FAMILY = Family(
    name="ragged_glu",
    kernel=ragged_glu_kernel,
    ws_kernel=ragged_glu_ws_kernel,
    # c: h [T, I], rows ldc apart; N = 2I.
    params=POINTERS + EXTENTS + BIAS + (
        Param("gu_ptr", "*T", "output", aligned=True),
        Param("save_gu", "i32", "flag"),
        Param("gpt_oss", "i32", "flag"),
    ),
    layouts=LAYOUTS,
    tma_layouts=tuple(LAYOUTS),
    aligned_layouts=tuple(LAYOUTS),
    dtypes=("float16", "bfloat16"),
    configs={(90, "tma"): SM90_TMA},
    tiles=RAGGED_M.tiles,
    rows=RAGGED_M.rows,
)
