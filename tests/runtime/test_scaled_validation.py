"""scaled_grouped_mm's checks refuse bad input with a message naming the
argument.  Runs on CPU: fake CUDA tensors carry shapes, dtypes and strides."""
import pytest
import torch

import gg_runtime

from conftest import cuda

FP8 = torch.float8_e4m3fn
pytestmark = pytest.mark.usefixtures("fake")


def scales(*shape):
    return cuda(*shape, dtype=torch.float32)


def check(a, b, scale_a, scale_b, offs, out_dtype=torch.bfloat16, bias=None,
          scale_result=None, use_fast_accum=False):
    """scaled_grouped_mm in torch's argument order, with the optional arguments by name."""
    return gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, bias, scale_result,
                                        out_dtype, use_fast_accum)


def inputs(t=10, g=2, n=32, k=256):
    """Valid rowwise inputs: a [T, K], b [G, K, N] K-major, scales, offs."""
    return (cuda(t, k, dtype=FP8), cuda(g, n, k, dtype=FP8).transpose(1, 2), scales(t),
            scales(g, n), torch.empty(g, dtype=torch.int32, device="cuda"))


def test_valid_inputs_pass():
    a, b, scale_a, scale_b, offs = inputs()
    assert check(a, b, scale_a, scale_b, offs).shape == (10, 32)
    assert check(a, b, scales(10, 2), scales(2, 1, 2), offs, torch.float32).dtype == torch.float32
    assert check(a, b, scales(10, 2), scales(2, 32), offs).shape == (10, 32)  # blockwise_rowwise
    batched_a = cuda(2, 5, 256, dtype=FP8)
    assert check(batched_a, b, scales(2, 5), scale_b, None).shape == (2, 5, 32)
    assert check(a, b, scale_a, scale_b, offs, bias=cuda(2, 32), scale_result=scales(1),
                 use_fast_accum=True).shape == (10, 32)
    assert check(a, b, scale_a, scale_b, offs, torch.float32, bias=scales(2, 32)).shape == (10, 32)


# Each case replaces some of the valid inputs (a, b, scale_a, scale_b, offs);
# made fresh in the test, under fake mode, so that no op runs.
CASES = {
    "b row-major": (lambda: {"b": cuda(2, 256, 32, dtype=FP8)}, ValueError, "K-major"),
    "a bf16": (lambda: {"a": cuda(10, 256, dtype=torch.bfloat16)}, TypeError,
               "mat_a must be float8_e4m3fn"),
    "scale_a float64": (lambda: {"scale_a": cuda(10, dtype=torch.float64)}, TypeError,
                        "scale_a must be float32"),
    "scale_b short": (lambda: {"scale_b": scales(2, 16)}, ValueError,
                      r"scale_b must have shape \(2, 32\)"),
    "scale_b channels short": (lambda: {"scale_a": scales(10, 2), "scale_b": scales(2, 16)},
                               ValueError, r"scale_b must have shape \(2, 32\)"),
    "scale_b blocks short": (lambda: {"scale_a": scales(10, 2), "scale_b": scales(2, 1, 1)},
                             ValueError, r"scale_b must have shape \(2, 1, 2\)"),
    "scale_a short": (lambda: {"scale_a": scales(5)}, ValueError,
                      r"scale_a must have shape \(10,\)"),
    "scale_a 3-D": (lambda: {"scale_a": scales(1, 1, 10)}, ValueError, "1-D .rowwise. or 2-D"),
    "K not 16n": (lambda: {"a": cuda(10, 40, dtype=FP8),
                           "b": cuda(2, 32, 40, dtype=FP8).transpose(1, 2)},
                  ValueError, "multiples of 16"),
    "a row stride": (lambda: {"a": torch.empty_strided((10, 256), (264, 1), dtype=FP8,
                                                      device="cuda")}, ValueError,
                     "row strides"),
    "no offs": (lambda: {"offs": None}, ValueError, "offs is required"),
    "offs short": (lambda: {"offs": torch.empty(1, dtype=torch.int32, device="cuda")},
                   ValueError, "offs has 1 entries"),
    # Fake tensors: torch's fake mode compares devices before any kernel runs.
    "a on cpu": (lambda: {"a": torch.empty(10, 256, dtype=FP8)}, (ValueError, RuntimeError),
                 "mat_a must be on a CUDA device|same device|different devices"),
    "a 4-D": (lambda: {"a": cuda(10, 256, 1, 1, dtype=FP8)}, ValueError, "2-D x 2-D"),
    "bias shape": (lambda: {"bias": cuda(2, 16)}, ValueError, r"bias must have shape \(2, 32\)"),
    "bias dtype": (lambda: {"bias": scales(2, 32)}, TypeError,
                   r"bias must be of the output's dtype \(torch.bfloat16\)"),
    "bias on cpu": (lambda: {"bias": torch.empty(2, 32, dtype=torch.bfloat16)},
                    (ValueError, RuntimeError), "bias is on cpu|same device|different devices"),
    "bias a list": (lambda: {"bias": [1.0]}, TypeError,
                    "bias must be a torch.Tensor or None, got list"),
    "scale_result 2 values": (lambda: {"scale_result": scales(2)}, ValueError,
                              "scale_result must be one float32 value"),
    "scale_result a float": (lambda: {"scale_result": 2.0}, TypeError,
                             "scale_result must be a torch.Tensor or None"),
    "use_fast_accum None": (lambda: {"use_fast_accum": None}, TypeError,
                            "use_fast_accum must be a bool"),
    "out_dtype an int": (lambda: {"out_dtype": 100}, TypeError,
                         "out_dtype must be a torch.dtype or None, got int"),
}


@pytest.mark.parametrize("name", CASES)
def test_refused(name):
    replace, error, message = CASES[name]
    args = dict(zip(("a", "b", "scale_a", "scale_b", "offs"), inputs()))
    args.update(replace())
    with pytest.raises(error, match=message):
        check(**args)


def test_out_dtype_and_gradients_refused():
    a, b, scale_a, scale_b, offs = inputs()
    with pytest.raises(TypeError, match="out_dtype must be torch.bfloat16 or torch.float32"):
        check(a, b, scale_a, scale_b, offs, torch.float16)
    with pytest.raises(RuntimeError, match="not differentiable"):
        check(a, b, scale_a.requires_grad_(), scale_b, offs)
    with pytest.raises(RuntimeError, match="not differentiable"):
        check(*inputs(), bias=cuda(2, 32).requires_grad_())


def test_weight_gradient_case_refused():
    with pytest.raises(ValueError, match="2-D x 2-D, are not supported"):
        check(cuda(8, 32, dtype=FP8), cuda(32, 16, dtype=FP8), scales(8), scales(16),
              torch.empty(2, dtype=torch.int32, device="cuda"))


def test_fake_implementation_shapes():
    a, b, scale_a, scale_b, offs = inputs()
    op = torch.ops.gg_runtime.scaled_grouped_mm
    out = op(a, b, scale_a, scale_b, offs, None, None, None, False)
    assert out.shape == (10, 32) and out.dtype == torch.bfloat16
    batched = op(cuda(2, 5, 256, dtype=FP8), b, scales(2, 5), scale_b, None, None, None,
                 torch.float32, False)
    assert batched.shape == (2, 5, 32) and batched.dtype == torch.float32
