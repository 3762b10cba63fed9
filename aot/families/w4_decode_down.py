"""w4_decode_down: moe_experts' down projection with 4-bit weights at decode
(kernels/w4_decode.py w4_decode_down_kernel, Gluon): w4_ragged_m with its
parameters, the weights widened in mma.sync's operand registers as
w4_decode_glu's; the rows past the last expert's (dropped slots) written
zero, as w4_ragged_m writes them."""
from ..family import Config, Family
from ..kernels.w4_decode import w4_decode_down_kernel
from .w4_decode_glu import TILES
from .w4_ragged_m import FAMILY as W4_RAGGED_M

# BN: output columns a unit; BM and BK as w4_decode_glu's.  64 x 256, or:
# 128 of K a step where K (I) is at most 256 (`short_k`: Kimi-K2's TP8 shard,
# two steps instead of one, fewer registers); 32 columns a unit where the
# units at that width fit in one wave (`few_units`, as w4_decode_glu's).
# From the same H200 sweep (docs/notes/2026-11-29-w4-decode-configs.md).
CONFIGS = (Config(16, 64, 128, 4, 1, when="short_k"),
           Config(16, 32, 256, 4, 1, when="few_units"), Config(16, 64, 256, 4, 1))

FAMILY = Family(
    name="w4_decode_down",
    kernel=w4_decode_down_kernel,
    params=W4_RAGGED_M.params,
    axes=W4_RAGGED_M.axes,
    constexprs=W4_RAGGED_M.constexprs,
    dtypes=("bfloat16",),
    archs=(80, 90),
    configs={(arch, "basic"): CONFIGS for arch in (80, 90)},
    conditions={"short_k": "K <= 256", "few_units": "cdiv(N, 32) * min(T, G) <= 396"},
    tiles=TILES,
    rows=W4_RAGGED_M.rows,
)
