"""quantize_fp8 on the GPU against gg_runtime.testing.quantize_ref (float32
torch on the GPU), exactly: every granularity and dtype, every variant forced by key,
shapes that are multiples of no tile, zero rows and blocks, magnitudes from
subnormal to huge, strided, unaligned and transposed inputs (column-major:
read in place), 3-D weights and their transposed views, empty inputs;
quantize_fp8_both_orientations (128x128, and x.mT's from the same read)
likewise; outputs poisoned."""
import pytest
import torch

from gg_runtime import _C
from gg_runtime import quantize_fp8
from gg_runtime.testing import forced, last_variant, operand, quantize_ref, randn, tf32_allowed
from gg_runtime.formats import GRANULARITIES

from conftest import device_arch

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]
FP8 = torch.float8_e4m3fn
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
VARIANTS = [v for v in _C.variants()
            if v["family"] == "quantize_fp8" and v["arch"] == device_arch()]
BOTH = torch.ops.gg_runtime.quantize_fp8_both_orientations.default


def floor_scale() -> torch.Tensor:
    """The scale of an all-zero block, 1e-12 / 448 in float32."""
    return torch.tensor(1e-12, device="cuda") / 448


def column_major(x):
    """x's values stored column-major: a transposed view of a row-major copy
    of its transpose."""
    return x.transpose(-2, -1).contiguous().transpose(-2, -1)


def check(x, granularity) -> str:
    """quantize_fp8(x) is the reference exactly: the kernel computes amax / 448
    as torch does on CUDA (times float32 1 / 448) and rounds x / scale as
    float32 division does.  Returns the variant that ran."""
    q, scale, format = quantize_fp8(x, granularity)
    key = last_variant()
    ref_q, ref_scale = quantize_ref(x, granularity)
    assert format == granularity
    assert q.dtype == FP8 and q.shape == x.shape and q.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == ref_scale.shape
    assert torch.equal(scale, ref_scale), key
    assert torch.equal(q.float(), ref_q.float()), key  # NaN (poison) never compares equal
    return key


def check_both(x) -> str:
    """quantize_fp8_both_orientations(x) is the 128x128 reference of x and of
    x.mT, exactly, each contiguous.  Returns the variant that ran."""
    q, scale, q_t, scale_t = BOTH(x)
    key = last_variant()
    assert key.endswith("_both_orientations"), key
    for got_q, got_scale, of in ((q, scale, x), (q_t, scale_t, x.mT)):
        ref_q, ref_scale = quantize_ref(of, "128x128")
        assert got_q.dtype == FP8 and got_q.shape == of.shape and got_q.is_contiguous()
        assert torch.equal(got_scale, ref_scale), key
        assert torch.equal(got_q.float(), ref_q.float()), key
    return key


def run_variant(v, dtype, out_dtype):
    """One variant (forced by the caller) on 3-D input stored as its x_major
    says, whose sizes are multiples of no tile (for `aligned`, the contiguous
    ones multiples of 16: C, and a column-major x's rows), rowwise spanning
    several column steps, 128x128 blocks restarting at each group.  Returns
    [(q, reference q)]; the scales are checked here.  test_gpu_variants.py's
    runner for this family."""
    aligned = v["flavour"] == "aligned"
    row_major = v["axes"]["x_major"] == "row"
    rows = 150 if row_major or not aligned else 160
    cols = 4368 if aligned else 4363
    x = operand((3, rows, cols), row_major=row_major, strided=False, dtype=dtype)
    granularity = v["axes"]["granularity"]
    if v["key"].endswith("_both_orientations"):
        q, scale, q_t, scale_t = BOTH(x)
        pairs = ((q, scale, x), (q_t, scale_t, x.mT))
    else:
        quantized = quantize_fp8(x, granularity)
        pairs = ((quantized.values, quantized.scales, x),)
    checked = []
    for q, scale, of in pairs:
        ref_q, ref_scale = quantize_ref(of, granularity)
        assert torch.equal(scale, ref_scale)
        assert q.dtype == out_dtype
        checked.append((q, ref_q.float()))
    return checked


@pytest.mark.skipif(not VARIANTS, reason="needs quantize_fp8 kernels for this GPU")
@pytest.mark.parametrize("variant", VARIANTS, ids=[v["key"] for v in VARIANTS])
def test_variant(variant):
    with forced(variant=variant["key"]):
        checked = run_variant(variant, getattr(torch, variant["dtype"]), FP8)
        assert last_variant() == variant["key"]
    for q, ref in checked:
        assert torch.equal(q.float(), ref)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [
    (1, 1), (1, 128), (3, 77), (131, 259),  # basic: C not a multiple of 16
    (130, 512), (67, 1040), (5, 2064), (2, 8208),  # aligned: every config, 1 to 3 column steps
    (3, 4099),
])
def test_shapes(granularity, dtype, rows, cols):
    check(randn(rows, cols, dtype=dtype), granularity)


def test_float32_ignores_the_tf32_setting():
    """float32 input takes the float32 kernels even where torch allows TF32 matmuls."""
    with tf32_allowed(True):
        assert ".float32-float8_e4m3fn." in check(randn(70, 272, dtype=torch.float32), "1x128")


@pytest.mark.parametrize("cols, config", [(512, "8x512"), (1040, "8x512"), (1552, "2x2048"),
                                          (8208, "1x4096")])
def test_config_follows_row_length(cols, config):
    assert f".aligned.{config}x" in check(randn(40, cols, dtype=torch.bfloat16), "rowwise")


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_zero_rows_and_blocks(granularity):
    x = randn(300, 400, dtype=torch.bfloat16)
    x[5] = 0
    x[128:256, 128:256] = 0
    check(x, granularity)
    check(column_major(x), granularity)
    q, scale, _ = quantize_fp8(torch.zeros(130, 300, dtype=torch.bfloat16, device="cuda"),
                               granularity)
    assert q.float().eq(0).all() and scale.eq(floor_scale()).all()


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_stays_nan(granularity, dtype):
    """NaNs (one in a row, a whole row, one in a block of its own) stay NaN,
    and the rest as the reference (whose amax skips them)."""
    x = randn(300, 400, dtype=dtype)
    x[3, 17] = x[130:133, 200] = x[7] = float("nan")
    for of in (x, column_major(x)):
        q, scale, _ = quantize_fp8(of, granularity)
        ref_q, ref_scale = quantize_ref(of, granularity)
        assert torch.equal(scale, ref_scale)
        assert torch.equal(q.float().isnan(), of.isnan())
        assert torch.equal(q.float().nan_to_num(), ref_q.float().nan_to_num())


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype, low, high", [
    (torch.float16, -7, 4), (torch.bfloat16, -40, 37), (torch.float32, -44, 37)])
def test_magnitudes(granularity, dtype, low, high):
    """Rows from subnormal to near the dtype's largest: the quotient is
    correctly rounded (or too small for e4m3) at every magnitude."""
    magnitudes = torch.logspace(low, high, 256, device="cuda")[:, None]
    x = (torch.randn(256, 384, device="cuda") * magnitudes).to(dtype)
    check(x, granularity)
    check(column_major(x), granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_strided_unaligned_and_transposed(granularity):
    wide = randn(130, 1024 + 48, dtype=torch.bfloat16)
    assert ".aligned." in check(wide[:, :1024], granularity)  # ldx 1072 > C
    assert ".basic." in check(wide[:, 1:1025], granularity)  # base 2 bytes past alignment
    assert ".basic." in check(randn(130, 1030, dtype=torch.bfloat16)[:, :1024], granularity)
    assert "-column.aligned." in check(randn(1024, 128, dtype=torch.bfloat16).t(), granularity)
    assert "-column.basic." in check(randn(1024, 130, dtype=torch.bfloat16).t(), granularity)
    check(randn(1, 2048 + 16, dtype=torch.bfloat16)[:, 16:], granularity)  # one row
    # Neither of the last two dimensions contiguous: copied to row-major.
    assert "-row." in check(randn(260, 2048, dtype=torch.bfloat16)[::2, ::2], granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_weights(granularity, dtype):
    check(randn(3, 200, 320, dtype=dtype), granularity)  # N % 128 != 0: blocks restart per group
    check(randn(2, 256, 384, dtype=dtype), granularity)
    check(randn(3, 256, 336, dtype=dtype)[:, :200], granularity)  # groups not stacked: copied
    check(randn(4, 1, 272, dtype=dtype), granularity)


# (rows, cols) of column-major x and the flavour it takes: basic, rows and C
# multiples of no tile (a few rows: less than one rowwise tile); aligned, both
# multiples of 16 (and so x's strides), of no tile either.
TRANSPOSED_SHAPES = [(200, 333, "basic"), (208, 336, "aligned"), (3, 130, "basic")]


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols, flavour", TRANSPOSED_SHAPES)
def test_transposed(granularity, dtype, rows, cols, flavour):
    """x.t() of a row-major [C, R]: read in place, no copy."""
    x = randn(cols, rows, dtype=dtype).t()
    assert f"-column.{flavour}." in check(x, granularity)
    wide = randn(cols, rows + 16, dtype=dtype)[:, :rows].t()  # ldx R + 16 > R
    assert f"-column.{flavour}." in check(wide, granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols, flavour", TRANSPOSED_SHAPES)
@pytest.mark.parametrize("groups", [1, 5])
def test_transposed_weights(granularity, dtype, rows, cols, flavour, groups):
    """w.transpose(1, 2) of a row-major [G, C, R] (fp8_grouped_mm's weights),
    and of a [G, C, R] slice whose groups lie further apart than C * R: read
    in place, group by group (128x128 blocks restarting at each)."""
    w = randn(groups, cols, rows, dtype=dtype)
    assert f"-column.{flavour}." in check(w.transpose(1, 2), granularity)
    apart = randn(groups, cols + 16, rows, dtype=dtype)[:, :cols]
    assert f"-column.{flavour}." in check(apart.transpose(1, 2), granularity)


@pytest.mark.parametrize("shape, granularity, scale_shape", [
    ((0, 300), "rowwise", (0,)),
    ((5, 0), "rowwise", (5,)),
    ((5, 0), "128x128", (1, 0)),
    ((3, 0, 8), "1x128", (3, 0, 1)),
    ((3, 4, 0), "rowwise", (3, 4)),
])
def test_empty(shape, granularity, scale_shape):
    q, scale, _ = quantize_fp8(randn(*shape, dtype=torch.bfloat16), granularity)
    assert q.shape == shape and scale.shape == scale_shape
    assert scale.eq(floor_scale()).all()  # rows without elements: the all-zero scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [
    (1, 1), (3, 77), (131, 259), (130, 512), (300, 400),  # 2-D, basic and aligned
    (3, 200, 320), (2, 256, 384), (4, 1, 272), (5, 208, 336), (2, 131, 259),
])
def test_both_orientations(dtype, shape):
    """Row-major x (read as x.mT, column-major), blocks restarting at every
    group (N % 128 != 0)."""
    assert "-column." in check_both(randn(*shape, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols, flavour", TRANSPOSED_SHAPES)
@pytest.mark.parametrize("groups", [1, 5])
def test_both_orientations_of_transposed_weights(dtype, rows, cols, flavour, groups):
    """w.transpose(1, 2) read in place, groups stacked or further apart."""
    w = randn(groups, cols, rows, dtype=dtype)
    assert f"-column.{flavour}." in check_both(w.transpose(1, 2))
    apart = randn(groups, cols + 16, rows, dtype=dtype)[:, :cols]
    assert f"-column.{flavour}." in check_both(apart.transpose(1, 2))


def test_both_orientations_of_zero_blocks_and_magnitudes():
    x = (torch.randn(3, 256, 384, device="cuda")
         * torch.logspace(-40, 37, 256, device="cuda")[:, None]).to(torch.bfloat16)
    x[1, 128:256, 128:256] = 0
    check_both(x)
    check_both(column_major(x))
    check_both(randn(300, 2048, dtype=torch.bfloat16)[:, :1024])  # strided rows
    check_both(randn(260, 2048, dtype=torch.bfloat16)[::2, ::2])  # neither contiguous: copied


@pytest.mark.parametrize("shape", [(0, 300), (5, 0), (0, 200, 8), (3, 200, 0)])
def test_both_orientations_empty(shape):
    q, scale, q_t, scale_t = BOTH(randn(*shape, dtype=torch.bfloat16))
    assert q.shape == shape and q_t.shape == shape[:-2] + shape[:-3:-1]
    assert scale.shape[-2:] == tuple(-(-n // 128) for n in shape[-2:])
    assert scale_t.shape == scale.mT.shape
