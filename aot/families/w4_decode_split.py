"""w4_decode_split: moe_experts' 4-bit forward for a few slots with H spread
over programs, in one launch (aot/kernels/w4_decode_split.py, Gluon): each
slot's gate and up sums in parts of H, its h once the parts are in, then
every token's rows of the down projection over parts of its (slot, chunk)
pairs, weighted and summed.  Taken instead of the routed decode kernels
(w4_decode_glu, w4_decode_down) where a call's up projection has few units
(csrc/ops/expert_products_w4.cc); mma.sync is sm80's, so both archs compile
it.  The family's dtype is the tokens' (bfloat16), the output's too."""
from ..family import Config, Family, Param
from .swiglu import ACTIVATION_PARAM
from .w4_glu import FAMILY as W4_GLU
from ..kernels.w4_decode_split import w4_decode_split_kernel

# BM: the MMA's rows (a slot's token is row 0); BN: H's rows a down ticket;
# BK: an up ticket's K step (16-byte loads of each thread's words).  From an
# H200 sweep (docs/notes/2026-12-01-w4-decode-split.md).
# Every config's BN is DOWN_ROWS and its BK UP_STEP, which the operator sizes
# its counters and parts by.
DOWN_ROWS, UP_STEP = 64, 256
CONFIGS = (Config(16, DOWN_ROWS, UP_STEP, 4, 1),)

PARAMS = (
    Param("x_ptr", "*T", "operand", aligned=True),
    Param("ids_ptr", "*i64", "operand"),
    Param("weights_ptr", "*fp32", "scale"),
    Param("k", "i32", "extent"),
    Param("w13_ptr", "*u8", "operand", aligned=True),
    Param("w13_scale_ptr", "*u8", "operand"),
    Param("w2_ptr", "*u8", "operand", aligned=True),
    Param("w2_scale_ptr", "*u8", "operand"),
    ACTIVATION_PARAM,
    # Scratch: gu [splits, units, 256] float32, h [units, 128], dsum
    # [down_splits, T, H] float32, counters [2 + units + T * cdiv(H, BN)]
    # int32 zeroed (units = T * k * cdiv(I, 128)); out [T, H].
    Param("gu_ptr", "*fp32", "output"),
    Param("h_ptr", "*T", "output"),
    Param("dsum_ptr", "*fp32", "output"),
    Param("counters_ptr", "*i32", "output"),
    Param("out_ptr", "*O", "output", aligned=True),
    Param("T", "i32", "extent"),
    Param("H", "i32", "row_length", aligned=True),
    Param("N", "i32", "row_length", aligned=True),
    Param("G", "i32", "count"),
    Param("splits", "i32", "extent"),
    Param("down_splits", "i32", "extent"),
    *(Param(name, "i64", "stride") for name in (
        "w13_group_stride", "ld13", "w13_scale_group_stride", "lds13",
        "w2_group_stride", "ld2", "w2_scale_group_stride", "lds2")),
)

FAMILY = Family(
    name="w4_decode_split",
    kernel=w4_decode_split_kernel,
    params=PARAMS,
    axes=W4_GLU.axes,
    constexprs=W4_GLU.constexprs,
    dtypes=("bfloat16",),
    archs=(80, 90),
    configs={(arch, "basic"): CONFIGS for arch in (80, 90)},
    # The tickets: every unit's parts, then every token's row tiles' parts.
    tiles="T * k * cdiv(N // 2, 128) * splits + T * cdiv(H, BN) * down_splits",
    rows="T",
    constants={"kDownRows": DOWN_ROWS, "kUpStep": UP_STEP},
)
