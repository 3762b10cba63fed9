"""w4_glu: moe_experts' up projection with 4-bit weights, for serving
(kernels/w4.py w4_glu_kernel): ragged_glu's gathered product and activation
on 16-bit tokens, w13 two values a byte along K in MXFP4 or INT4 (the
`format` axis: W4A16, the weights widened in the K loop, 16-bit MMAs); h
written in the tokens' dtype, gu never kept (inference only)."""
from ..axes import GATE_UP, Axis, Choice
from ..family import Config, Family, Param
from ..kernels.glu import CONCATENATED, INTERLEAVED
from ..kernels.w4 import INT4_G32, INT4_G128, MXFP4, w4_glu_kernel
from .ragged_glu import ROWS
from .ragged_m import BIAS, FAMILY as RAGGED_M
from .swiglu import ACTIVATION_PARAM

# A 4-bit weights' format: MXFP4 (e8m0 scales a 32 values), or symmetric
# INT4 with bfloat16 scales a 32 or a 128 values (kernels/w4.py).
W4_FORMAT = Choice("W4Format", ("mxfp4", "int4_g32", "int4_g128"))
W4_FORMATS = {"mxfp4": MXFP4.value, "int4_g32": INT4_G32.value, "int4_g128": INT4_G128.value}

# BM: token rows a tile (the MMAs' M), BN: weight rows (their N), BK: K a
# step (whole scale groups, or within one).  Decode's groups (at most 16
# rows on average) take 16 x 64 tiles, so that the weights stream through
# more programs; larger groups 128 x 128 tiles, eight warps.  From H200
# sweeps (docs/notes/2026-11-29-mxfp4-experts-w4a16.md, a dense kernel of the
# same loop; docs/notes/2026-11-29-w4-widening-in-ptx.md, these kernels).
CONFIGS = {(80, "basic"): (Config(16, 64, 128, 4, 4, max_rows=16), Config(128, 128, 64, 8, 3)),
           (90, "basic"): (Config(16, 64, 128, 4, 4, max_rows=16), Config(64, 128, 64, 4, 4,
                                                                          max_rows=128),
                           Config(128, 128, 64, 8, 3))}

# The 4-bit families' parameters: a the tokens [*, K] (16-bit, rows lda
# apart), b [G, N, K / 2] packed values (bytes; rows ldb apart), c the
# output (rows ldc apart), offs the groups' ends; b_scale [G, N, K / group]
# (MXFP4's bytes, INT4's bfloat16, passed as bytes; rows lds apart).
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
    name="w4_glu",
    kernel=w4_glu_kernel,
    params=POINTERS + EXTENTS + BIAS + (ACTIVATION_PARAM,) + ROWS,
    axes=(Axis("format", W4_FORMAT), Axis("gate_up", GATE_UP)),
    constexprs=lambda v: {"FORMAT": W4_FORMATS[v["format"]],
                          "GLU": CONCATENATED if v["gate_up"] == "concatenated"
                          else INTERLEAVED},
    dtypes=("bfloat16",),
    archs=(80, 90),
    configs=CONFIGS,
    tiles=RAGGED_M.tiles,
    rows=RAGGED_M.rows,
)
