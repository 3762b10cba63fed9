"""scaled_decode_down: the activation and down projection of moe_experts'
fp8 decode forward with each unit's H cut into parts (aot/kernels/
experts_decode_split.py): sums scaled_decode_up's parts of gu, applies the
activation, quantizes h per slot per 128 columns and writes its part of H of
the down projection, float32 [S, C, H], as scaled_experts_decode does;
combine_parts sums them.  The family's dtype is gu's (float32); the weights
are float8_e4m3fn, by TMA, sm90."""
from ..family import EVERY, GATE_UP, Axis, Config, Family, Param
from ..kernels.experts_decode_split import scaled_decode_down_kernel
from .scaled_experts_decode import FEW_SLOTS, decode_constexprs
from .scaled_ragged_m import SCALING

# BM: slot rows a unit (the MMAs' N); BN: w2's rows a step.
CONFIGS = (Config(16, 128, 128, 4, 3, when="few_slots"),)

FAMILY = Family(
    name="scaled_decode_down",
    kernel=scaled_decode_down_kernel,
    # gu [splits, S, 2I] float32 (scaled_decode_up's); the rest as
    # scaled_experts_decode's.
    params=(
        Param("gu_ptr", "*T", "operand"),
        Param("ids_ptr", "*i64", "operand"),
        Param("w2_ptr", "*fp8e4nv", "operand", aligned=True),
        Param("w2_scale_ptr", "*fp32", "scale"),
        Param("b13_ptr", "*bf16", "bias"),
        Param("has_b13", "i32", "flag"),
        Param("b2_ptr", "*bf16", "bias"),
        Param("has_b2", "i32", "flag"),
        Param("gpt_oss", "i32", "flag"),
        Param("parts_ptr", "*O", "output", aligned=True),
        Param("S", "i32", "extent"),
        Param("H", "i32", "row_length", aligned=True),
        Param("N", "i32", "row_length", aligned=True),
        Param("G", "i32", "count"),
        Param("splits", "i32", "extent"),
        Param("w2_group_stride", "i64", "stride", aligned=True),
        Param("ld2", "i64", "stride", aligned=True),
    ),
    axes=(Axis("scaling", SCALING, only=("rowwise", "blockwise")), Axis("gate_up", GATE_UP)),
    constexprs=decode_constexprs,
    tma=EVERY,
    basic=False,
    dtypes=("float32",),
    weights="float8_e4m3fn",
    out_dtypes=("float32",),
    archs=(90,),
    configs={(90, "tma"): CONFIGS},
    conditions={"few_slots": FEW_SLOTS},
    tiles="0 if S == 0 else (cdiv(S, BM) + min(S, G)) * cdiv(N // 2, 128) * splits",
    rows="S // max(G, 1)",
)
