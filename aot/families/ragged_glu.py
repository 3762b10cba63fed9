"""ragged_glu: moe_experts' up projection with its activation in the
epilogue (aot/kernels/glu.py): row r of a is the tokens' row rows[r] //
rows_div (the routing's gather, read in place); rows offs[g-1]:offs[g] times
w13[g] (b [G, K, N], N = 2I gate and up columns) plus bias[g], then
h [T, I] = act(gate, up); gu [T, N] (the product plus bias) kept for the
backward where save_gu is 1.  The same kernel without a gate is gathered_m."""
from ..axes import EVERY, GATE_UP, MAJOR, Axis, Where
from ..family import Config, Family, Param
from ..kernels.glu import CONCATENATED, INTERLEAVED
from ..kernels.ragged import ragged_glu_kernel
from ..kernels.ragged_ws import ragged_glu_ws_kernel
from .ragged_m import BIAS, EXTENTS, FAMILY as RAGGED_M, POINTERS
from .swiglu import ACTIVATION_PARAM

# sm90: ragged_m's tuned pair (aot/tuning/sm90.json): small groups on the
# Triton kernel, the rest warp-specialised (whose epilogue stages h and gu in
# halves of 128 columns).  The warp-specialised loader reads concatenated
# halves as two half blocks of a K-major (column-major) b only: row-major
# concatenated halves take the Triton kernel throughout.
SM90_TMA = (Config(64, 128, 64, 4, 3, max_rows=32), Config(128, 256, 64, 8, 4, ws=True))
SM90_TRITON = (Config(64, 128, 64, 4, 3, max_rows=32), Config(128, 256, 64, 8, 3))

# The products read the tokens (the up projection, dW13) and the gradient's
# rows (dh, dW2) through the routing's order where the experts are at most
# this wide (I <= GATHER_MAX_INTER): there gathering in the GEMM costs no
# more time than a permuted copy, and saves the copy's memory; wider
# experts' GEMMs run faster from copies, by TMA
# (docs/notes/2026-11-24-moe-experts-gathering-up-projection.md).
# moe_experts decides by it and tells its backward (csrc/ops/moe_experts.cc).
GATHER_MAX_INTER = 4096

# ragged_m's extents for gathered rows: K, the tokens' rows, is gathered in
# 16-byte copies (kernels/loader_ws.py copy_rows).
GATHERED_EXTENTS = tuple(Param("K", "i32", "row_length", aligned=True) if p.name == "K" else p
                         for p in EXTENTS)
# The gather's index: a's row r is row rows[r] // rows_div of the tokens (int64 rows [T]).
ROWS = (Param("rows_ptr", "*i64", "operand"), Param("rows_div", "i32", "extent"))
# ragged_glu's parameters, gathered_m's too: c is h [T, I] (gathered_m's
# product [T, N]), rows ldc apart; N = 2I.
PARAMS = POINTERS + GATHERED_EXTENTS + BIAS + (
    Param("gu_ptr", "*T", "output", aligned=True),
    Param("save_gu", "i32", "flag"),
    ACTIVATION_PARAM,
) + ROWS

FAMILY = Family(
    name="ragged_glu",
    kernel=ragged_glu_kernel,
    ws_kernel=ragged_glu_ws_kernel,
    params=PARAMS,
    # b: w13 in nn.Linear's layout [G, 2I, H] viewed transposed (column-major)
    # or stored [G, H, 2I] (row-major, as gpt-oss's gate_up_proj); its gate and
    # up columns concatenated or interleaved.
    axes=(Axis("b_major", MAJOR), Axis("gate_up", GATE_UP)),
    constexprs=lambda v: {"B_T": v["b_major"] == "column",
                          "GLU": CONCATENATED if v["gate_up"] == "concatenated" else INTERLEAVED},
    tma=EVERY,
    aligned=EVERY,
    dtypes=("float16", "bfloat16"),
    configs={(90, "tma"): SM90_TMA,
             (90, "tma", Where(b_major="row", gate_up="concatenated")): SM90_TRITON},
    tiles=RAGGED_M.tiles,
    rows=RAGGED_M.rows,
    constants={"kGatherMaxInter": GATHER_MAX_INTER},
)
