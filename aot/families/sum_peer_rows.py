"""sum_peer_rows: expert parallelism's return on one host
(aot/kernels/sum_peer_rows.py): each token's output rows read from the
peers' symmetric buffers through a table of their addresses and summed.
Memory-bound, plain loads: every arch, `aligned` (16-byte vectors) where H
allows it, else `basic`; 16-bit rows (outputs, the tokens' gradients) and
float32 ones (the routing weights' gradients)."""
from ..axes import EVERY
from ..family import Config, Family, Param
from ..kernels.sum_peer_rows import sum_peer_rows_kernel

# A program takes BM tokens x BN columns: 4 warps over 8 x 256 elements, 16 of
# each row a thread, in 16-byte vectors.
CONFIGS = (Config(8, 256, 16, 4, 1),)

FAMILY = Family(
    name="sum_peer_rows",
    kernel=sum_peer_rows_kernel,
    params=(
        Param("peers_ptr", "*i64", "operand"),
        Param("index_ptr", "*i64", "operand"),
        Param("out_ptr", "*T", "output", aligned=True),
        Param("T", "i32", "extent"),
        Param("H", "i32", "extent", aligned=True),
        Param("W", "i32", "extent"),
        Param("FIRST", "i32", "extent"),
    ),
    aligned=EVERY,
    dtypes=("float16", "bfloat16", "float32"),
    configs={(arch, flavour): CONFIGS for arch in (80, 90) for flavour in ("basic", "aligned")},
    tiles="cdiv(T, BM) * cdiv(H, BN)",
    rows="T",
)
