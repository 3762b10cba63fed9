"""The cases of PyTorch's own grouped_mm tests (test/test_matmul_cuda.py:
test_grouped_gemm_2d_2d, _2d_3d, _3d_2d, _3d_3d and the compiled one), written
again against gg_runtime.grouped_mm and a float32 reference: each operand row-
or column-major, dense or strided, a zero-size group where torch has one,
bfloat16, float16 and float32 (TF32 off, as there, and on), forward and
gradients; out_dtype=float32 in every case, eager, autograd and compiled."""
import pytest
import torch

import gg_runtime
from gg_runtime.testing import (last_variant, operand, ref_grouped_mm, rel_error, tf32_allowed,
                                tolerance)

from conftest import gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
M, N, K, G = 16, 32, 64, 4
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def offsets(groups, size, zero_size):
    """[size, 2 size, ...]; zero_size: group 1 empty (its end moved to group 0's)."""
    offs = torch.arange(size, groups * size + 1, size, device="cuda", dtype=torch.int32)
    if zero_size:
        offs[0] = offs[1]
    return offs


def inputs(case, a_row_major, b_row_major, strided, dtype, zero_size=False):
    """(a, b, offs) as grouped_mm receives them in torch's test of `case`."""
    if case == "2d_2d":  # ragged K
        a = operand((M, K * G), a_row_major, strided, dtype)
        b = operand((N, K * G), b_row_major, strided, dtype).t()
        return a, b, offsets(G, K, zero_size)
    if case == "2d_3d":  # ragged M
        a = operand((M * G, K), a_row_major, strided, dtype)
        b = operand((G, N, K), b_row_major, strided, dtype).transpose(-2, -1)
        return a, b, offsets(G, M, zero_size)
    if case == "3d_2d":  # ragged N
        a = operand((G, M, K), a_row_major, strided, dtype)
        b = operand((N * G, K), b_row_major, strided, dtype).t()
        return a, b, offsets(G, N, zero_size)
    a = operand((G, M, K), a_row_major, strided, dtype)  # 3d_3d: batched
    b = operand((G, N, K), b_row_major, strided, dtype).transpose(-2, -1)
    return a, b, None


def reference(a, b, offs, grad):
    """Output and gradients of the float32 reference."""
    a32 = a.detach().float().requires_grad_()
    b32 = b.detach().float().requires_grad_()
    out = ref_grouped_mm(a32, b32, offs)
    return (out.detach(), *torch.autograd.grad(out, (a32, b32), grad.float()))


CASES = ["2d_2d", "2d_3d", "3d_2d", "3d_3d"]
LAYOUTS = [(a, b, s) for a in (True, False) for b in (True, False) for s in (False, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_row_major, b_row_major, strided", LAYOUTS,
                         ids=[f"a{'RC'[not a]}-b{'RC'[not b]}{'-strided' * s}"
                              for a, b, s in LAYOUTS])
@pytest.mark.parametrize("case", CASES)
def test_torch_case(case, a_row_major, b_row_major, strided, dtype):
    for zero_size in (False, True) if case in ("2d_3d", "3d_2d") else (False,):
        a, b, offs = inputs(case, a_row_major, b_row_major, strided, dtype, zero_size)
        a.requires_grad_()
        b.requires_grad_()
        out = gg_runtime.grouped_mm(a, b, offs, out_dtype=dtype)
        grad = torch.rand_like(out)
        grad_a, grad_b = torch.autograd.grad(out, (a, b), grad)
        want = reference(a, b, offs, grad)
        for name, got, ref in zip(("out", "grad_a", "grad_b"), (out, grad_a, grad_b), want):
            assert got.shape == ref.shape and got.dtype == dtype, name
            assert rel_error(got, ref) < 2 * tolerance(dtype), (name, zero_size)


@pytest.mark.parametrize("allow_tf32", [False, True], ids=["tf32x3", "tf32"])
@pytest.mark.parametrize("case", CASES)
def test_float32_follows_torch_tf32_setting(case, allow_tf32):
    a, b, offs = inputs(case, True, False, False, torch.float32)
    with tf32_allowed(allow_tf32):
        out = gg_runtime.grouped_mm(a, b, offs)
        key = last_variant()
    assert (".tf32." if allow_tf32 else ".float32.") in key, key
    assert rel_error(out, ref_grouped_mm(a, b, offs)) < tolerance(torch.float32, tf32=allow_tf32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_float32_output(case, dtype):
    """The float32 accumulator written as is, also through autograd."""
    a, b, offs = inputs(case, True, False, True, dtype)
    a.requires_grad_()
    b.requires_grad_()
    out = gg_runtime.grouped_mm(a, b, offs, out_dtype=torch.float32)
    assert out.dtype == torch.float32 and "-float32." in last_variant()
    grad = torch.rand_like(out)
    grad_a, grad_b = torch.autograd.grad(out, (a, b), grad)
    want = reference(a, b, offs, grad.to(dtype))
    assert rel_error(out, want[0]) < tolerance(dtype, torch.float32)
    assert grad_a.dtype == grad_b.dtype == dtype
    assert rel_error(grad_a, want[1]) < 2 * tolerance(dtype)
    assert rel_error(grad_b, want[2]) < 2 * tolerance(dtype)


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("case", CASES)
def test_compiled(case, out_dtype):
    """fullgraph torch.compile: same values, the asked-for dtype, and the
    strides the fake implementation promised."""
    torch._dynamo.reset()
    a, b, offs = inputs(case, True, False, False, torch.bfloat16)
    a.requires_grad_()
    compiled = torch.compile(lambda x, y, o: gg_runtime.grouped_mm(x, y, o, out_dtype=out_dtype),
                             fullgraph=True, backend="aot_eager")
    out = compiled(a, b, offs)
    eager = gg_runtime.grouped_mm(a.detach(), b, offs, out_dtype=out_dtype)
    assert out.dtype == (out_dtype or torch.bfloat16)
    assert out.stride() == eager.stride()
    assert rel_error(out, eager.float()) < 1e-6
    out.float().sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad.float()).all()


@pytest.mark.parametrize("case", CASES)
def test_fake_strides_match_the_real_output(case):
    a, b, offs = inputs(case, False, True, True, torch.float16)
    real = gg_runtime.grouped_mm(a, b, offs)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.gg_runtime.grouped_mm(mode.from_tensor(a), mode.from_tensor(b),
                                               None if offs is None else mode.from_tensor(offs),
                                               None, None)
    assert fake.shape == real.shape and fake.stride() == real.stride()
