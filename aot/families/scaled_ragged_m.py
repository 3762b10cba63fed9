"""scaled_ragged_m: fp8 ragged_m with float32 scales (torch._scaled_grouped_mm,
2-D x 3-D and, through offsets, 3-D x 3-D): out[T, N], rows offs[g-1]:offs[g]
of a [T, K] times b[g] stored [N, K], scaled rowwise or per 128-block
(aot/kernels/scaled.py).  sm90 TMA only: fp8 MMA needs sm89+, and TMA's
alignment is what torch requires of fp8 inputs too."""
from ..axes import EVERY, Axis, Choice, Where
from ..family import Config, Family, Param
from ..kernels.ragged import scaled_ragged_m_kernel
from ..kernels.ragged_ws import scaled_ragged_m_ws_kernel
from ..kernels.scaled import BLOCKWISE, BLOCKWISE_ROWWISE, ROWWISE
from .ragged_m import BIAS, POINTERS, RAGGED_ROWS_LIMIT

# How the scales apply (aot/kernels/scaled.py): per row of a and column of
# b, per 1x128 block of a and 128x128 block of b, or per 1x128 block of a
# and column of b; SCALINGS gives the kernels' SCALING for each.
SCALING = Choice("Scaling", ("rowwise", "blockwise", "blockwise_rowwise"))
SCALINGS = {"rowwise": ROWWISE.value, "blockwise": BLOCKWISE.value,
            "blockwise_rowwise": BLOCKWISE_ROWWISE.value}
# How the tensor cores' fp8 products are summed (kernels/scaled.py FAST_ACCUM):
# each K step's product added to float32 by the CUDA cores, or all of K in
# the tensor cores' own precision (torch's use_fast_accum=True).
ACCUMULATION = Choice("Accumulation", ("promoted", "fast"))

FAMILY = Family(
    name="scaled_ragged_m",
    kernel=scaled_ragged_m_kernel,
    ws_kernel=scaled_ragged_m_ws_kernel,
    params=POINTERS + (
        Param("scale_a_ptr", "*fp32", "scale"),
        Param("scale_b_ptr", "*fp32", "scale"),
        Param("T", "i32", "extent", tma_limit=RAGGED_ROWS_LIMIT),
        Param("N", "i32", "extent"),
        Param("K", "i32", "extent"),
        Param("G", "i32", "count"),
        Param("lda", "i64", "stride"),
        Param("b_group_stride", "i64", "stride"),
        Param("ldb", "i64", "stride"),
        Param("ldc", "i64", "stride"),
    ) + BIAS,
    axes=(Axis("scaling", SCALING), Axis("accumulation", ACCUMULATION)),
    constexprs=lambda v: {"SCALING": SCALINGS[v["scaling"]],
                          "FAST_ACCUM": v["accumulation"] == "fast"},
    tma=EVERY,
    basic=False,
    dtypes=("float8_e4m3fn",),
    out_dtypes=("bfloat16", "float32"),
    archs=(90,),
    # Chosen from H100 measurements (docs/notes/2026-11-22-full-bench-h100.md,
    # 2026-11-23-bias-fp8-accumulation-training.md,
    # 2026-11-25-interleaved-blocks-and-small-routes.md): past decode, the
    # warp-specialised kernel (kernels/ragged_ws.py), whose two MMA
    # warpgroups take 64 rows each of a 128x256 tile (blockwise: one
    # accumulator rescaled between K blocks, 3 stages: 4 ran no faster), or,
    # blockwise on groups of up to 128 rows, take turns at 64x256 tiles (one's
    # epilogue runs while the other's MMAs do; the split tile is as fast from
    # 256 rows on).  Rowwise decode takes 64x128 tiles of the Triton kernel.
    # Decode with blockwise activations (moe_experts' down projection, with
    # either weights) takes the turns too: the Triton kernel pipelines a
    # tile's K loop only, and the down projection on tensor-parallel shards
    # has one or two K steps a tile (I = 128, 256), where the
    # warp-specialised loader reads the next tiles' weights during this one's
    # (H200: 2026-11-30-fp8-down-projection-loads-across-tiles.md).  Decode
    # with few groups and few 128-column tiles (`few_tiles`: Mixtral's two
    # experts at T = 1 have 64, on 132 SMs) takes 64-column tiles, eight
    # stages deep, so that more programs stream the weights
    # (2026-11-26-routing-bins-and-decode-read-floor.md).
    # Without fast accumulation a second register tile holds each K step's
    # product: 128-column tiles of the warp-specialised kernel, two 64-row
    # partitions (rowwise: faster than the Triton kernel's 128x128 tiles beyond
    # decode); untuned.
    configs={(90, "tma", Where(scaling="rowwise", accumulation="fast")):
             (Config(64, 128, 128, 4, 4, max_rows=32), Config(128, 256, 128, 4, 4, ws=True)),
             (90, "tma", Where(scaling="blockwise", accumulation="fast")):
             (Config(64, 64, 128, 4, 8, max_rows=32, when="few_tiles"),
              Config(64, 256, 128, 4, 4, max_rows=128, ws=True, pingpong=True),
              Config(128, 256, 128, 4, 3, ws=True)),
             # blockwise's schedule (one unit a row instead of one a 128
             # columns).
             (90, "tma", Where(scaling="blockwise_rowwise", accumulation="fast")):
             (Config(64, 256, 128, 4, 4, max_rows=128, ws=True, pingpong=True),
              Config(128, 256, 128, 4, 3, ws=True)),
             (90, "tma"): (Config(64, 128, 128, 4, 4, max_rows=32),
                           Config(128, 128, 128, 4, 4, ws=True))},
    # Groups with rows (at most min(G, T)) times 128-column tiles: fewer than
    # an H100's or H200's SMs.
    conditions={"few_tiles": "min(G, T) * cdiv(N, 128) < 128"},
    # As ragged_m: one partial m-tile per group boundary, +1 for the rows past the last group.
    tiles="0 if T == 0 else (cdiv(T, BM) + G + 1) * cdiv(N, BN)",
    rows="T // max(G, 1)",
)
