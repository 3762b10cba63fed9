"""Expert parallelism's transport kernel on one GPU: torch.ops.gg_runtime.send_rows
storing rows into W buffers of this GPU that stand in for the ranks' symmetric
buffers (the kernel sees only their addresses), against a scatter in torch:
rows not a multiple of a program's, widths not a multiple of 16 words (the
basic flavour), rows going nowhere and to several ranks, the rows taken
as one block, as many as there are rows, and between; each variant forced
(test_gpu_variants.py leaves them to this file)."""
import pytest
import torch

from gg_runtime import _C
from gg_runtime._native import OPS
from gg_runtime.testing import forced, last_variant
from conftest import device_arch, gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
# (rows, width in 2-byte words, destinations a row, ranks, rows a rank's buffer)
CASES = [(1, 16, 1, 1, 1), (37, 7168, 4, 4, 64), (1000, 200, 2, 3, 1500), (9, 24, 9, 9, 16)]


def send(values, buffers, ranks, dest, blocks):
    """send_rows into `buffers`; what they should hold after it."""
    want = [b.clone() for b in buffers]
    for r, c in torch.nonzero(dest >= 0).tolist():
        want[ranks[r, c]][dest[r, c]] = values[r]
    peers = torch.tensor([b.data_ptr() for b in buffers], device="cuda")
    OPS.send_rows.default(values, peers, ranks, dest, blocks)
    torch.cuda.synchronize()
    return want


def buffers_and_routes(rows, width, destinations, world, capacity):
    buffers = [torch.randn(capacity, width, device="cuda").bfloat16() for _ in range(world)]
    ranks = torch.randint(0, world, (rows, destinations), dtype=torch.int32, device="cuda")
    # Distinct rows of each buffer, so that no two stores race; a third go nowhere.
    dest = torch.randperm(capacity, device="cuda")[:rows * destinations].view(rows, destinations)
    dest = torch.where(torch.rand(rows, destinations, device="cuda") < 0.3, -1, dest)
    return buffers, ranks, dest


@pytest.mark.parametrize("rows, width, destinations, world, capacity", CASES)
def test_rows_land_where_dest_says_in_any_blocks(rows, width, destinations, world, capacity):
    capacity = max(capacity, rows * destinations)
    for blocks in sorted({b for b in (1, 3, 4, 37, rows) if rows % b == 0}):
        buffers, ranks, dest = buffers_and_routes(rows, width, destinations, world, capacity)
        values = torch.randn(rows, width, device="cuda").bfloat16()
        want = send(values, buffers, ranks, dest, blocks)
        for rank, (got, expected) in enumerate(zip(buffers, want)):
            assert torch.equal(got, expected), (blocks, rank)


@pytest.mark.parametrize("key", [v["key"] for v in _C.variants()
                                 if v["arch"] == device_arch() and v["family"] == "send_rows"])
def test_each_variant_lands_rows_where_dest_says(key):
    buffers, ranks, dest = buffers_and_routes(100, 7168, 3, 4, 300)  # 7168: every flavour's
    values = torch.randn(100, 7168, device="cuda").bfloat16()
    with forced(key):
        want = send(values, buffers, ranks, dest, 4)
        assert last_variant() == key
    assert all(torch.equal(got, expected) for got, expected in zip(buffers, want))


@pytest.mark.parametrize("blocks", [-1, 0, 2, 38])
def test_blocks_that_do_not_divide_the_rows_are_refused(blocks):
    buffers, ranks, dest = buffers_and_routes(37, 16, 1, 2, 64)
    peers = torch.tensor([b.data_ptr() for b in buffers], device="cuda")
    with pytest.raises(ValueError, match="blocks"):
        OPS.send_rows.default(torch.zeros(37, 16, device="cuda").bfloat16(), peers, ranks, dest,
                              blocks)
