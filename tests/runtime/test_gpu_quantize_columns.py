"""torch.ops.gg_runtime.quantize_fp8_columns on the GPU against
gg_runtime.testing.quantize_columns_ref (quantize_ref's float32 torch on the
GPU, group by group), exactly: both granularities, every dtype, every variant
forced by key; groups of 0, 1, 127, 128, 129 rows, one group and over a
thousand, rows past the last group, offsets out of order or range; C a
multiple of no column tile; strided, unaligned and transposed inputs;
magnitudes from subnormal to huge; empty inputs; rows gathered through an
index (bit for bit the gathered copy's).  Outputs are poisoned, so a
block's padding that is not written (it must be zero) shows."""
import pytest
import torch

from gg_runtime import _C
from gg_runtime._native import call
from gg_runtime.testing import (FP8_BLOCK, column_blocks, forced, last_variant,
                                offsets_from_counts, quantize_columns_ref, randn, tf32_allowed)
from gg_runtime.formats import ROW_BLOCKS, ROWWISE

from conftest import device_arch

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]
OP = torch.ops.gg_runtime.quantize_fp8_columns.default
FP8 = torch.float8_e4m3fn
GRANULARITIES = (ROWWISE, ROW_BLOCKS)  # quantize_fp8_columns'
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
VARIANTS = [v for v in _C.variants()
            if v["family"] == "quantize_fp8_columns" and v["arch"] == device_arch()]
# Group sizes the layout treats differently: empty, one row, a block but one,
# one block, a block and one row.
EDGE_COUNTS = [0, 1, 127, 128, 129, 0, 300]


def floor_scale() -> torch.Tensor:
    """The scale of an all-zero column, 1e-12 / 448 in float32."""
    return torch.tensor(1e-12, device="cuda") / 448


def written(offs, rows: int, granularity: str) -> tuple:
    """Indices of (q's columns, scale's rows) the operator writes: every
    group's blocks, the last one with its zero padding; for 1x128 their
    scales, for rowwise every group's."""
    blocks = torch.zeros(rows // FP8_BLOCK + len(offs), dtype=torch.bool)
    for start, end, first in column_blocks(offs, rows):
        blocks[first:first + -(-(end - start) // FP8_BLOCK)] = True
    q_columns = blocks.repeat_interleave(FP8_BLOCK).nonzero().flatten().cuda()
    scales = torch.arange(len(offs)) if granularity == "rowwise" else blocks.nonzero().flatten()
    return q_columns, scales.cuda()


def check(x, offs, granularity) -> str:
    """quantize_fp8_columns(x, offs) is the reference exactly where it writes
    (quantize_fp8's rule: test_gpu_quantize.py says why exactly; q compared
    as values, as there: a -0 input gives +0).  Returns the variant that ran."""
    q, scale = call(OP, x, offs, granularity)
    key = last_variant()
    ref_q, ref_scale = quantize_columns_ref(x, offs, granularity)
    assert q.dtype == FP8 and q.shape == ref_q.shape and q.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == ref_scale.shape
    q_columns, scales = written(offs, x.shape[0], granularity)
    assert torch.equal(scale[scales], ref_scale[scales]), key
    # NaN (poison: a column not written) never compares equal.
    assert torch.equal(q[:, q_columns].float(), ref_q[:, q_columns].float()), key
    return key


@pytest.mark.skipif(not VARIANTS, reason="needs quantize_fp8_columns kernels for this GPU")
@pytest.mark.parametrize("variant", VARIANTS, ids=[v["key"] for v in VARIANTS])
def test_variant(variant):
    """Each variant, forced, on every edge group size and C a multiple of no
    column tile (of 16 for `aligned`)."""
    cols = 272 if variant["flavour"] == "aligned" else 263
    x = randn(sum(EDGE_COUNTS) + 45, cols, dtype=getattr(torch, variant["dtype"]))
    with forced(variant=variant["key"]):
        assert check(x, offsets_from_counts(EDGE_COUNTS), variant["axes"]["granularity"]) == \
            variant["key"]


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [208, 77, 1])
@pytest.mark.parametrize("counts, rows", [
    (EDGE_COUNTS, sum(EDGE_COUNTS)),  # T = 685, a multiple of no block
    (EDGE_COUNTS, sum(EDGE_COUNTS) + 45),  # rows past the last group
    ([1000], 1000), ([700], 1000), ([128], 128), ([0], 200), ([1], 1),
])
def test_groups(granularity, dtype, cols, counts, rows):
    check(randn(rows, cols, dtype=dtype), offsets_from_counts(counts), granularity)


def many_groups(groups: int, seed: int) -> list:
    """Group sizes 0 to 200, some empty, some of one row."""
    counts = torch.randint(0, 200, (groups,), generator=torch.Generator().manual_seed(seed))
    counts[::17] = 0
    counts[5::31] = 1
    return counts.tolist()


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("counts", [
    many_groups(1100, 0),  # many groups per program, several 64-group chunks
    [0] * 700 + [300] + [0] * 400,  # one busy group among empty ones
    [2, 0, 1] * 400,  # tiny groups: many share a block of x's rows
])
def test_many_groups(granularity, counts):
    check(randn(sum(counts) + 10, 32, dtype=torch.bfloat16), offsets_from_counts(counts),
          granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_many_blocks_per_group(granularity):
    """Groups of thousands of rows and C of many column tiles: more tiles than
    programs, and rowwise's two passes over a long group."""
    counts = [9000, 130, 11000]
    check(randn(sum(counts) + 100, 720, dtype=torch.bfloat16), offsets_from_counts(counts),
          granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_offsets_clipped_and_out_of_order(granularity):
    """Offsets read as ragged.py reads them: clipped to [0, T], then a running
    maximum (a decreasing offset ends an empty group)."""
    offs = torch.tensor([-5, 40, 30, 200, 500, 260], dtype=torch.int32, device="cuda")
    check(randn(300, 48, dtype=torch.bfloat16), offs, granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_strided_unaligned_and_transposed(granularity):
    offs = offsets_from_counts([100, 0, 150, 60])
    wide = randn(330, 1024 + 48, dtype=torch.bfloat16)
    assert ".aligned." in check(wide[:, :1024], offs, granularity)  # row stride 1072 > C
    assert ".basic." in check(wide[:, 1:1025], offs, granularity)  # base 2 bytes past alignment
    assert ".basic." in check(randn(330, 1030, dtype=torch.bfloat16)[:, :1024], offs,
                              granularity)  # row stride not a multiple of 16
    check(randn(1024, 330, dtype=torch.bfloat16).t(), offs, granularity)  # copied to row-major
    one_row = randn(1, 2048 + 16, dtype=torch.bfloat16)[:, 16:]
    check(one_row, offsets_from_counts([0, 1]), granularity)


def test_float32_ignores_the_tf32_setting():
    with tf32_allowed(True):
        key = check(randn(300, 272, dtype=torch.float32), offsets_from_counts([100, 200]),
                    "1x128")
    assert ".float32-float8_e4m3fn." in key


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype, low, high", [
    (torch.float16, -7, 4), (torch.bfloat16, -40, 37), (torch.float32, -44, 37)])
def test_magnitudes(granularity, dtype, low, high):
    """Columns from subnormal to near the dtype's largest: the quotient is
    correctly rounded (or too small for e4m3) at every magnitude."""
    magnitudes = torch.logspace(low, high, 256, device="cuda")[None, :]
    x = (torch.randn(400, 256, device="cuda") * magnitudes).to(dtype)
    check(x, offsets_from_counts([129, 0, 200, 71]), granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_zero_columns_and_blocks(granularity):
    x = randn(400, 200, dtype=torch.bfloat16)
    x[:, 5] = 0
    x[128:256, 64:192] = 0
    offs = offsets_from_counts([128, 128, 144])
    check(x, offs, granularity)
    q, scale = call(OP, torch.zeros(400, 200, dtype=torch.bfloat16, device="cuda"), offs,
                    granularity)
    q_columns, scales = written(offs, 400, granularity)
    assert q[:, q_columns].float().eq(0).all() and scale[scales].eq(floor_scale()).all()


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_padding_is_zero(granularity):
    """A group's last block is zero past the group's rows, whatever x holds there."""
    x = randn(300, 64, dtype=torch.bfloat16) + 10
    offs = offsets_from_counts([3, 130, 100])
    q, _ = call(OP, x, offs, granularity)
    for start, end, first in column_blocks(offs, 300):
        at = first * FP8_BLOCK + end - start
        assert q[:, at:at + -(end - start) % FP8_BLOCK].float().eq(0).all()


def test_empty_groups_get_the_floor_scale():
    """No rows: every group's rowwise scale is the all-zero one; 1x128 has no
    block to write."""
    offs = offsets_from_counts([0, 0, 0])
    q, scale = call(OP, randn(0, 48, dtype=torch.bfloat16), offs, "rowwise")
    assert q.shape == (48, 3 * FP8_BLOCK) and scale.shape == (3, 48)
    assert scale.eq(floor_scale()).all()
    q, scale = call(OP, randn(0, 48, dtype=torch.bfloat16), offs, "1x128")
    assert q.shape == (48, 3 * FP8_BLOCK) and scale.shape == (3, 48)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_nothing_to_write(granularity):
    """No group, or no column: outputs of the layout's shapes, no launch."""
    x = randn(300, 48, dtype=torch.bfloat16)
    q, scale = call(OP, x, offsets_from_counts([]), granularity)
    assert q.shape == (48, 2 * FP8_BLOCK) and scale.shape[0] == (0 if granularity == "rowwise"
                                                                 else 2)
    q, scale = call(OP, x[:, :0], offsets_from_counts([300]), granularity)
    assert q.shape == (0, 3 * FP8_BLOCK) and scale.shape[1] == 0


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v["key"])
def test_gathered_rows_are_the_gathered_copy(variant):
    """Rows read through rows // k (the routing's order over token slots)
    give exactly what quantizing the gathered copy gives, where written."""
    granularity = variant["axes"]["granularity"]
    dtype = getattr(torch, variant["dtype"])
    tokens, k, counts = 150, 3, [0, 1, 127, 128, 129, 0, 65]
    x = randn(tokens, 208, dtype=dtype)
    rows = torch.randperm(tokens * k, device="cuda")[:sum(counts)]
    offs = offsets_from_counts(counts)
    with forced(variant["key"]):
        q, scale = call(OP, x, offs, granularity, rows, k)
    want_q, want_scale = call(OP, x.index_select(0, rows // k), offs, granularity)
    q_columns, scales = written(offs, rows.shape[0], granularity)
    assert torch.equal(scale[scales], want_scale[scales])
    assert torch.equal(q[:, q_columns].float(), want_q[:, q_columns].float())
