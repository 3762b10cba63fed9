"""combine: the weighted combine that ends moe_experts' forward
(aot/kernels/combine.py): each token's k rows of the down projection, found
through the inverse of the sort by expert, scaled by its routing weights and
summed.  Memory-bound and made of plain loads: every arch, `aligned` (16-byte
vectors) where the pointers and H allow it, else `basic`."""
from ..axes import EVERY
from ..family import Config, Family, Param
from ..kernels.combine import combine_kernel

# A program takes BM tokens x BN columns: 4 warps over 8 x 256 elements, 16 of
# each row a thread, in 16-byte vectors.
CONFIGS = (Config(8, 256, 16, 4, 1),)

FAMILY = Family(
    name="combine",
    sm80_ptx=True,
    kernel=combine_kernel,
    params=(
        Param("rows_ptr", "*T", "operand", aligned=True),
        Param("index_ptr", "*i64", "operand"),
        Param("weights_ptr", "*fp32", "scale"),
        Param("offs_ptr", "*i32", "offsets"),
        Param("out_ptr", "*T", "output", aligned=True),
        Param("R", "i32", "extent"),
        Param("T", "i32", "extent"),
        Param("H", "i32", "extent", aligned=True),
        Param("K", "i32", "extent"),
        Param("G", "i32", "count"),
    ),
    aligned=EVERY,
    dtypes=("float16", "bfloat16"),
    configs={(arch, flavour): CONFIGS for arch in (80, 90) for flavour in ("basic", "aligned")},
    tiles="cdiv(T, BM) * cdiv(H, BN)",
    rows="T",
)
