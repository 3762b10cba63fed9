"""mxfp4_ragged_m: ragged_m with MXFP4 weights (kernels/ragged.py
mxfp4_ragged_m_kernel): out[T, N], rows offs[g-1]:offs[g] of a [T, K]
(16-bit) times b[g]^T, b [G, N, K] as mxfp4_glu's, plus bias[g] where
given -- moe_experts' down projection for serving with 4-bit weights."""
from ..family import Family
from ..kernels.mxfp4 import mxfp4_ragged_m_kernel
from .mxfp4_glu import CONFIGS, EXTENTS, POINTERS
from .ragged_m import BIAS, FAMILY as RAGGED_M

FAMILY = Family(
    name="mxfp4_ragged_m",
    kernel=mxfp4_ragged_m_kernel,
    params=POINTERS + EXTENTS + BIAS,
    dtypes=("bfloat16",),
    archs=(80, 90),
    configs=CONFIGS,
    tiles=RAGGED_M.tiles,
    rows=RAGGED_M.rows,
)
