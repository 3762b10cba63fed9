"""widen_mxfp4: MXFP4 expert weights [G, N, K] (values two a byte along K,
an e8m0 scale a 32) widened to float8_e4m3fn in 128 x 128 blocks with
float32 block scales (aot/kernels/widen_fp8.py), the form fp8 moe_experts
reads: moe_experts' prefill with MXFP4 weights runs the fp8 products on this
copy (csrc/ops/expert_products_w4.cc).  sm90 only, as the fp8 products.  The
family's dtype is the tokens' (bfloat16) of the calls that take it."""
from ..family import Config, Family, Param
from ..kernels.widen_fp8 import BLOCK, widen_mxfp4_kernel

# Memory-bound: one 128 x 128 block a tile, persistent over the blocks; 8
# warps, so that a thread's share of a tile (its words, their scales and
# tables, the e4m3 words) leaves room for several programs an SM.
CONFIGS = (Config(BLOCK.value, BLOCK.value, 16, 8, 1),)

FAMILY = Family(
    name="widen_mxfp4",
    kernel=widen_mxfp4_kernel,
    params=(
        Param("v_ptr", "*u8", "operand"),
        Param("s_ptr", "*u8", "operand"),
        Param("q_ptr", "*fp8e4nv", "output"),
        Param("bs_ptr", "*fp32", "output"),
        Param("G", "i32", "count"),
        Param("N", "i32", "extent"),
        Param("K", "i32", "extent"),
        *(Param(name, "i64", "stride") for name in ("v_group_stride", "ldv", "s_group_stride",
                                                     "lds")),
    ),
    dtypes=("bfloat16",),
    archs=(90,),
    configs={(90, "basic"): CONFIGS},
    tiles="G * cdiv(N, 128) * cdiv(K, 128)",
    rows="N",
)
