"""Expert parallelism's transport kernels on one GPU, W buffers of this GPU
standing in for the ranks' symmetric buffers (the kernels see only their
addresses).  torch.ops.gg_runtime.send_rows storing rows into them, against
a scatter in torch: rows not a multiple of a program's, widths not a
multiple of 16 words (the basic flavour), rows going nowhere and to several
ranks, the rows taken as one block, as many as there are rows, and between;
the row sets that travel with the rows (rows2, rows3) to their own buffers.
torch.ops.gg_runtime.send_fp8_rows quantizing 16-bit tokens on the way,
bit for bit against quantize_fp8 (per 128 columns) and a scatter in torch,
widths not a multiple of 128; its bad arguments.
torch.ops.gg_runtime.sum_peer_rows reading each token's rows from them,
against a float32 sum rank by rank in torch.  Each variant forced
(test_gpu_variants.py leaves them to this file)."""
import pytest
import torch

import gg_runtime
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


FP8_CASES = [(0, 16, 1, 1), (1, 16, 1, 1), (37, 7168, 4, 4), (1000, 208, 2, 3), (9, 2064, 9, 9)]
fp8_kernels = pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins")


def send_fp8(x, world, capacity, destinations, meta_words=16):
    """send_fp8_rows of x into `world` fresh buffers of each kind (values,
    scales, metadata); those buffers, and what they should hold."""
    H = x.shape[1]
    _, ranks, dest = buffers_and_routes(x.shape[0], 1, destinations, world, capacity)
    values = [torch.randint(0, 256, (capacity, H), dtype=torch.uint8, device="cuda")
              for _ in range(world)]
    scales = [torch.randn(capacity, -(-H // 128), device="cuda") for _ in range(world)]
    metas = [torch.randn(capacity, meta_words, device="cuda").bfloat16() for _ in range(world)]
    meta = torch.randn(x.shape[0], meta_words, device="cuda").bfloat16()
    q, scale, _ = gg_runtime.quantize_fp8(x, "1x128")
    parts = ((q.view(torch.uint8), values), (scale, scales), (meta, metas))
    want = [[b.clone() for b in buffers] for _, buffers in parts]
    for r, c in torch.nonzero(dest >= 0).tolist():
        for (rows, _), part_want in zip(parts, want):
            part_want[ranks[r, c]][dest[r, c]] = rows[r]
    OPS.send_fp8_rows.default(x, peers_of(values), peers_of(scales), ranks, dest, meta,
                              peers_of(metas))
    torch.cuda.synchronize()
    return [buffers for _, buffers in parts], want


@fp8_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, width, destinations, world", FP8_CASES)
def test_fp8_rows_land_quantized_as_quantize_fp8s(rows, width, destinations, world, dtype):
    """The values, scales and metadata where dest says, bit for bit (no rows:
    nothing stored); the tokens' magnitudes spread over 2**-20 .. 2**20
    (float16: 2**-8 .. 2**8), a row of zeros."""
    reach = 20 if dtype == torch.bfloat16 else 8  # float16's range
    x = torch.randn(rows, width, device="cuda") * 2.0 ** torch.randint(
        -reach, reach + 1, (rows, 1), device="cuda")
    x[rows // 2:rows // 2 + 1] = 0
    got, want = send_fp8(x.to(dtype), world, max(64, rows * destinations), destinations)
    for part_got, part_want in zip(got, want):
        assert all(torch.equal(g, w) for g, w in zip(part_got, part_want))


@fp8_kernels
@pytest.mark.parametrize("variant", [v for v in _C.variants()
                                     if v["arch"] == device_arch()
                                     and v["family"] == "send_fp8_rows"], ids=lambda v: v["key"])
def test_each_fp8_variant_lands_rows_where_dest_says(variant):
    key = variant["key"]
    x = torch.randn(100, 7168, device="cuda").to(getattr(torch, variant["dtype"]))
    with forced(key):
        got, want = send_fp8(x, 4, 300, 3, meta_words=5)
        assert last_variant() == key
    for part_got, part_want in zip(got, want):
        assert all(torch.equal(g, w) for g, w in zip(part_got, part_want))


@pytest.mark.parametrize("change, error, match", [
    (dict(width=24), ValueError, "multiple of 16"),
    (dict(dtype=torch.float32), TypeError, "x"),
    (dict(meta_rows=36), ValueError, "meta"),
    (dict(table=2), ValueError, "scale_peers"),
])
def test_fp8_sends_refuse_bad_arguments(change, error, match):
    width, dtype = change.get("width", 32), change.get("dtype", torch.bfloat16)
    _, ranks, dest = buffers_and_routes(37, 1, 1, 3, 64)
    tables = [torch.zeros(n, dtype=torch.int64, device="cuda")
              for n in (3, change.get("table", 3), 3)]
    x = torch.randn(37, width, device="cuda").to(dtype)
    meta = torch.zeros(change.get("meta_rows", 37), 4, device="cuda").bfloat16()
    with pytest.raises(error, match=match):
        call(OPS.send_fp8_rows.default, x, tables[0], tables[1], ranks, dest, meta, tables[2])


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
