"""swiglu_backward_fp8: SwiGLU's backward with its outputs quantized for fp8
training with 1x128 blocks (aot/kernels/swiglu_backward_fp8.py): gu [R, 2C],
the gradient of h and the rows' routing weights -> d(gu) quantized along its
rows and along T within the groups, h scaled by the routing weight
quantized along T, each row's dot partials and, where asked (the `sums`
axis), d(gu)'s sums over the column layout's row blocks (b13's gradient,
summed over a group's blocks).  bfloat16 in (the fp8 forward's gu and
products are bfloat16), float8_e4m3fn out; sm90 only, as
the fp8 GEMMs; `aligned` only (its copies move 16 bytes: the operator
copies an input that does not start at 16 bytes)."""
from ..axes import EVERY, GATE_UP, Axis, Choice
from ..family import Config, Family, Param
from .swiglu import ACTIVATION_PARAM
from ..kernels.swiglu_backward_fp8 import swiglu_backward_fp8_kernel

# A tile is one 128-row block by 128 of h's columns, computed BK = 64 at a
# time from its inputs copied into shared memory while the tile before runs,
# and staged in their place (two 96 KiB buffers).  16 warps, one program an SM:
# ahead of 8 warps at one program an SM or two (those spill under ptxas'
# 128-register cap) in an H100 A/B of the configs forced, each against the
# composed kernels (docs/notes/2026-11-26-swiglu-backward-quantized-in-place.md).
# BK = 32 ran ahead of 16 and 8 (fewer steps, and ptxas spills less), its
# outputs the same (docs/notes/2026-11-27-weights-both-ways-and-swiglu-steps.md);
# BK = 64 ahead of 32 on interleaved gate/up, level on concatenated
# (docs/notes/2026-11-27-column-quantization-in-flight.md).  Phase 2 reading
# each staged block whole, stores streaming: faster on concatenated gate/up,
# a little slower on interleaved
# (docs/notes/2026-11-27-swiglu-backward-whole-block-columns.md).  The two
# input buffers (a tile's copies landing while the one before runs): faster
# on concatenated gate/up, a little slower on interleaved; BK = 128 slower on
# both (docs/notes/2026-11-27-swiglu-backward-two-buffers.md).
TILE = (Config(128, 128, 64, 16, 1),)
# Whether d(gu)'s column sums (b13's gradient) are written: a compile-time
# choice, so that the kernels without them are those measured above.
SUMS = Choice("Sums", ("none", "dgu"))

FAMILY = Family(
    name="swiglu_backward_fp8",
    kernel=swiglu_backward_fp8_kernel,
    params=(
        Param("gu_ptr", "*T", "operand", aligned=True),
        Param("grad_ptr", "*T", "operand", aligned=True),
        Param("scale_ptr", "*fp32", "scale"),
        Param("offs_ptr", "*i32", "offsets"),
        Param("dgu_q_ptr", "*O", "output", aligned=True),
        Param("dgu_scale_ptr", "*fp32", "output"),
        Param("dgu_cols_ptr", "*O", "output", aligned=True),
        Param("dgu_cols_scale_ptr", "*fp32", "output"),
        Param("h_cols_ptr", "*O", "output", aligned=True),
        Param("h_cols_scale_ptr", "*fp32", "output"),
        Param("dot_ptr", "*fp32", "output"),
        Param("dgu_cols_sum_ptr", "*fp32", "output"),
        Param("R", "i32", "extent"),
        Param("C", "i32", "extent", aligned=True),
        Param("G", "i32", "count"),
        ACTIVATION_PARAM,
    ),
    axes=(Axis("gate_up", GATE_UP), Axis("sums", SUMS)),
    constexprs=lambda v: {"INTERLEAVED": v["gate_up"] == "interleaved",
                          "SUMS": v["sums"] == "dgu"},
    aligned=EVERY,
    basic=False,
    dtypes=("bfloat16",),
    out_dtypes=("float8_e4m3fn",),
    archs=(90,),
    configs={(90, "aligned"): TILE},
    tiles="(R // 128 + G) * cdiv(C, BN)",
    rows="C",  # the bucket key: one config, with no bound, takes every value
)
