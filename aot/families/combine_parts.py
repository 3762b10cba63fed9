"""combine_parts: the combine of rows made in parts, float32 (aot/kernels/
combine.py combine_parts_kernel): the decode forward's down projection
(scaled_experts_decode) leaves each slot's product in one part per chunk
of h's columns; this sums a token's slots' parts, weighted, into bfloat16.
Memory-bound plain loads, sm90 (the fp8 forward's only)."""
from ..axes import EVERY
from ..family import Config, Family, Param
from ..kernels.combine import combine_parts_kernel

# A program takes one token x BN columns, BK parts at a time: 8 warps over
# [256, 32] float32 elements, 16-byte vectors along the columns, so that a
# decode call's parts (k x cdiv(I, 128): 224 for Mixtral) are one step of
# loads in flight.  Where a token has few parts and H is wide (`few_parts`:
# DeepSeek-V3's tensor-parallel shards, one or two chunks of h), most of that
# step is masked and the tiles are many and small: there 4 warps over
# [16, 512].  At H = 2048 a token has only four such tiles, and the narrow
# ones measured faster up to 4 tokens
# (docs/notes/2026-11-30-fp8-decode-combine-tiles-and-tma-alignment.md).
FEW_PARTS = 16
CONFIGS = (Config(1, 512, FEW_PARTS, 4, 1, when="few_parts"), Config(1, 32, 256, 8, 1))

FAMILY = Family(
    name="combine_parts",
    kernel=combine_parts_kernel,
    params=(
        Param("parts_ptr", "*T", "operand", aligned=True),
        Param("ids_ptr", "*i64", "operand"),
        Param("weights_ptr", "*fp32", "scale"),
        Param("out_ptr", "*O", "output", aligned=True),
        Param("T", "i32", "extent"),
        Param("H", "i32", "extent", aligned=True),
        Param("K", "i32", "extent"),
        Param("G", "i32", "count"),
        Param("P", "i32", "extent"),
    ),
    aligned=EVERY,
    basic=False,
    dtypes=("float32",),
    out_dtypes=("bfloat16",),
    archs=(90,),
    configs={(90, "aligned"): CONFIGS},
    conditions={"few_parts": f"K * P <= {FEW_PARTS} and H >= 4096"},
    tiles="T * cdiv(H, BN)",
    rows="T",
)
