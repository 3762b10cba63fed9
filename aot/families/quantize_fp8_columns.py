"""quantize_fp8_columns: x [T, C] (float16, bfloat16, float32) -> q [C, W]
float8_e4m3fn quantised along T within each group of rows, stored K-major
with every group's 128-row blocks aligned to 128 columns, and float32 scales
per column of a group or of a 128-row block (aot/kernels/quantize_columns.py):
the operands of the fp8 weight gradient.  sm90 only, as the fp8 GEMMs;
`aligned` (16-byte vector loads of x) wherever x's base, row stride and C
allow it, else `basic`.  Row r of the operand may be x's row rows[r] //
rows_div (the routing's gather, where rows_div is not 0)."""
from ..axes import EVERY, Axis
from ..family import Config, Family, Param
from ..kernels.quantize_columns import quantize_fp8_columns_kernel
from .quantize_fp8 import GRANULARITY, MODES
from .ragged_glu import ROWS

# Memory-bound: a tile is one 128-row block by 64 columns (128 to 256 bytes
# of each row loaded, 128 bytes of each of q's rows stored); 4 warps hold it
# at 64 elements a thread, and a rowwise tile its running amax beside (an
# H100 A/B of 8 and 4 warps, 32 to 128 columns, on fp8 training's operands:
# docs/notes/2026-11-25-fp8-moe-experts-training.md).  BK is unused (16
# keeps aot/variants.py's GEMM shared-memory estimate from reshaping the
# config).
TILE = (Config(128, 64, 16, 4, 1),)
# Left to itself ptxas gives the kernel about 180 registers a thread: two
# programs an SM.  168 fits three, without spilling (an H100 A/B of caps,
# docs/notes/2026-11-27-column-quantization-in-flight.md).
MAX_REGISTERS = 168

FAMILY = Family(
    name="quantize_fp8_columns",
    kernel=quantize_fp8_columns_kernel,
    params=(
        Param("x_ptr", "*T", "operand", aligned=True),
        Param("q_ptr", "*O", "output", aligned=True),
        Param("scale_ptr", "*fp32", "output"),
        Param("offs_ptr", "*i32", "offsets"),
        Param("T", "i32", "extent"),
        Param("C", "i32", "extent", aligned=True),
        Param("G", "i32", "count"),
        Param("ldx", "i64", "stride", aligned=True),
    ) + ROWS,
    # What one scale covers: a column of a group, or of a 128-row block of it
    # (aot/kernels/quantize.py's WHOLE_ROW and BLOCK_1X128, by MODES).
    axes=(Axis("granularity", GRANULARITY, only=("rowwise", "1x128")),),
    constexprs=lambda v: {"MODE": MODES[v["granularity"]]},
    aligned=EVERY,
    dtypes=("float16", "bfloat16", "float32"),
    out_dtypes=("float8_e4m3fn",),
    archs=(90,),
    configs={(90, "aligned"): TILE, (90, "basic"): TILE},
    # The 1x128 tiles (a block of every group by BN columns) bound the rowwise
    # ones (a group by BN columns): programs past their count exit at once.
    tiles="(T // 128 + G) * cdiv(C, BN)",
    rows="C",  # the bucket key: one config, with no bound, takes every value
    max_registers=MAX_REGISTERS,
)
