"""scaled_decode_down: the activation and down projection of moe_experts'
fp8 decode forward with each unit's H cut into parts (aot/kernels/
experts_decode_split.py): sums scaled_decode_up's parts of gu, applies the
activation, quantizes h per slot per 128 columns and writes its part of H of
the down projection, float32 [S, C, H], as scaled_experts_decode does;
combine_parts sums them.  The family's dtype is gu's (float32); the weights
are float8_e4m3fn, by TMA, sm90."""
from ..family import Family, Param
from ..kernels.experts_decode_split import scaled_decode_down_kernel
from .scaled_experts_decode import (BIASES, EXTENTS, IDS, SPLIT_FAMILY, SPLITS, W2,
                                    W2_STRIDES)

FAMILY = Family(
    name="scaled_decode_down",
    kernel=scaled_decode_down_kernel,
    # gu [splits, S, 2I] float32 (scaled_decode_up's); the rest as
    # scaled_experts_decode's.
    params=(Param("gu_ptr", "*T", "operand"), IDS, *W2, *BIASES,
            Param("parts_ptr", "*O", "output", aligned=True), *EXTENTS, SPLITS, *W2_STRIDES),
    dtypes=("float32",),
    **SPLIT_FAMILY,
)
