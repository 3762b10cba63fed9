"""grouped_mm's and scaled_grouped_mm's per-group bias, added in the kernels'
epilogue: values and gradients against float32 references, on every layout,
flavour, output dtype and route (eager, custom op, torch.compile)."""
import pytest
import torch

import gg_runtime
from gg_runtime.testing import (FP8_TOLERANCE, TOLERANCE, fp8_moe_inputs, offsets_from_counts,
                                operand, randn, ref_grouped_mm, ref_grouped_mm_grads,
                                ref_scaled_grouped_mm, rel_error, skewed_counts, tolerance)

from conftest import gpu, tma_runs_here

pytestmark = [gpu, pytest.mark.usefixtures("poison")]


def ragged_inputs(counts, k, n, dtype, a_row_major=True, b_row_major=False):
    a = operand((sum(counts), k), a_row_major, False, dtype)
    b = operand((len(counts), k, n), b_row_major, False, dtype)
    return a, b, offsets_from_counts(counts)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("a_row_major", [True, False])
@pytest.mark.parametrize("b_row_major", [True, False])
def test_ragged_m_bias(dtype, out_dtype, a_row_major, b_row_major, allow_tma):
    if dtype is torch.float32 and out_dtype is torch.float32:
        pytest.skip("float32 inputs have one output dtype")
    counts = skewed_counts(700, 9, zero_groups=3)
    a, b, offs = ragged_inputs(counts, 72, 136, dtype, a_row_major, b_row_major)
    bias = randn(9, 136, dtype=out_dtype or dtype)
    a = a[:-5]  # rows past offs[-1]: zero, no bias
    offs = offs.clamp(max=a.shape[0])
    out = gg_runtime.grouped_mm(a, b, offs, bias, out_dtype)
    assert out.dtype == (out_dtype or dtype)
    ref = ref_grouped_mm(a, b, offs, bias)
    assert rel_error(out, ref) < tolerance(dtype, out_dtype)


@pytest.mark.parametrize("counts", [[0], [5], [0, 0, 3], [1] * 1200, [130, 0, 0, 70]],
                         ids=["one-empty", "one", "mostly-empty", "1200x1", "skewed"])
def test_ragged_m_bias_edges(counts):
    a, b, offs = ragged_inputs(counts, 40, 24, torch.bfloat16)
    bias = randn(len(counts), 24, dtype=torch.bfloat16)
    out = gg_runtime.grouped_mm(a, b, offs, bias=bias)
    assert rel_error(out, ref_grouped_mm(a, b, offs, bias)) < TOLERANCE[torch.bfloat16]


def test_ragged_m_bias_with_k_zero():
    """An empty product plus bias is the bias, row by row."""
    a, b, offs = ragged_inputs([3, 0, 4], 0, 16, torch.bfloat16)
    bias = randn(3, 16, dtype=torch.bfloat16)
    out = gg_runtime.grouped_mm(a, b, offs, bias=bias)
    assert torch.equal(out, torch.cat([bias[0].expand(3, 16), bias[2].expand(4, 16)]))


def test_strided_bias_is_read_as_values():
    a, b, offs = ragged_inputs([30, 20], 32, 48, torch.bfloat16)
    bias = randn(48, 2, dtype=torch.bfloat16).t()  # [2, 48], not contiguous
    out = gg_runtime.grouped_mm(a, b, offs, bias=bias)
    assert rel_error(out, ref_grouped_mm(a, b, offs, bias)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("a_row_major", [True, False])
def test_batched_bias(a_row_major):
    a = operand((4, 33, 40), a_row_major, False, torch.bfloat16)
    b = randn(4, 40, 24, dtype=torch.bfloat16)
    bias = randn(4, 24, dtype=torch.bfloat16)
    out = gg_runtime.grouped_mm(a, b, bias=bias)
    assert rel_error(out, ref_grouped_mm(a, b, None, bias)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("case", ["ragged_m", "batched"])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_bias_gradients(case, out_dtype):
    dtype = torch.bfloat16
    if case == "ragged_m":
        counts = [40, 0, 130, 7]
        a, b, offs = ragged_inputs(counts, 48, 64, dtype)
        a = torch.cat([a, randn(6, 48, dtype=dtype)])  # rows past the groups: no bias gradient
    else:
        a, b, offs = randn(4, 37, 48, dtype=dtype), randn(4, 48, 64, dtype=dtype), None
    bias = randn(4, 64, dtype=out_dtype or dtype)
    inputs = [x.detach().requires_grad_() for x in (a, b, bias)]
    out = gg_runtime.grouped_mm(inputs[0], inputs[1], offs, inputs[2], out_dtype=out_dtype)
    grad = randn(*out.shape, dtype=out.dtype)
    out.backward(grad)
    refs = ref_grouped_mm_grads(a, b, offs, grad, bias)
    for x, ref in zip(inputs, refs):
        assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
        assert rel_error(x.grad, ref) < 2 * TOLERANCE[dtype]


def test_bias_gradient_alone():
    """Only the bias requires grad: the backward computes its gradient alone."""
    a, b, offs = ragged_inputs([9, 31], 16, 32, torch.float16)
    bias = randn(2, 32, dtype=torch.float16).requires_grad_()
    gg_runtime.grouped_mm(a, b, offs, bias).sum().backward()
    expected = torch.tensor([9.0, 31.0], device="cuda")[:, None].expand(2, 32)
    assert torch.equal(bias.grad.float(), expected)


@pytest.mark.parametrize("backend", ["custom_op", "aot_eager"])
def test_bias_through_the_custom_op(backend):
    a, b, offs = ragged_inputs([25, 0, 40], 32, 48, torch.bfloat16)
    bias = randn(3, 48, dtype=torch.bfloat16)
    inputs = [x.detach().requires_grad_() for x in (a, b, bias)]
    if backend == "custom_op":
        out = torch.ops.gg_runtime.grouped_mm(inputs[0], inputs[1], offs, inputs[2], None)
    else:
        fn = torch.compile(gg_runtime.grouped_mm, backend="aot_eager", fullgraph=True)
        out = fn(inputs[0], inputs[1], offs, inputs[2])
    grad = randn(*out.shape, dtype=out.dtype)
    out.backward(grad)
    assert rel_error(out, ref_grouped_mm(a, b, offs, bias)) < TOLERANCE[torch.bfloat16]
    for x, ref in zip(inputs, ref_grouped_mm_grads(a, b, offs, grad, bias)):
        assert rel_error(x.grad, ref) < 2 * TOLERANCE[torch.bfloat16]


def test_bias_refused_where_b_is_2d():
    a, b = randn(8, 30, dtype=torch.bfloat16), randn(30, 16, dtype=torch.bfloat16)
    offs = offsets_from_counts([10, 20])
    with pytest.raises(ValueError, match="bias is supported where mat_b is 3-D"):
        gg_runtime.grouped_mm(a, b, offs, bias=randn(2, 16, dtype=torch.bfloat16))


@pytest.mark.skipif(not tma_runs_here(), reason="fp8 runs on sm90 only")
@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("counts", [[5, 0, 40], [300, 260, 0, 190]], ids=["decode", "large"])
def test_scaled_bias_and_scale_result(granularity, out_dtype, counts):
    a, b, scale_a, scale_b, offs = fp8_moe_inputs(counts, 256, 384, granularity)
    bias = randn(len(counts), 256, dtype=out_dtype)
    scale_result = torch.tensor([0.75], device="cuda")
    out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, bias, scale_result,
                                       out_dtype)
    ref = ref_scaled_grouped_mm(a, b, scale_a, scale_b, offs, granularity) * 0.75
    start = 0
    for g, end in enumerate(offs.tolist()):
        ref[start:end] += bias[g].float()
        start = end
    assert rel_error(out, ref) < FP8_TOLERANCE[out_dtype]


@pytest.mark.skipif(not tma_runs_here(), reason="fp8 runs on sm90 only")
def test_scaled_bias_with_k_zero():
    a = torch.empty(6, 0, device="cuda", dtype=torch.float8_e4m3fn)
    b = torch.empty(2, 16, 0, device="cuda", dtype=torch.float8_e4m3fn).transpose(1, 2)
    bias = randn(2, 16, dtype=torch.bfloat16)
    out = gg_runtime.scaled_grouped_mm(a, b, torch.ones(6, device="cuda"),
                                       torch.ones(2, 16, device="cuda"),
                                       offsets_from_counts([2, 4]), bias)
    assert torch.equal(out, torch.cat([bias[0].expand(2, 16), bias[1].expand(4, 16)]))
