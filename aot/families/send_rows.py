"""send_rows: expert parallelism's transport (aot/kernels/send_rows.py):
rows stored into peers' symmetric buffers through a table of their
addresses.  Memory-bound, plain loads and stores: every arch, `aligned`
(16-byte vectors) where the rows and H allow it, else `basic`.  One dtype:
the operator copies any 2-byte rows as bfloat16 words."""
from ..axes import EVERY
from ..family import Config, Family, Param
from ..kernels.send_rows import send_rows_kernel

# A program takes BM rows x BN columns: 4 warps over 8 x 256 words, 16 a
# thread, in 16-byte vectors.  Past a decode step's DECODE_ROWS rows, at
# most 64 registers a thread: twice the programs an SM holds, more stores in
# flight where the transfer has few SMs
# (docs/notes/2026-11-30-send-rows-on-fewer-sms.md).
DECODE_ROWS = 512
CONFIGS = (Config(8, 256, 16, 4, 1, max_rows=DECODE_ROWS),
           Config(8, 256, 16, 4, 1, max_registers=64))

FAMILY = Family(
    name="send_rows",
    kernel=send_rows_kernel,
    params=(
        Param("rows_ptr", "*T", "operand", aligned=True),
        Param("peers_ptr", "*i64", "operand"),
        Param("ranks_ptr", "*i32", "operand"),
        Param("dest_ptr", "*i64", "operand"),
        Param("R", "i32", "extent"),
        Param("H", "i32", "extent", aligned=True),
        Param("C", "i32", "extent"),
        Param("BLOCKS", "i32", "extent"),
        # Row sets that go where rows go (H2 or H3 0: none); their widths are
        # not part of the aligned flavour's rule: scalar stores, a few words.
        Param("rows2_ptr", "*T", "operand"),
        Param("peers2_ptr", "*i64", "operand"),
        Param("H2", "i32", "extent"),
        Param("rows3_ptr", "*T", "operand"),
        Param("peers3_ptr", "*i64", "operand"),
        Param("H3", "i32", "extent"),
    ),
    aligned=EVERY,
    dtypes=("bfloat16",),
    configs={(arch, flavour): CONFIGS for arch in (80, 90) for flavour in ("basic", "aligned")},
    tiles="BLOCKS * cdiv(R // max(BLOCKS, 1), BM) * (cdiv(H, BN) + cdiv(H2, BN) + cdiv(H3, BN))",
    rows="R",
)
