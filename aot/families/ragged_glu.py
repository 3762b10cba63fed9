"""ragged_glu: moe_experts' up projection with its activation in the
epilogue (aot/kernels/glu.py): row r of a is the tokens' row rows[r] //
rows_div (the routing's gather, read in place); rows offs[g-1]:offs[g] times
w13[g] (b [G, K, N], N = 2I gate and up columns) plus bias[g], then
h [T, I] = act(gate, up); gu [T, N] (the product plus bias) kept for the
backward where save_gu is 1.  The `ungated` layouts store the product plus
bias itself, [T, N] (the backward's product of the gathered gradient rows)."""
from ..family import Config, Family, Param
from ..kernels.glu import CONCATENATED, INTERLEAVED, UNGATED
from ..kernels.ragged import ragged_glu_kernel
from ..kernels.ragged_ws import ragged_glu_ws_kernel
from .ragged_m import BIAS, EXTENTS, FAMILY as RAGGED_M, POINTERS

# B_GATEUP: b K-major ('t': w13 in nn.Linear's layout [G, 2I, H], viewed
# transposed) or N-major ('n': a w13 stored [G, H, 2I], as gpt-oss's
# gate_up_proj), gate and up halves concatenated or interleaved, or no gate.
LAYOUTS = {f"{b}_{gate_up}": {"B_T": b == "t", "GLU": glu}
           for b in "tn" for gate_up, glu in (("concatenated", CONCATENATED),
                                              ("interleaved", INTERLEAVED),
                                              ("ungated", UNGATED))}

# sm90: ragged_m's tuned pair (aot/tuning/sm90.json): small groups on the
# Triton kernel, the rest warp-specialised (whose epilogue stages h and gu in
# halves of 128 columns).  The warp-specialised loader reads concatenated
# halves as two half blocks of a K-major b only: N-major concatenated halves
# take the Triton kernel throughout.
SM90_TMA = (Config(64, 128, 64, 4, 3, max_rows=32), Config(128, 256, 64, 8, 4, ws=True))
SM90_TRITON = (Config(64, 128, 64, 4, 3, max_rows=32), Config(128, 256, 64, 8, 3))

FAMILY = Family(
    name="ragged_glu",
    kernel=ragged_glu_kernel,
    ws_kernel=ragged_glu_ws_kernel,
    # c: h [T, I] (ungated: [T, N]), rows ldc apart; N = 2I.
    # K: the tokens' rows are gathered in 16-byte copies (kernels/ws.py copy_rows).
    params=POINTERS + tuple(Param("K", "i32", "row_length", aligned=True) if p.name == "K" else p
                            for p in EXTENTS) + BIAS + (
        Param("gu_ptr", "*T", "output", aligned=True),
        Param("save_gu", "i32", "flag"),
        Param("gpt_oss", "i32", "flag"),
        # a's row r is row rows[r] // rows_div of the tokens (int64 rows [T]).
        Param("rows_ptr", "*i64", "operand"),
        Param("rows_div", "i32", "extent"),
    ),
    layouts=LAYOUTS,
    tma_layouts=tuple(LAYOUTS),
    aligned_layouts=tuple(LAYOUTS),
    dtypes=("float16", "bfloat16"),
    configs={(90, "tma"): SM90_TMA, (90, "tma", "n_concatenated"): SM90_TRITON},
    tiles=RAGGED_M.tiles,
    rows=RAGGED_M.rows,
)
