"""send_fp8_rows: expert parallelism's fp8 dispatch (aot/kernels/send_rows.py):
16-bit tokens quantized per 128 columns as quantize_fp8 quantizes them, and
stored with their scales and their metadata into the peers' symmetric
buffers through tables of their addresses, in one launch.  Memory-bound,
plain loads and stores; sm90 only, as the fp8 experts that read the rows;
`aligned` (16-byte vectors) where the tokens and H allow it, else
`basic`."""
from ..axes import EVERY
from ..family import Config, Family, Param
from ..kernels.send_rows import send_fp8_rows_kernel

# A program takes BM rows x 128 columns (one scale's): 4 warps, 16 elements a
# thread, in 16-byte vectors of the 16-bit tokens.
CONFIGS = (Config(16, 128, 16, 4, 1),)

FAMILY = Family(
    name="send_fp8_rows",
    kernel=send_fp8_rows_kernel,
    params=(
        Param("x_ptr", "*T", "operand", aligned=True),
        Param("peers_ptr", "*i64", "operand"),
        Param("scale_peers_ptr", "*i64", "operand"),
        Param("ranks_ptr", "*i32", "operand"),
        Param("dest_ptr", "*i64", "operand"),
        Param("R", "i32", "extent"),
        Param("H", "i32", "extent", aligned=True),
        Param("C", "i32", "extent"),
        # The tokens' metadata, 16-bit words that go where the tokens go.
        Param("meta_ptr", "*bf16", "operand"),
        Param("meta_peers_ptr", "*i64", "operand"),
        Param("HM", "i32", "extent"),
    ),
    aligned=EVERY,
    dtypes=("float16", "bfloat16"),
    archs=(90,),
    configs={(90, flavour): CONFIGS for flavour in ("basic", "aligned")},
    tiles="cdiv(R, BM) * (cdiv(H, BN) + cdiv(HM, BN))",
    rows="R",
)
