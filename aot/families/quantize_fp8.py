"""quantize_fp8: x [R, C] (float16, bfloat16, float32) -> q [R, C] float8_e4m3fn
and float32 scales, one per row, per 1x128 or per 128x128 block
(aot/kernels/quantize.py): the inputs of scaled_ragged_m in one call each.
x row-major, or column-major (a transposed view, as a weight's
w.transpose(1, 2)) read in place.  sm90 only, as the fp8 GEMMs; `aligned`
(16-byte vectors) wherever x's base, strides and sizes allow it, else
`basic`."""
from dataclasses import replace

from ..axes import EVERY, MAJOR, Axis, Choice, Where
from ..family import Config, Family, Param
from ..kernels.quantize import (BLOCK, BLOCK_1X128, BLOCK_128X128, WHOLE_ROW,
                                quantize_fp8_kernel)

# Memory-bound: what counts is the bytes in flight per SM, programs an SM x
# bytes a program loads at once.  An aligned config loads 4096 elements a step
# (16 a thread, in 16-byte vectors): twice that, ptxas gives a 1x128 tile 105
# registers (2 programs an SM) instead of 48 (5).  The tile is shaped to the
# row length, the bucket key: short rows take many rows a tile, long rows few,
# which also keeps a rowwise tile (read twice) small enough to stay in cache
# between its passes.  Rows of up to 1536 take 8-row tiles (two or three
# 512-column steps: an H100 A/B on rows of 768, 1024 and 1536 had them ahead
# of 4 x 1024 and 2 x 2048 tiles, docs/notes/2026-11-25-fp8-weights-quantized-once.md).
# `basic` (scalar loads, an address per element) loads half as many.  A
# 128x128 tile is one block, which 8 warps hold at 64 elements a thread (128
# registers).  BK is unused (16 keeps aot/variants.py's GEMM shared-memory
# estimate from reshaping the configs).
# What one scale covers (aot/kernels/quantize.py): a row, 128 columns of a
# row, a 128 x 128 block; MODES gives the kernel's MODE for each.
GRANULARITY = Choice("Granularity", ("rowwise", "1x128", "128x128"))
MODES = {"rowwise": WHOLE_ROW.value, "1x128": BLOCK_1X128.value, "128x128": BLOCK_128X128.value}
ONE_BLOCK_ONLY = Where(granularity="128x128", x_major="row")

ALIGNED = (
    Config(8, 512, 16, 8, 1, max_rows=1536),
    Config(2, 2048, 16, 8, 1, max_rows=2048),
    Config(1, 4096, 16, 8, 1),
)
BASIC = (Config(2, 1024, 16, 8, 1),)
ONE_BLOCK = (Config(128, 128, 16, 8, 1),)
ORIENTATIONS = ("one_orientation", "both_orientations")  # FAMILY's conditions


def orientations(configs) -> tuple:
    """A column-major x's 128x128 configs for calls with and without the
    transposed copy: a kernel each, so that the copy's stores cost the
    others nothing."""
    return tuple(replace(c, when=when) for c in configs for when in ORIENTATIONS)

# A column-major x is loaded along its rows, each column's BM rows one
# contiguous run, and converted (in shared memory) to store q along its rows,
# which costs registers: ptxas gives an aligned 1x128 tile of 64 x 128 119
# (2 programs an SM), and a 128 x 128 block 153 at 8 warps, 113 at 16.  Yet
# an aligned 128 x 128 block runs fastest at 4 warps, more programs an SM
# (the same H100 A/B: ahead of 8 and 16 warps on every weight; `basic`
# unmeasured).  A rowwise tile, read twice, is 16 rows (32 bytes of 16-bit x
# a column: one sector) by 256 columns a step (`basic`: half), 4096 elements
# as the aligned row configs load (32 x 128 ran slower).
COLUMN_MAJOR = {  # (flavour, granularity) -> configs
    ("aligned", "rowwise"): (Config(16, 256, 16, 8, 1),),
    ("aligned", "1x128"): (Config(64, 128, 16, 8, 1),),
    ("aligned", "128x128"): (Config(128, 128, 16, 4, 1),),
    ("basic", "rowwise"): (Config(16, 128, 16, 8, 1),),
    ("basic", "1x128"): (Config(32, 128, 16, 8, 1),),
    ("basic", "128x128"): (Config(128, 128, 16, 16, 1),),
}

FAMILY = Family(
    name="quantize_fp8",
    kernel=quantize_fp8_kernel,
    params=(
        Param("x_ptr", "*T", "operand", aligned=True),
        Param("q_ptr", "*O", "output", aligned=True),
        Param("scale_ptr", "*fp32", "output"),
        Param("R", "i32", "extent"),
        Param("C", "i32", "extent", aligned=True),
        Param("group_rows", "i32", "extent"),  # 128x128 blocks start afresh every group_rows rows
        Param("ldx", "i64", "stride", aligned=True),
        # A column-major x's: elements from a group's first to the next's, and
        # the rows of a group, the extent its 16-byte vectors run along (0
        # for a row-major x, which reads neither).  group_rows cannot carry
        # that rule: `aligned` marks hold for every variant, and a row-major
        # x's group_rows is any value.
        Param("group_stride", "i64", "stride", aligned=True),
        Param("contiguous_rows", "i32", "extent", aligned=True),
        # 128x128's transposed copy (q^T and its scales; quantize_fp8_both_orientations)
        # and its row length, each group's rows: 0 for none (the pointers then
        # repeat q's and scale's).
        Param("qt_ptr", "*O", "output", aligned=True),
        Param("qt_scale_ptr", "*fp32", "output"),
        Param("qt_columns", "i32", "extent", aligned=True),
    ),
    axes=(Axis("granularity", GRANULARITY), Axis("x_major", MAJOR)),
    # MODE: MODES' code for the granularity; X_T: column-major.
    constexprs=lambda v: {"MODE": MODES[v["granularity"]],
                          "X_T": v["x_major"] == "column", "TRANSPOSED": False},
    aligned=EVERY,
    dtypes=("float16", "bfloat16", "float32"),
    out_dtypes=("float8_e4m3fn",),
    archs=(90,),
    configs={(90, "aligned"): ALIGNED, (90, "basic"): BASIC,
             (90, "aligned", ONE_BLOCK_ONLY): ONE_BLOCK, (90, "basic", ONE_BLOCK_ONLY): ONE_BLOCK,
             **{(90, flavour, Where(x_major="column", granularity=granularity)):
                orientations(configs) if granularity == "128x128" else configs
                for (flavour, granularity), configs in COLUMN_MAJOR.items()}},
    conditions={"one_orientation": "qt_columns == 0", "both_orientations": "qt_columns > 0"},
    when_constexprs={"both_orientations": {"TRANSPOSED": True}},
    # Each granularity tiles differently (BM rows; BM x BN; 128 x 128 blocks
    # restarting at each group; column-major x: BM x BN tiles restarting at
    # each group, the term that is 0 for a row-major x): the grid is sized for
    # the most tiles of any (programs past their own count exit at once).
    tiles="max(max(cdiv(R, BM) * cdiv(C, BN), "
          "R // max(group_rows, 1) * cdiv(group_rows, 128) * cdiv(C, 128)), "
          "R // max(contiguous_rows, 1) * cdiv(contiguous_rows, BM) * cdiv(C, BN))",
    rows="C",  # the bucket key is the row length (see ALIGNED)
    # The scale block every fp8 operator sizes its scales (and the decode
    # forward its parts) by: csrc/ops/fp8.h's kBlock.
    constants={"kBlock": BLOCK.value},
)
