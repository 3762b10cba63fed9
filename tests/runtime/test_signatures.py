"""The public functions take torch's argument names and positions, refuse bad
arguments with a TypeError / ValueError naming them, and give shapes for meta
tensors.  Runs on CPU."""
import inspect

import pytest
import torch
import torch.nn.functional as F

import gg_runtime

from conftest import cuda


def schema_names(op) -> list:
    return [arg.name for arg in op.default._schema.arguments]


def parameter_names(fn) -> list:
    return list(inspect.signature(fn).parameters)


def needs_aten(name: str):
    return pytest.mark.skipif(not hasattr(torch.ops.aten, name),
                              reason=f"this torch has no aten::{name} (torch >= 2.8 has)")


@needs_aten("_grouped_mm")
def test_grouped_mm_takes_torch_grouped_mm_positions_and_f_grouped_mm_names():
    ours = parameter_names(gg_runtime.grouped_mm)
    # aten names its first two `self` and `mat2`; the rest are positions and names alike.
    assert ours[2:] == schema_names(torch.ops.aten._grouped_mm)[2:]
    if hasattr(F, "grouped_mm"):  # torch >= 2.9
        assert ours == parameter_names(F.grouped_mm)
    # The operator takes one more: whether float32 may use TF32 (torch's setting,
    # which the stable ABI cannot read; the public function passes it).
    assert ours + ["tf32"] == schema_names(torch.ops.gg_runtime.grouped_mm)


@needs_aten("_scaled_grouped_mm")
def test_scaled_grouped_mm_takes_torch_order():
    ours = parameter_names(gg_runtime.scaled_grouped_mm)
    assert ours[:2] == ["mat_a", "mat_b"]
    assert ours[2:] == schema_names(torch.ops.aten._scaled_grouped_mm)[2:]
    assert ours == schema_names(torch.ops.gg_runtime.scaled_grouped_mm)


@pytest.mark.parametrize("args, error, message", [
    (("x", torch.empty(2, 3, 4)), TypeError, "mat_a must be a torch.Tensor, got str"),
    ((torch.empty(2, 3), [1]), TypeError, "mat_b must be a torch.Tensor, got list"),
])
def test_non_tensors_are_type_errors(args, error, message):
    with pytest.raises(error, match=message):
        gg_runtime.grouped_mm(*args)
    with pytest.raises(error, match=message):
        gg_runtime.scaled_grouped_mm(*args, None, None)


def test_cpu_tensors_are_refused_with_the_reason():
    a, b = torch.randn(10, 8), torch.randn(3, 8, 5)
    with pytest.raises(ValueError, match="mat_a must be on a CUDA device, got cpu .gg_runtime "
                                         "has no CPU kernels"):
        gg_runtime.grouped_mm(a, b, torch.tensor([3, 6, 10], dtype=torch.int32))


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("a_shape, b_shape, groups, bias, expected", [
    ((10, 8), (3, 8, 5), 3, (3, 5), (10, 5)),     # ragged M
    ((6, 10), (10, 5), 4, None, (4, 6, 5)),       # ragged K
    ((4, 7, 8), (8, 30), 4, None, (7, 30)),       # ragged N
    ((3, 7, 8), (3, 8, 5), None, (3, 5), (3, 7, 5)),  # batched
])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_meta_tensors_give_shapes(a_shape, b_shape, groups, bias, expected, out_dtype):
    offs = None if groups is None else meta(groups, dtype=torch.int32)
    bias = None if bias is None else meta(*bias, dtype=out_dtype or torch.bfloat16)
    out = gg_runtime.grouped_mm(meta(*a_shape), meta(*b_shape), offs, bias, out_dtype)
    assert out.is_meta and tuple(out.shape) == expected and out.is_contiguous()  # torch's layout
    assert out.dtype == (out_dtype or torch.bfloat16)


def test_meta_tensors_are_checked():
    with pytest.raises(ValueError, match="K differs"):
        gg_runtime.grouped_mm(meta(10, 8), meta(3, 9, 5), meta(3, dtype=torch.int32))


def test_scaled_meta_tensors_give_shapes():
    fp8 = torch.float8_e4m3fn
    out = gg_runtime.scaled_grouped_mm(
        meta(10, 256, dtype=fp8), meta(2, 32, 256, dtype=fp8).transpose(1, 2),
        meta(10, dtype=torch.float32), meta(2, 32, dtype=torch.float32),
        meta(2, dtype=torch.int32), out_dtype=torch.float32)
    assert out.is_meta and tuple(out.shape) == (10, 32) and out.dtype == torch.float32


@pytest.mark.parametrize("bias, error, message", [
    (lambda: cuda(3, 4), ValueError, r"bias must have shape \(3, 5\)"),
    (lambda: cuda(3, 5, dtype=torch.float16), TypeError,
     r"bias must be of the output's dtype \(torch.bfloat16\)"),
    # Fake tensors: torch's fake mode compares devices before any kernel runs.
    (lambda: torch.empty(3, 5, dtype=torch.bfloat16), (ValueError, RuntimeError),
     "bias is on cpu|same device|different devices"),
    (lambda: 1.0, TypeError, "bias must be a torch.Tensor or None, got float"),
])
def test_bias_errors(fake, bias, error, message):
    with pytest.raises(error, match=message):
        gg_runtime.grouped_mm(cuda(10, 8), cuda(3, 8, 5), cuda(3, dtype=torch.int32), bias(), None)


def test_bias_takes_the_output_dtype(fake):
    offs = cuda(3, dtype=torch.int32)
    gg_runtime.grouped_mm(cuda(10, 8), cuda(3, 8, 5), offs, cuda(3, 5, dtype=torch.float32),
                          torch.float32)
    with pytest.raises(TypeError, match="output's dtype"):
        gg_runtime.grouped_mm(cuda(10, 8), cuda(3, 8, 5), offs, cuda(3, 5), torch.float32)


@pytest.mark.parametrize("a_shape, b_shape, groups", [((6, 10), (10, 5), 4),
                                                      ((4, 7, 8), (8, 30), 4)])
def test_bias_refused_where_b_is_2d(fake, a_shape, b_shape, groups):
    with pytest.raises(ValueError, match="bias is supported where mat_b is 3-D"):
        gg_runtime.grouped_mm(cuda(*a_shape), cuda(*b_shape), cuda(groups, dtype=torch.int32),
                 cuda(groups, 5), None)


def test_gmm_meta_shapes():
    counts = torch.tensor([3, 0, 7])
    assert gg_runtime.gmm(meta(10, 8), meta(3, 8, 5), counts).shape == (10, 5)
    assert gg_runtime.gmm(meta(10, 8), meta(3, 5, 8), counts, trans_b=True).shape == (10, 5)


@pytest.mark.parametrize("counts, trans_b, error, message", [
    ([3, 0, 6], False, ValueError, "summing to a's 10 rows"),
    ([3, -1, 8], False, ValueError, "counts >= 0"),
    ([3, 7], False, ValueError, "batch_sizes has 2 entries but b has 3 groups"),
    ([3.0, 0.0, 7.0], False, TypeError, "batch_sizes must be a 1-D int32 or int64 tensor"),
    ([3, 0, 7], 1, TypeError, "trans_b must be a bool"),
])
def test_gmm_errors(counts, trans_b, error, message):
    with pytest.raises(error, match=message):
        gg_runtime.gmm(meta(10, 8), meta(3, 8, 5), torch.tensor(counts), trans_b=trans_b)
