"""quantize_fp8 (and quantize_fp8_both_orientations) refuses bad input with a
message naming the argument, before anything touches CUDA, and launches
nothing for empty input.  Runs on CPU: fake CUDA tensors carry shapes, dtypes
and strides without a GPU."""
import pytest
import torch

from gg_runtime import quantize_fp8
from gg_runtime._native import call
from gg_runtime.formats import GRANULARITIES

from conftest import cuda

BOTH = torch.ops.gg_runtime.quantize_fp8_both_orientations.default


def strided(shape, strides, dtype):
    """An uninitialised CUDA tensor of these strides (fake under `fake`)."""
    return torch.empty_strided(shape, strides, dtype=dtype, device="cuda")


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_valid_inputs_pass(fake, granularity, dtype):
    quantize_fp8(cuda(10, 256, dtype=dtype), granularity)
    quantize_fp8(cuda(2, 300, 256, dtype=dtype), granularity)
    quantize_fp8(cuda(256, 10, dtype=dtype).t(), granularity)  # column-major: read in place
    quantize_fp8(cuda(3, 256, 10, dtype=dtype).transpose(1, 2), granularity)
    # Groups further apart than their elements; neither last dimension contiguous (copied).
    quantize_fp8(strided((3, 10, 256), (5120, 1, 20), dtype), granularity)
    quantize_fp8(strided((10, 256), (1024, 2), dtype), granularity)


@pytest.mark.parametrize("make, granularity, error, message", [
    (lambda: [[1.0]], "rowwise", TypeError, "x must be a torch.Tensor, got list"),
    (lambda: cuda(4, 8), "blockwise", ValueError,
     "granularity must be 'rowwise', '1x128' or '128x128', got 'blockwise'"),
    (lambda: cuda(4, 8), None, TypeError, "granularity must be a str, got NoneType"),
    (lambda: cuda(8), "rowwise", ValueError,
     r"x must be 2-D \[T, K\] \(activations\) or 3-D \[G, N, K\] \(weights\), got shape \(8,\)"),
    (lambda: cuda(2, 3, 4, 8), "128x128", ValueError, r"got shape \(2, 3, 4, 8\)"),
    (lambda: cuda(4, 8, dtype=torch.float64), "rowwise", TypeError,
     "x must be float16 or bfloat16 or float32, got torch.float64"),
    (lambda: cuda(4, 8, dtype=torch.float8_e4m3fn), "1x128", TypeError,
     "got torch.float8_e4m3fn"),
])
def test_refused(fake, make, granularity, error, message):
    with pytest.raises(error, match=message):
        quantize_fp8(make(), granularity)


def test_cpu_tensor_refused():
    with pytest.raises(ValueError, match="x must be on a CUDA device, got cpu"):
        quantize_fp8(torch.ones(4, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize("shape, granularity, scale_shape", [
    ((0, 300), "rowwise", (0,)),
    ((0, 300), "1x128", (0, 3)),
    ((0, 300), "128x128", (0, 3)),
    ((5, 0), "rowwise", (5,)),
    ((5, 0), "1x128", (5, 0)),
    ((0, 200, 8), "128x128", (0, 2, 1)),
    ((3, 0, 8), "rowwise", (3, 0)),
    ((3, 200, 0), "1x128", (3, 200, 0)),
    ((3, 200, 0), "128x128", (3, 2, 0)),
])
def test_empty_input_launches_nothing(fake, shape, granularity, scale_shape):
    """Fake tensors have no data pointer: a launch would fail here."""
    q, scale, format = quantize_fp8(cuda(*shape), granularity)
    assert q.shape == shape and q.dtype == torch.float8_e4m3fn and format == granularity
    assert scale.shape == scale_shape and scale.dtype == torch.float32


def test_none_is_refused_by_name():
    """Outside torch.compile's fake mode the dispatcher finds no tensor to
    dispatch on; the error names x all the same."""
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got NoneType"):
        quantize_fp8(None, "rowwise")


@pytest.mark.parametrize("make", [
    lambda: cuda(300, 200), lambda: cuda(3, 300, 200), lambda: cuda(3, 200, 300).transpose(1, 2),
    lambda: strided((3, 10, 256), (5120, 1, 20), torch.bfloat16),
])
def test_both_orientations_shapes(fake, make):
    x = make()
    q, scale, q_t, scale_t = call(BOTH, x)
    assert q.shape == x.shape and q_t.shape == x.mT.shape and q_t.is_contiguous()
    assert q.dtype == q_t.dtype == torch.float8_e4m3fn
    assert scale.shape == quantize_fp8(x, "128x128").scales.shape
    assert scale_t.shape == scale.mT.shape


@pytest.mark.parametrize("make, error, message", [
    (lambda: cuda(8), ValueError, r"x must be 2-D \[T, K\] \(activations\) or 3-D"),
    (lambda: cuda(4, 8, dtype=torch.float64), TypeError, "x must be float16 or bfloat16 or "
     "float32, got torch.float64"),
])
def test_both_orientations_refused(fake, make, error, message):
    with pytest.raises(error, match=message):
        call(BOTH, make())
