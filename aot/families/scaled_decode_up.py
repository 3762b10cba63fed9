"""scaled_decode_up: the up projection of moe_experts' fp8 decode forward
with each unit's H cut into parts (aot/kernels/experts_decode_split.py):
each part's gate and up sums, float32 [splits, S, 2I], for scaled_decode_down.
Taken instead of the one-kernel forward (scaled_experts_decode) where a
call's units are too few to keep the SMs reading
(csrc/ops/expert_products_fp8.cc decode_splits).  The family's dtype is the
tokens' (16-bit); the weights are float8_e4m3fn, by TMA, sm90."""
from ..family import EVERY, GATE_UP, Axis, Config, Family, Param
from ..kernels.experts_decode_split import scaled_decode_up_kernel
from .scaled_experts_decode import FEW_SLOTS, decode_constexprs
from .scaled_ragged_m import SCALING

# BM: slot rows a unit (the MMAs' N); BK: a K step, one scale block.
CONFIGS = (Config(16, 128, 128, 4, 3, when="few_slots"),)

FAMILY = Family(
    name="scaled_decode_up",
    kernel=scaled_decode_up_kernel,
    # As scaled_experts_decode's; gu [splits, S, 2I] float32; splits: the
    # parts of H a unit is cut into.
    params=(
        Param("x_ptr", "*T", "operand", aligned=True),
        Param("xq_ptr", "*fp8e4nv", "operand", aligned=True),
        Param("x_scale_ptr", "*fp32", "scale"),
        Param("ids_ptr", "*i64", "operand"),
        Param("k", "i32", "extent"),
        Param("w13_ptr", "*fp8e4nv", "operand", aligned=True),
        Param("w13_scale_ptr", "*fp32", "scale"),
        Param("gu_ptr", "*O", "output", aligned=True),
        Param("S", "i32", "extent"),
        Param("H", "i32", "row_length", aligned=True),
        Param("N", "i32", "row_length", aligned=True),
        Param("G", "i32", "count"),
        Param("splits", "i32", "extent"),
        Param("w13_group_stride", "i64", "stride", aligned=True),
        Param("ld13", "i64", "stride", aligned=True),
    ),
    axes=(Axis("scaling", SCALING, only=("rowwise", "blockwise")), Axis("gate_up", GATE_UP)),
    constexprs=decode_constexprs,
    tma=EVERY,
    basic=False,
    dtypes=("bfloat16", "float16"),
    weights="float8_e4m3fn",
    out_dtypes=("float32",),
    archs=(90,),
    configs={(90, "tma"): CONFIGS},
    conditions={"few_slots": FEW_SLOTS},
    tiles="0 if S == 0 else (cdiv(S, BM) + min(S, G)) * cdiv(N // 2, 128) * splits",
    rows="S // max(G, 1)",
)
