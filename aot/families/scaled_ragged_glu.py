"""scaled_ragged_glu: moe_experts' up projection in fp8, for serving
(kernels/ragged.py scaled_ragged_glu_kernel): ragged_glu's gathered product
and activation on float8_e4m3fn tokens and weights with float32 scales
(scaled_ragged_m's SCALING), h written in float8_e4m3fn with one scale per
row and 128 columns, the down projection's blockwise input; gu (the product
plus bias, bfloat16 [T, N]) written too where the `gu` axis is "kept" (fp8
training's forward keeps it for the backward), else never in memory."""
from dataclasses import replace

from ..axes import EVERY, GATE_UP, Axis, Choice, Where
from ..family import Config, Family, Param
from ..kernels.glu import CONCATENATED, INTERLEAVED
from ..kernels.ragged import scaled_ragged_glu_kernel
from ..kernels.ragged_ws import scaled_ragged_glu_ws_kernel
from .ragged_glu import GATHERED_EXTENTS, ROWS
from .ragged_m import FAMILY as RAGGED_M, POINTERS
from .scaled_ragged_m import SCALING, SCALINGS
from .swiglu import ACTIVATION_PARAM

TRITON_DECODE = Config(64, 256, 128, 8, 5, max_rows=32)
SWAPPED = Config(32, 256, 128, 4, 4, max_rows=16)
PINGPONG = Config(64, 256, 128, 4, 4, max_rows=512, ws=True, pingpong=True)
SPLIT = Config(128, 256, 128, 4, 3, ws=True)


def halves(*configs) -> tuple:
    """The warp-specialised configs for concatenated 128 x 128 blocks: each
    for whole halves and for odd ones (FAMILY's conditions)."""
    return tuple(replace(c, when=when) for c in configs for when in ("whole_halves", "odd_halves"))


# Whether gu is written (a compile-time choice: serving's kernels stage only
# fp8 h, training's stage bf16 gu in the same buffer, twice as large).
GU = Choice("Gu", ("dropped", "kept"))

FAMILY = Family(
    name="scaled_ragged_glu",
    kernel=scaled_ragged_glu_kernel,
    ws_kernel=scaled_ragged_glu_ws_kernel,
    # a: the tokens [*, K], gathered (ROWS); b: w13 [G, N, K] K-major; c: h
    # [T, N / 2]; c_scale: h's scales [T, cdiv(N / 2, 128)]; bias: bfloat16
    # [G, N]; gu: bfloat16 [T, N] (read only where kept).
    params=POINTERS + (
        Param("scale_a_ptr", "*fp32", "scale"),
        Param("scale_b_ptr", "*fp32", "scale"),
        Param("c_scale_ptr", "*fp32", "output"),
    ) + GATHERED_EXTENTS + (
        Param("bias_ptr", "*bf16", "bias"),
        Param("has_bias", "i32", "flag"),
        ACTIVATION_PARAM,
        Param("gu_ptr", "*bf16", "output", aligned=True),
    ) + ROWS,
    axes=(Axis("scaling", SCALING, only=("rowwise", "blockwise")), Axis("gate_up", GATE_UP),
          Axis("gu", GU)),
    constexprs=lambda v: {"SCALING": SCALINGS[v["scaling"]],
                          "GLU": CONCATENATED if v["gate_up"] == "concatenated" else INTERLEAVED,
                          "SAVE_GU": v["gu"] == "kept"},
    tma=EVERY,
    basic=False,
    dtypes=("float8_e4m3fn",),
    out_dtypes=("float8_e4m3fn",),
    staged=lambda v: "bfloat16" if v["gu"] == "kept" else None,
    archs=(90,),
    # The warp-specialised kernel scales each of a tile's column blocks by
    # one 128 x 128 weight block (kernels/mma_ws.py column_blocks).
    # Interleaved, a 256-column tile at a multiple of 256 covers two whole
    # blocks of w13's rows at any I.  Concatenated, its gate and up halves are
    # 128 columns from each half of w13: one weight block each where I = N /
    # 2 is a multiple of 128 (`whole_halves`); where it is an odd multiple of
    # 64 the up half's blocks start mid-tile, and the kernel compiled for
    # `odd_halves` scales blocks of 64 columns (a unit more per row and block
    # kept through the K loop: slower where 128 would do).  Other widths
    # take the Triton kernel (per-column scales) at every size.  Per-channel
    # weights scale each column (channel_scaled): any I.
    conditions={"whole_halves": "N // 2 == cdiv(N // 2, 128) * 128",
                "odd_halves": "cdiv(N // 2, 128) * 128 - N // 2 == 64"},
    when_constexprs={"odd_halves": {"BLOCK_COLUMNS": 64}},
    # A tile's h columns are one 128-column scale block: BN = 256.  Groups of
    # up to 16 rows on average (decode's) take the Triton kernel's 32-row
    # tiles, computed transposed (scaled.py scaled_columns: the weights' rows
    # are the MMA's M, the tokens its N).  Groups of up to 512 rows take the
    # warp-specialised kernel's 64-row tiles, its two MMA partitions taking
    # turns at them (pingpong: one's SwiGLU and quantization run while the
    # other's MMAs do; its loader runs ahead across tiles); larger groups its
    # 128-row tiles split between the two (their wgmma reads B once for twice
    # the rows).  Per-channel weights with up to 32 rows an expert keep the
    # Triton kernel's 64-row tiles, which read the weights faster there (five
    # stages in flight).  Chosen from H100 A/Bs
    # (docs/notes/2026-11-25-fp8-experts-fused-up-projection.md,
    # docs/notes/2026-11-25-pingpong-partitions.md,
    # docs/notes/2026-11-28-fp8-decode-floors-and-transposed-tiles.md).
    # Training's kernels (gu kept) are the split tiles only (and the Triton
    # kernel where blockwise needs it): its groups are large, and the wheel
    # carries no more variants than a path runs.
    configs={(90, "tma", Where(scaling="rowwise", gu="dropped")): (
                 SWAPPED, TRITON_DECODE, PINGPONG, SPLIT),
             (90, "tma", Where(scaling="blockwise", gu="dropped", gate_up="interleaved")): (
                 SWAPPED, PINGPONG, SPLIT),
             (90, "tma", Where(scaling="blockwise", gu="dropped")): (
                 SWAPPED, *halves(PINGPONG, SPLIT), replace(TRITON_DECODE, max_rows=0)),
             (90, "tma", Where(scaling="rowwise", gu="kept")): (SPLIT,),
             (90, "tma", Where(scaling="blockwise", gu="kept", gate_up="interleaved")): (SPLIT,),
             (90, "tma", Where(scaling="blockwise", gu="kept")): (
                 *halves(SPLIT), replace(TRITON_DECODE, max_rows=0))},
    tiles=RAGGED_M.tiles,
    rows="T // max(G, 1)",
)
