"""scaled_decode_split: moe_experts' fp8 decode forward with H spread over
programs, in one launch (aot/kernels/experts_decode_split.py): each slot's
gate and up sums in parts of H, its h once the parts are in, then every
token's rows of the down projection, weighted and summed over its slots.
Taken instead of the one-kernel forward (scaled_experts_decode) and
combine_parts where a call's units are too few to keep the SMs reading
(csrc/ops/expert_products_fp8_decode.cc decode_splits).  The family's dtype
is the tokens' (16-bit), the output bfloat16 as combine_parts'; the weights
are float8_e4m3fn, w13 by TMA, sm90."""
from ..family import Config, Family, Param
from ..kernels.experts_decode import MAX_SLOTS
from ..kernels.experts_decode_split import scaled_decode_split_kernel
from .scaled_experts_decode import (BIASES, DECODE_FAMILY, EXTENTS, IDS, TOKENS, TOP_K, W2,
                                    W2_STRIDES, W13, W13_STRIDES)

FEW_SLOTS = f"T * k <= {MAX_SLOTS.value}"

# BM: the MMAs' N (a slot's row of it used); BN: H's rows a down ticket,
# which takes 256 // BN of a token's (slot, chunk) pairs a step; BK: a K
# step, one scale block.  Where H is wide (DeepSeek-V3's 7168), 32 rows a
# down ticket on 8 warps; where a token has more than 16 pairs (Qwen3's TP2
# shard, I = 384, at k = 8: 24), 8 rows on 8 warps, every pair in one step;
# elsewhere (Qwen3's TP4 shard: 16 pairs) 16 on 4
# (docs/notes/2026-11-30-fp8-decode-split-in-one-launch.md,
# docs/notes/2026-11-30-fp8-decode-split-down-steps.md).
CONFIGS = (Config(16, 32, 128, 8, 3, when="wide"), Config(16, 8, 128, 8, 3, when="many_pairs"),
           Config(16, 16, 128, 4, 3, when="few_slots"))

FAMILY = Family(
    name="scaled_decode_split",
    kernel=scaled_decode_split_kernel,
    # As scaled_experts_decode's, and: weights [T * k] float32, the slots'
    # routing weights; the scratch gu [splits, units, 256] float32, h
    # [units, 128] e4m3 and its scales [units], counters [2 + units] int32
    # zeroed (units = T * k * cdiv(I, 128)); out [T, H].
    params=(*TOKENS, IDS, Param("weights_ptr", "*fp32", "scale"), TOP_K, *W13, *W2, *BIASES,
            Param("gu_ptr", "*fp32", "output"), Param("h_ptr", "*fp8e4nv", "output"),
            Param("h_scale_ptr", "*fp32", "output"), Param("counters_ptr", "*i32", "output"),
            Param("out_ptr", "*O", "output", aligned=True), Param("T", "i32", "extent"),
            *EXTENTS[1:], Param("splits", "i32", "extent"), *W13_STRIDES, *W2_STRIDES),
    **DECODE_FAMILY,
    # The up tickets' stages: a K step of gate's and up's 128 rows each.
    weight_rows=256,
    out_dtypes=("bfloat16",),
    configs={(90, "tma"): CONFIGS},
    # The decode path's most slots (scaled_experts_decode's).
    conditions={"few_slots": FEW_SLOTS, "wide": f"{FEW_SLOTS} and H >= 4096",
                "many_pairs": f"{FEW_SLOTS} and k * cdiv(N // 2, 128) > 16"},
    # The tickets: every unit's parts, then every token's down rows.
    tiles="T * k * cdiv(N // 2, 128) * splits + T * cdiv(H, BN)",
    rows="T",
)
