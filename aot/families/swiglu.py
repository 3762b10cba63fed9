"""swiglu: the SwiGLU between an MoE layer's grouped products (moe_experts),
forward and backward (aot/kernels/swiglu.py), plain or gpt-oss's clamped
form: gu [R, 2C] -> h [R, C]; and
gu, the gradient of h, the rows' routing weights -> the gradient of gu, the
scaled h and each row's dot product of h with its gradient.  Memory-bound
and made of plain loads: every arch, `aligned` (16-byte vectors) where the
pointers and C allow it, else `basic`."""
from ..axes import ACTIVATION, EVERY, GATE_UP, Axis, Choice
from ..family import Config, Family, Param
from ..kernels.swiglu import swiglu_kernel

# A program takes BM rows and walks them BN columns at a time.  4 warps over
# 8 x 256 elements: 16 elements of each tensor a thread, in 16-byte vectors.
CONFIGS = (Config(8, 256, 16, 4, 1),)

DIRECTION = Choice("Direction", ("forward", "backward"))
# Every family with an activation takes it so: a run-time choice.
ACTIVATION_PARAM = Param("activation", "i32", "choice", choice=ACTIVATION)

FAMILY = Family(
    name="swiglu",
    sm80_ptx=True,
    kernel=swiglu_kernel,
    params=(
        Param("gu_ptr", "*T", "operand", aligned=True),
        Param("grad_ptr", "*T", "operand", aligned=True),
        Param("scale_ptr", "*fp32", "scale"),
        Param("h_ptr", "*T", "output", aligned=True),
        Param("dgu_ptr", "*T", "output", aligned=True),
        Param("dot_ptr", "*fp32", "output"),
        Param("R", "i32", "extent"),
        Param("C", "i32", "extent", aligned=True),
        ACTIVATION_PARAM,
    ),
    axes=(Axis("direction", DIRECTION), Axis("gate_up", GATE_UP)),
    constexprs=lambda v: {"BACKWARD": v["direction"] == "backward",
                          "INTERLEAVED": v["gate_up"] == "interleaved"},
    aligned=EVERY,
    dtypes=("float16", "bfloat16"),
    configs={(arch, flavour): CONFIGS for arch in (80, 90) for flavour in ("basic", "aligned")},
    tiles="cdiv(R, BM)",
    rows="C",
)
