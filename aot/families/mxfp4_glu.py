"""mxfp4_glu: moe_experts' up projection with MXFP4 weights, for serving
(kernels/ragged.py mxfp4_glu_kernel, kernels/mxfp4.py): ragged_glu's
gathered product and activation on 16-bit tokens, w13 in e2m1 values packed
two a byte along K with an e8m0 scale a group of 32 (W4A16: the weights
widened in the K loop, 16-bit MMAs); h written in the tokens' dtype, gu
never kept (inference only)."""
from ..family import GATE_UP, Axis, Config, Family, Param
from ..kernels.glu import CONCATENATED, INTERLEAVED
from ..kernels.mxfp4 import mxfp4_glu_kernel
from .ragged_glu import ROWS
from .ragged_m import BIAS, FAMILY as RAGGED_M

# BM: token rows a tile (the MMAs' M), BN: weight rows (their N), BK: K a
# step (whole scale groups).  Decode's groups (at most 16 rows on average)
# take 16 x 64 tiles, so that the weights stream through more programs;
# larger groups 128 x 128 tiles, eight warps.  From a first H200 sweep of a
# dense kernel of the same loop (docs/notes/2026-11-29-mxfp4-experts-w4a16.md).
CONFIGS = {(80, "basic"): (Config(16, 64, 128, 4, 4, max_rows=16), Config(128, 128, 64, 8, 3)),
           (90, "basic"): (Config(16, 64, 128, 4, 4, max_rows=16), Config(64, 128, 64, 4, 4,
                                                                          max_rows=128),
                           Config(128, 128, 64, 8, 3))}

# The MXFP4 families' parameters: a the tokens [*, K] (16-bit, rows lda
# apart), b [G, N, K / 2] packed e2m1 (bytes; rows ldb apart), c the output
# (rows ldc apart), offs the groups' ends; b_scale [G, N, K / 32] e8m0
# (bytes; rows lds apart).
POINTERS = (
    Param("a_ptr", "*T", "operand"),
    Param("b_ptr", "*u8", "operand"),
    Param("c_ptr", "*O", "output"),
    Param("offs_ptr", "*i32", "offsets"),
    Param("b_scale_ptr", "*u8", "operand"),
)
EXTENTS = (
    Param("T", "i32", "extent"),
    Param("N", "i32", "extent"),
    Param("K", "i32", "extent"),
    Param("G", "i32", "count"),
    Param("lda", "i64", "stride"),
    Param("b_group_stride", "i64", "stride"),
    Param("ldb", "i64", "stride"),
    Param("b_scale_group_stride", "i64", "stride"),
    Param("lds", "i64", "stride"),
    Param("ldc", "i64", "stride"),
)

FAMILY = Family(
    name="mxfp4_glu",
    kernel=mxfp4_glu_kernel,
    params=POINTERS + EXTENTS + BIAS + (Param("gpt_oss", "i32", "flag"),) + ROWS,
    axes=(Axis("gate_up", GATE_UP),),
    constexprs=lambda v: {"GLU": CONCATENATED if v["gate_up"] == "concatenated"
                          else INTERLEAVED},
    dtypes=("bfloat16",),
    archs=(80, 90),
    configs=CONFIGS,
    tiles=RAGGED_M.tiles,
    rows=RAGGED_M.rows,
)
