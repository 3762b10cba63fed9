"""scaled_ragged_k: the fp8 weight gradient, out[G, M, N] with out[g] = a_g @
b_g^T, from a [M, W] and b [N, W] quantized along T within each group
(quantize_fp8_columns' padded layout), scaled per row per group or per 1x128
block (aot/kernels/scaled_k.py).  sm90 TMA only, as every fp8 GEMM here."""
from ..axes import EVERY, Axis, Where
from ..family import Config, Family, Param
from ..kernels.scaled_k import scaled_ragged_k_kernel
from ..kernels.scaled_k_ws import scaled_ragged_k_ws_kernel
from .ragged_m import POINTERS, RAGGED_ROWS_LIMIT
from .scaled_ragged_m import SCALING, SCALINGS

FAMILY = Family(
    name="scaled_ragged_k",
    kernel=scaled_ragged_k_kernel,
    ws_kernel=scaled_ragged_k_ws_kernel,
    params=POINTERS + (
        Param("scale_a_ptr", "*fp32", "scale"),
        Param("scale_b_ptr", "*fp32", "scale"),
        Param("M", "i32", "extent", aligned=True),
        Param("N", "i32", "extent", aligned=True),
        Param("T", "i32", "extent", tma_limit=RAGGED_ROWS_LIMIT),
        Param("G", "i32", "count"),
        Param("ldc", "i64", "stride", aligned=True),
    ),
    axes=(Axis("scaling", SCALING, only=("rowwise", "blockwise")),),
    constexprs=lambda v: {"SCALING": SCALINGS[v["scaling"]]},
    tma=EVERY,
    basic=False,
    dtypes=("float8_e4m3fn",),
    out_dtypes=("bfloat16", "float32"),
    archs=(90,),
    # Rowwise: the best of five Triton tiles on an H100; blockwise: the
    # warp-specialised kernel, which ran faster than every Triton tile
    # (docs/notes/2026-11-25-fp8-grouped-mm-training.md).
    ring_scales=True,
    configs={(90, "tma", Where(scaling="rowwise")): (Config(256, 128, 128, 8, 3),),
             (90, "tma", Where(scaling="blockwise")): (Config(128, 128, 128, 4, 4, ws=True),)},
    tiles="G * cdiv(M, BM) * cdiv(N, BN)",
    rows="M",
)
