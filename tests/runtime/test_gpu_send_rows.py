"""Expert parallelism's transport kernels on one GPU, W buffers of this GPU
standing in for the ranks' symmetric buffers (the kernels see only their
addresses).  torch.ops.gg_runtime.send_rows storing rows into them, against
a scatter in torch: rows not a multiple of a program's, widths not a
multiple of 16 words (the basic flavour), rows going nowhere and to several
ranks, the rows taken as one block, as many as there are rows, and between;
the row sets that travel with the rows (rows2, rows3) to their own buffers.
torch.ops.gg_runtime.sum_peer_rows reading each token's rows from them,
against a float32 sum rank by rank in torch.  Each variant forced
(test_gpu_variants.py leaves them to this file)."""
import pytest
import torch

from gg_runtime import _C
from gg_runtime._native import OPS, call
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



def peer_sums(regions, index, first_row):
    """sum_peer_rows of regions (rank r's at peers[r]); what it should give."""
    got = OPS.sum_peer_rows.default(regions[0], peers_of(regions), index, first_row)
    want = torch.zeros(index.shape[0], regions[0].shape[1], device="cuda")
    for r, region in enumerate(regions):
        rows = region[first_row:first_row + index.shape[0]].float()
        want += torch.where(index[:, r:r + 1] >= 0, rows, 0.0)
    return got, want.to(regions[0].dtype)


def regions_and_index(tokens, width, world, dtype):
    """Each rank's region (a block of tokens + 3 rows a rank), NaN where no
    row is read; which ranks made each token's row (about a third none)."""
    capacity = tokens + 3
    regions = [torch.randn(world * capacity, width, device="cuda").to(dtype) for _ in range(world)]
    index = torch.where(torch.rand(tokens, world, device="cuda") < 0.35, -1,
                        torch.arange(world, device="cuda") * capacity)
    first_row = (world - 1) * capacity
    for r, region in enumerate(regions):
        region[first_row:first_row + tokens][index[:, r] < 0] = float("nan")
    return regions, index, first_row


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens, width, world", [(1, 16, 1), (37, 7168, 4), (1000, 200, 3),
                                                  (9, 8, 9), (5, 3, 2), (0, 16, 2)])
def test_peer_rows_summed_rank_by_rank(dtype, tokens, width, world):
    """Every token's rows from the ranks that made them, summed in float32
    in rank order: bit for bit torch's sum in that order; a rank that did not
    make a row is not read (its NaN does not show)."""
    got, want = peer_sums(*regions_and_index(tokens, width, world, dtype))
    assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("variant", [v for v in _C.variants() if v["arch"] == device_arch()
                                     and v["family"] == "sum_peer_rows"], ids=lambda v: v["key"])
def test_each_sum_variant_sums_the_peers_rows(variant):
    regions, index, first_row = regions_and_index(100, 7168, 4, getattr(torch, variant["dtype"]))
    with forced(variant["key"]):  # 7168 columns: every flavour's
        got, want = peer_sums(regions, index, first_row)
        assert last_variant() == variant["key"]
    assert torch.equal(got, want)


def test_sum_arguments_that_do_not_fit_are_refused():
    regions, index, first_row = regions_and_index(10, 16, 2, torch.bfloat16)
    peers = peers_of(regions)
    with pytest.raises(ValueError, match="first_row"):
        call(OPS.sum_peer_rows.default, regions[0], peers, index, first_row + 4)
    with pytest.raises(ValueError, match="peers must have shape"):
        call(OPS.sum_peer_rows.default, regions[0], peers[:1], index, first_row)
    with pytest.raises(ValueError, match="region must be contiguous"):
        call(OPS.sum_peer_rows.default, regions[0][:, :8], peers, index, first_row)
