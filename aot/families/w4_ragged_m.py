"""w4_ragged_m: ragged_m with 4-bit weights (kernels/w4.py
w4_ragged_m_kernel): out[T, N], rows offs[g-1]:offs[g] of a [T, K]
(16-bit) times b[g]^T, b [G, N, K] as w4_glu's, plus bias[g] where given
-- moe_experts' down projection for serving with 4-bit weights."""
from ..axes import Axis
from ..family import Family
from ..kernels.w4 import w4_ragged_m_kernel
from .ragged_m import BIAS, FAMILY as RAGGED_M
from .w4_glu import CONFIGS, EXTENTS, POINTERS, W4_FORMAT, W4_FORMATS

FAMILY = Family(
    name="w4_ragged_m",
    kernel=w4_ragged_m_kernel,
    params=POINTERS + EXTENTS + BIAS,
    axes=(Axis("format", W4_FORMAT),),
    constexprs=lambda v: {"FORMAT": W4_FORMATS[v["format"]]},
    dtypes=("bfloat16",),
    archs=(80, 90),
    configs=CONFIGS,
    tiles=RAGGED_M.tiles,
    rows=RAGGED_M.rows,
)
