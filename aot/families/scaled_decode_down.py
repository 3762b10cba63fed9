"""scaled_decode_down: the activation and down projection of moe_experts'
fp8 decode forward with each unit's H cut into parts (aot/kernels/
experts_decode_split.py): sums scaled_decode_up's parts of gu, applies the
activation, quantizes h per slot per 128 columns and writes its part of H of
the down projection, float32 [S, C, H], as scaled_experts_decode does;
combine_parts sums them.  The family's dtype is gu's (float32); the weights
are float8_e4m3fn, by TMA, sm90."""
from ..axes import EVERY
from ..family import Config, Family, Param
from ..kernels.experts_decode_split import scaled_decode_down_kernel
from .scaled_experts_decode import (AXES, BIASES, EXTENTS, FEW_SLOTS, IDS, SPLIT_TILES, SPLITS, W2,
                                    W2_STRIDES, decode_constexprs)

# BM: slot rows a unit (the MMAs' N); BN: w2's rows a step.
CONFIGS = (Config(16, 128, 128, 4, 3, when="few_slots"),)

FAMILY = Family(
    name="scaled_decode_down",
    kernel=scaled_decode_down_kernel,
    # gu [splits, S, 2I] float32 (scaled_decode_up's); the rest as
    # scaled_experts_decode's.
    params=(Param("gu_ptr", "*T", "operand"), IDS, *W2, *BIASES,
            Param("parts_ptr", "*O", "output", aligned=True), *EXTENTS, SPLITS, *W2_STRIDES),
    axes=AXES,
    constexprs=decode_constexprs,
    tma=EVERY,
    basic=False,
    dtypes=("float32",),
    weights="float8_e4m3fn",
    out_dtypes=("float32",),
    archs=(90,),
    configs={(90, "tma"): CONFIGS},
    conditions={"few_slots": FEW_SLOTS},
    tiles=SPLIT_TILES,
    rows="S // max(G, 1)",
)
