"""scaled_experts_decode: moe_experts' fp8 forward for serving's decode in
one kernel (aot/kernels/experts_decode.py, and its warp-specialised twin
aot/kernels/experts_decode_ws.py): the routing of the call's slots, the
tokens' quantization (with 128 x 128 weight blocks; per-channel weights'
per-token scales come from quantize_fp8) and both projections of each unit, a tile of an
expert's slots and a 128-column chunk of h, which reads its w13 rows and w2
columns once and writes its part of the down projection, float32 [S, C, H];
combine_parts sums them.  Taken where a call has at most kMaxSlots slots
and at most two slots an expert on average (csrc/ops/
expert_products_fp8_decode.cc), where the weights' bytes are all the work:
with more rows an expert the two projections' kernels measured faster
(docs/notes/2026-11-27-fp8-decode-fewer-slots-than-experts.md,
2026-11-30-fp8-decode-two-slots-an-expert.md).  The family's dtype is
the tokens' (16-bit); the weights are float8_e4m3fn.
The weights come by TMA, the tokens' rows by 16-byte pointer loads or
copies (fp8's rules: aligned rows, H and I multiples of 16), sm90."""
from ..axes import EVERY, GATE_UP, Axis
from ..family import Config, Family, Param
from ..kernels.experts_decode import MAX_SLOTS, scaled_experts_decode_kernel
from ..kernels.experts_decode_ws import scaled_experts_decode_ws_kernel
from ..kernels.glu import CONCATENATED, INTERLEAVED
from .scaled_ragged_m import SCALING, SCALINGS
from .swiglu import ACTIVATION_PARAM

# BM: slot rows a unit, the MMAs' N; BN: w2's rows a step (the ws kernel: a
# box) of the down projection; BK: the up projection's step in whole scale
# blocks (the Triton kernel's one, 128).  A call
# with at most about two units an SM (`few_units`: a bound on the units, the
# tiles of groups with rows times h's chunks) takes the warp-specialised
# kernel, a program an SM with three 64 KB slots of weights in flight (BK =
# 256: each step two scale blocks) and, with 128 x 128 blocks, a second
# producer warpgroup quantizing the tokens; others the Triton kernel's three
# stages, several programs an SM, which balance more units better.  Chosen
# from H100 and H200 A/Bs
# (docs/notes/2026-11-27-fp8-decode-in-one-kernel.md,
# docs/notes/2026-11-27-fp8-decode-warp-specialised.md,
# docs/notes/2026-11-27-fp8-decode-ws-256-byte-steps.md,
# docs/notes/2026-11-30-fp8-decode-several-units-a-program.md).
FEW_SLOTS = f"S <= {MAX_SLOTS.value}"
CONFIGS = (Config(16, 256, 256, 4, 3, ws=True, when="few_units", producers=2),
           Config(16, 128, 128, 4, 3, when="few_slots"))


# The decode families' parameters, in groups that the split forward's family
# (scaled_decode_split.py) shares.  x: the tokens [*, H] (blockwise), or xq,
# x_scale: quantize_fp8's per token (rowwise), contiguous; ids: the slots'
# experts [S] (slot s is token s // k's); w13 [G, 2I, H], w2 [G, H, I] and
# their scales, contiguous; b13 [G, 2I], b2 [G, H].
TOKENS = (Param("x_ptr", "*T", "operand", aligned=True),
          Param("xq_ptr", "*fp8e4nv", "operand", aligned=True),
          Param("x_scale_ptr", "*fp32", "scale"))
IDS = Param("ids_ptr", "*i64", "operand")
TOP_K = Param("k", "i32", "extent")
W13 = (Param("w13_ptr", "*fp8e4nv", "operand", aligned=True),
       Param("w13_scale_ptr", "*fp32", "scale"))
W2 = (Param("w2_ptr", "*fp8e4nv", "operand", aligned=True), Param("w2_scale_ptr", "*fp32", "scale"))
BIASES = (Param("b13_ptr", "*bf16", "bias"), Param("has_b13", "i32", "flag"),
          Param("b2_ptr", "*bf16", "bias"), Param("has_b2", "i32", "flag"),
          ACTIVATION_PARAM)
EXTENTS = (Param("S", "i32", "extent"), Param("H", "i32", "row_length", aligned=True),
           Param("N", "i32", "row_length", aligned=True), Param("G", "i32", "count"))
W13_STRIDES = (Param("w13_group_stride", "i64", "stride", aligned=True),
               Param("ld13", "i64", "stride", aligned=True))
W2_STRIDES = (Param("w2_group_stride", "i64", "stride", aligned=True),
              Param("ld2", "i64", "stride", aligned=True))
AXES = (Axis("scaling", SCALING, only=("rowwise", "blockwise")), Axis("gate_up", GATE_UP))


def decode_constexprs(values: dict) -> dict:
    """The decode kernels' constexprs for a variant's axis values."""
    return {"SCALING": SCALINGS[values["scaling"]],
            "GLU": CONCATENATED if values["gate_up"] == "concatenated" else INTERLEAVED}


# What the decode families have alike: their axes, 16-bit tokens beside fp8
# weights, sm90's TMA.
DECODE_FAMILY = {"axes": AXES, "constexprs": decode_constexprs, "tma": EVERY, "basic": False,
                 "dtypes": ("bfloat16", "float16"), "weights": "float8_e4m3fn", "archs": (90,)}


FAMILY = Family(
    name="scaled_experts_decode",
    kernel=scaled_experts_decode_kernel,
    ws_kernel=scaled_experts_decode_ws_kernel,
    # The groups above; parts [S, C, H] float32.
    params=(*TOKENS, IDS, TOP_K, *W13, *W2, *BIASES,
            Param("parts_ptr", "*O", "output", aligned=True), *EXTENTS, *W13_STRIDES, *W2_STRIDES),
    **DECODE_FAMILY,
    out_dtypes=("float32",),
    configs={(90, "tma"): CONFIGS},
    # The kernels route at most MAX_SLOTS slots: no variant takes more.
    conditions={"few_slots": FEW_SLOTS,
                "few_units": f"{FEW_SLOTS} and min(S, G) * cdiv(N // 2, 128) <= 256"},
    constants={"kMaxSlots": MAX_SLOTS.value},
    tiles="0 if S == 0 else (cdiv(S, BM) + min(S, G)) * cdiv(N // 2, 128)",
    rows="S // max(G, 1)",
)
