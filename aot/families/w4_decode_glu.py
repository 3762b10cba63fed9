"""w4_decode_glu: moe_experts' up projection with 4-bit weights at decode
(kernels/w4_decode.py w4_decode_glu_kernel, Gluon): w4_glu's product and
activation, with its parameters, for calls of at most one slot an expert
(csrc/ops/expert_products_w4.cc).  The packed weights are loaded straight
into mma.sync's operand registers and widened there, never staged in shared
memory: at decode each K step's chain is the whole time
(docs/notes/2026-11-29-w4-decode-weights-in-mma-registers.md)."""
from ..family import Config, Family
from ..kernels.w4_decode import w4_decode_glu_kernel
from .w4_glu import FAMILY as W4_GLU

# BM: slot rows a step (mma.sync's M), BN: w13 rows a unit (BN / 2 gate rows
# and their up rows: BN / 2 columns of h), BK: K a step, in 16-byte loads of
# each thread's words (the kernels' KW = BK / 64).  128 w13 rows a unit, or
# 64 where a call's units at that width fit in one wave (`few_units`: three
# programs an SM on 132 SMs, its registers capped so that three fit): half
# the rows a program, and more programs streaming the weights.  From
# an H200 sweep (docs/notes/2026-11-29-w4-decode-configs.md).  mma.sync is
# sm80's, so both archs compile them.
CONFIGS = (Config(16, 64, 256, 4, 1, when="few_units", max_registers=168),
           Config(16, 128, 256, 4, 1))
FEW_UNITS = "cdiv(N, 64) * min(T, G) <= 396"
# An upper bound on the units: each busy expert (at most T of the G) times
# the column tiles; the programs find the busy experts in offs.
TILES = "0 if T == 0 else cdiv(N, BN) * min(T, G)"

FAMILY = Family(
    name="w4_decode_glu",
    kernel=w4_decode_glu_kernel,
    params=W4_GLU.params,
    axes=W4_GLU.axes,
    constexprs=W4_GLU.constexprs,
    dtypes=("bfloat16",),
    archs=(80, 90),
    configs={(arch, "basic"): CONFIGS for arch in (80, 90)},
    conditions={"few_units": FEW_UNITS},
    tiles=TILES,
    rows=W4_GLU.rows,
)
