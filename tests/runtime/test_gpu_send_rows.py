"""Expert parallelism's transport kernel on one GPU: torch.ops.gg_runtime.send_rows
storing rows into W buffers of this GPU that stand in for the ranks' symmetric
buffers (the kernel sees only their addresses), against a scatter in torch:
rows not a multiple of a program's, widths not a multiple of 16 words (the
basic flavour), rows going nowhere and to several ranks, the rows taken
as one block, as many as there are rows, and between; the row sets that
travel with the rows (rows2, rows3) to their own buffers; each variant
forced (test_gpu_variants.py leaves them to this file)."""
import pytest
import torch

from gg_runtime import _C
from gg_runtime._native import OPS
from gg_runtime.testing import forced, last_variant
from conftest import device_arch, gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
# (rows, width in 2-byte words, destinations a row, ranks, rows a rank's buffer)
CASES = [(1, 16, 1, 1, 1), (37, 7168, 4, 4, 64), (1000, 200, 2, 3, 1500), (9, 24, 9, 9, 16)]


def send(values, buffers, ranks, dest, blocks, more=()):
    """send_rows into `buffers` (and each (values, buffers) of `more` into
    its own); what they should hold after it, in that order."""
    parts = ((values, buffers), *more)
    want = [[b.clone() for b in part_buffers] for _, part_buffers in parts]
    for r, c in torch.nonzero(dest >= 0).tolist():
        for (part_values, _), part_want in zip(parts, want):
            part_want[ranks[r, c]][dest[r, c]] = part_values[r]
    args = [a for part_values, part_buffers in parts for a in (part_values, peers_of(part_buffers))]
    OPS.send_rows.default(*args[:2], ranks, dest, blocks, *args[2:])
    torch.cuda.synchronize()
    return want[0] if not more else want


def peers_of(buffers):
    return torch.tensor([b.data_ptr() for b in buffers], device="cuda")


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


@pytest.mark.parametrize("widths", [(3,), (32, 7), (0, 2)])
def test_row_sets_travel_with_the_rows_to_their_own_buffers(widths):
    """rows2 (and rows3) of any width, the rows of 7168 words: each row set's
    row r lands where row r of the rows does, in that set's buffers."""
    rows, world, capacity = 37, 3, 128
    buffers, ranks, dest = buffers_and_routes(rows, 7168, 2, world, capacity)
    more = [(torch.randn(rows, width, device="cuda").bfloat16(),
             [torch.randn(capacity, width, device="cuda").bfloat16() for _ in range(world)])
            for width in widths]
    values = torch.randn(rows, 7168, device="cuda").bfloat16()
    want = send(values, buffers, ranks, dest, 1, more)
    for (_, part_buffers), part_want in zip(((values, buffers), *more), want):
        assert all(torch.equal(got, expected) for got, expected in zip(part_buffers, part_want))


@pytest.mark.parametrize("key", [v["key"] for v in _C.variants()
                                 if v["arch"] == device_arch() and v["family"] == "send_rows"])
def test_each_variant_lands_rows_where_dest_says(key):
    buffers, ranks, dest = buffers_and_routes(100, 7168, 3, 4, 300)  # 7168: every flavour's
    values = torch.randn(100, 7168, device="cuda").bfloat16()
    meta_buffers = [torch.randn(300, 5, device="cuda").bfloat16() for _ in range(4)]
    meta = torch.randn(100, 5, device="cuda").bfloat16()
    with forced(key):
        want, want_meta = send(values, buffers, ranks, dest, 4, [(meta, meta_buffers)])
        assert last_variant() == key
    assert all(torch.equal(got, expected) for got, expected in zip(buffers, want))
    assert all(torch.equal(got, expected) for got, expected in zip(meta_buffers, want_meta))


@pytest.mark.parametrize("blocks", [-1, 0, 2, 38])
def test_blocks_that_do_not_divide_the_rows_are_refused(blocks):
    buffers, ranks, dest = buffers_and_routes(37, 16, 1, 2, 64)
    peers = torch.tensor([b.data_ptr() for b in buffers], device="cuda")
    with pytest.raises(ValueError, match="blocks"):
        OPS.send_rows.default(torch.zeros(37, 16, device="cuda").bfloat16(), peers, ranks, dest,
                              blocks)

