"""torch.ops.gg_runtime.quantize_fp8_columns refuses bad input with a message
naming the argument, before anything touches CUDA, and gives its outputs'
shapes on fake and meta tensors, launching nothing.  Runs on CPU."""
import pytest
import torch

from gg_runtime._native import call
from gg_runtime.formats import ROW_BLOCKS, ROWWISE

from conftest import cuda

OP = torch.ops.gg_runtime.quantize_fp8_columns.default
GRANULARITIES = (ROWWISE, ROW_BLOCKS)  # quantize_fp8_columns'


def offsets(groups: int, device="cuda") -> torch.Tensor:
    return torch.zeros(groups, dtype=torch.int32, device=device)


def expected_shapes(rows: int, cols: int, groups: int, granularity: str) -> tuple:
    """q [C, 128 * (T // 128 + G)] and scale [G, C] (rowwise) or [T // 128 + G, C]."""
    blocks = rows // 128 + groups
    return (cols, 128 * blocks), (groups if granularity == "rowwise" else blocks, cols)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("make_x, groups", [
    (lambda dtype: cuda(300, 208, dtype=dtype), 5),
    (lambda dtype: torch.empty_strided((300, 77), (256, 1), dtype=dtype, device="cuda"),
     1),  # row stride > C
    (lambda dtype: cuda(77, 300, dtype=dtype).t(), 1000),  # copied to row-major, not refused
    (lambda dtype: cuda(128, 16, dtype=dtype), 1),
    (lambda dtype: cuda(0, 16, dtype=dtype), 3),  # rowwise: empty groups' scales written
    (lambda dtype: cuda(300, 0, dtype=dtype), 2),  # nothing to write
    (lambda dtype: cuda(300, 16, dtype=dtype), 0),  # no group: nothing to write
])
def test_shapes(fake, granularity, dtype, make_x, groups):
    x = make_x(dtype)
    q, scale = call(OP, x, offsets(groups), granularity)
    q_shape, scale_shape = expected_shapes(*x.shape, groups, granularity)
    assert q.shape == q_shape and q.dtype == torch.float8_e4m3fn and q.is_contiguous()
    assert scale.shape == scale_shape and scale.dtype == torch.float32


def test_granularity_defaults_to_1x128(fake):
    q, scale = torch.ops.gg_runtime.quantize_fp8_columns(cuda(300, 32), offsets(4))
    assert q.shape == (32, 128 * 6) and scale.shape == (6, 32)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_meta_tensors(granularity):
    x = torch.empty(1000, 48, dtype=torch.bfloat16, device="meta")
    q, scale = call(OP, x, offsets(7, device="meta"), granularity)
    assert (q.shape, scale.shape) == expected_shapes(1000, 48, 7, granularity)
    assert q.device.type == scale.device.type == "meta"


@pytest.mark.parametrize("make, error, message", [
    (lambda: ([[1.0]], offsets(1), "1x128"), TypeError, "x must be a torch.Tensor, got list"),
    (lambda: (cuda(4, 8), offsets(1), "128x128"), ValueError,
     "granularity must be 'rowwise' or '1x128', got '128x128'"),
    (lambda: (cuda(4, 8), offsets(1), "blockwise"), ValueError,
     "granularity must be 'rowwise' or '1x128', got 'blockwise'"),
    (lambda: (cuda(4, 8), offsets(1), None), TypeError, "granularity must be a str, got NoneType"),
    (lambda: (cuda(8), offsets(1), "1x128"), ValueError, r"x must be 2-D, got shape \(8,\)"),
    (lambda: (cuda(2, 4, 8), offsets(1), "rowwise"), ValueError,
     r"x must be 2-D, got shape \(2, 4, 8\)"),
    (lambda: (cuda(4, 8, dtype=torch.float64), offsets(1), "rowwise"), TypeError,
     "x must be float16 or bfloat16 or float32, got torch.float64"),
    (lambda: (cuda(4, 8, dtype=torch.float8_e4m3fn), offsets(1), "1x128"), TypeError,
     "x must be float16 or bfloat16 or float32, got torch.float8_e4m3fn"),
    (lambda: (cuda(4, 8), offsets(2).long(), "1x128"), TypeError,
     "offs must be int32, got torch.int64"),
    (lambda: (cuda(4, 8), offsets(4).view(2, 2), "1x128"), ValueError,
     r"offs must be 1-D, got shape \(2, 2\)"),
    (lambda: (cuda(4, 8), cuda((), dtype=torch.int32), "1x128"), ValueError,
     r"offs must be 1-D, got shape \(\)"),
    (lambda: (cuda(4, 8), torch.empty_strided((3,), (2,), dtype=torch.int32, device="cuda"),
              "rowwise"), ValueError, "offs must be contiguous"),
    (lambda: (cuda(4, 8), offsets(1), "1x128", cuda(8, dtype=torch.int32), 2), TypeError,
     "rows must be int64, got torch.int32"),
    (lambda: (cuda(4, 8), offsets(1), "1x128", cuda(8, 1, dtype=torch.int64), 2), ValueError,
     r"rows must be 1-D"),
    (lambda: (cuda(4, 8), offsets(1), "1x128", cuda(8, dtype=torch.int64), 0), ValueError,
     r"k must be in \[1, 2\*\*31\), got 0"),
    (lambda: (cuda(2**28, 8), offsets(1), "1x128", cuda(8, dtype=torch.int64), 8), ValueError,
     r"x's rows times k must be below 2\*\*31, got 268435456 x 8"),
])
def test_refused(fake, make, error, message):
    with pytest.raises(error, match=message):
        call(OP, *make())


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_gathered_rows_shape(fake, granularity):
    """With rows, T is the rows' count (x has its own number of rows)."""
    rows = cuda(300, dtype=torch.int64)
    q, scale = call(OP, cuda(75, 208), offsets(5), granularity, rows, 4)
    assert (tuple(q.shape), tuple(scale.shape)) == expected_shapes(300, 208, 5, granularity)


def test_offsets_on_another_device_refused():
    """Meta x (no fake mode: the fake mode refuses mixed devices itself)."""
    x = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="offs is on cpu but the inputs are on meta"):
        call(OP, x, offsets(2, device="cpu"), "1x128")


def test_cpu_tensor_refused():
    with pytest.raises(ValueError, match="x must be on a CUDA device, got cpu"):
        call(OP, torch.ones(4, 8, dtype=torch.bfloat16), offsets(1, device="cpu"), "rowwise")
