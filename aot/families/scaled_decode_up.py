"""scaled_decode_up: the up projection of moe_experts' fp8 decode forward
with each unit's H cut into parts (aot/kernels/experts_decode_split.py):
each part's gate and up sums, float32 [splits, S, 2I], for scaled_decode_down.
Taken instead of the one-kernel forward (scaled_experts_decode) where a
call's units are too few to keep the SMs reading
(csrc/ops/expert_products_fp8_decode.cc decode_splits).  The family's dtype is
the tokens' (16-bit); the weights are float8_e4m3fn, by TMA, sm90."""
from ..family import Family, Param
from ..kernels.experts_decode_split import scaled_decode_up_kernel
from .scaled_experts_decode import (EXTENTS, IDS, SPLIT_FAMILY, SPLITS, TOKENS, TOP_K, W13,
                                    W13_STRIDES)

FAMILY = Family(
    name="scaled_decode_up",
    kernel=scaled_decode_up_kernel,
    # As scaled_experts_decode's; gu [splits, S, 2I] float32.
    params=(*TOKENS, IDS, TOP_K, *W13, Param("gu_ptr", "*O", "output", aligned=True), *EXTENTS,
            SPLITS, *W13_STRIDES),
    dtypes=("bfloat16", "float16"),
    **SPLIT_FAMILY,
)
