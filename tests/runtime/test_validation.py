"""Bad input is refused with a message naming the argument, before any launch.
Runs on CPU: fake CUDA tensors carry shapes, dtypes and strides without a GPU."""
import pytest
import torch

import gg_runtime
from gg_runtime import _C
from gg_runtime.testing import forced

from conftest import cuda, fake_autograd, gpu


def offsets(groups):
    return torch.empty(groups, dtype=torch.int32, device="cuda")


def strided_offsets(groups):
    return torch.empty_strided((groups,), (2,), dtype=torch.int32, device="cuda")


def check_list(As, Bs, trans_b=False):
    gg_runtime.grouped_gemm(As, Bs, trans_b=trans_b)  # fake tensors: checks, no launch


def test_list_k_mismatch_names_group(fake):
    with pytest.raises(ValueError, match=r"group 1: .*K differs \(8 vs 9\)"):
        check_list([cuda(4, 8), cuda(4, 8)], [cuda(8, 3), cuda(9, 3)])


def test_list_trans_b_reads_k_from_second_dim(fake):
    check_list([cuda(4, 8)], [cuda(3, 8)], trans_b=True)
    with pytest.raises(ValueError, match="K differs"):
        check_list([cuda(4, 8)], [cuda(8, 3)], trans_b=True)


def test_list_dtype_mismatch(fake):
    with pytest.raises(TypeError,
                       match=r"Bs\[0\] has dtype torch.float16 but As\[0\] has torch.bfloat16"):
        check_list([cuda(4, 8)], [cuda(8, 3, dtype=torch.float16)])


def test_list_inner_stride(fake):
    a = cuda(8, 4).t()
    with pytest.raises(ValueError, match=r"As\[0\] must have unit stride in its last dimension"):
        check_list([a], [cuda(8, 3)])


def test_list_lengths_and_types():
    with pytest.raises(ValueError, match="As has 2 matrices but Bs has 1"):
        gg_runtime.grouped_gemm([torch.empty(1, 1)] * 2, [torch.empty(1, 1)])
    with pytest.raises(TypeError, match="As must be a list of torch.Tensor, got Tensor"):
        gg_runtime.grouped_gemm(torch.empty(2, 2), torch.empty(2, 2))
    assert gg_runtime.grouped_gemm([], []) == []


def test_unsupported_dtype():
    a = torch.empty(4, 8, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"As\[0\] must be float16 or bfloat16, got torch.float32"):
        gg_runtime.grouped_gemm([a], [a])


def test_wrong_rank():
    with pytest.raises(ValueError, match=r"As\[0\] must be 2-D, got shape \(4,\)"):
        gg_runtime.grouped_gemm([torch.empty(4, dtype=torch.float16)], [torch.empty(4, 4)])


GROUPED_MM_ERRORS = [
    (lambda: (cuda(10, 8), cuda(3, 9, 5), offsets(3)), ValueError, r"K differs"),
    (lambda: (cuda(10, 8), cuda(3, 8, 5), offsets(2)), ValueError,
     r"offs has 2 entries but mat_b has 3"),
    (lambda: (cuda(10, 8), cuda(3, 8, 5), None), ValueError, r"offs is required"),
    (lambda: (None, cuda(3, 8, 5), offsets(3)), TypeError,
     r"mat_a must be a torch.Tensor, got NoneType"),
    (lambda: (cuda(10, 8), cuda(3, 8, 5), offsets(3).long()), TypeError, r"offs must be int32"),
    (lambda: (cuda(8, 10), cuda(9, 5), offsets(3)), ValueError, r"T differs"),
    (lambda: (cuda(2, 8, 4), cuda(2, 4, 5), offsets(2)), ValueError, r"offs must be None"),
    (lambda: (cuda(2, 8, 4), cuda(3, 4, 5), None), ValueError, r"G or K differs"),
    (lambda: (cuda(2, 8, 4), cuda(4, 5), None), ValueError, r"offs is required when mat_a is 3-D"),
    (lambda: (cuda(2, 8, 4), cuda(5, 6), offsets(2)), ValueError, r"K differs"),
    (lambda: (cuda(2, 8, 4), cuda(4, 6), offsets(3)), ValueError,
     r"offs has 3 entries but mat_a has 2"),
    (lambda: (cuda(10, 8, dtype=torch.float64), cuda(3, 8, 5), offsets(3)), TypeError,
     r"mat_a must be float16 or bfloat16 or float32, got torch.float64"),
    (lambda: (cuda(10, 8), cuda(3, 8, 5, dtype=torch.float16), offsets(3)), TypeError,
     r"mat_b has dtype"),
    (lambda: (cuda(10, 8), cuda(3, 8, 5), strided_offsets(3)), ValueError,
     r"offs must be contiguous"),
    # Fake tensors: torch's fake mode compares devices before any kernel runs.
    (lambda: (cuda(10, 8), cuda(3, 8, 5), offsets(3).cpu()), (ValueError, RuntimeError),
     r"offs is on cpu|same device|different devices"),
]


@pytest.mark.parametrize("args, error, message", GROUPED_MM_ERRORS)
def test_grouped_mm_errors(fake, args, error, message):
    a, b, offs = args()
    with pytest.raises(error, match=message):
        gg_runtime.grouped_mm(a, b, offs, None, None)


@gpu
@pytest.mark.parametrize("args, error, message", GROUPED_MM_ERRORS)
def test_grouped_mm_errors_on_the_fast_path(args, error, message):
    """Real CUDA tensors get the same errors as fake ones."""
    a, b, offs = args()
    with pytest.raises(error, match=message):
        gg_runtime.grouped_mm(a, b, offs)


def test_grouped_mm_out_dtype_refused(fake):
    with pytest.raises(TypeError, match="out_dtype=torch.float16 is not supported"):
        gg_runtime.grouped_mm(cuda(10, 8), cuda(3, 8, 5), offsets(3), None, torch.float16)
    # torch would take an int for the enum's value; -1 names no dtype.
    with pytest.raises(TypeError, match="out_dtype must be a torch.dtype or None, got int"):
        gg_runtime.grouped_mm(cuda(10, 8), cuda(3, 8, 5), offsets(3), None, -1)


def test_grouped_mm_cpu_tensor():
    a = torch.empty(10, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="mat_a must be on a CUDA device"):
        gg_runtime.grouped_mm(a, torch.empty(3, 8, 5, dtype=torch.bfloat16),
                              torch.zeros(3, dtype=torch.int32))


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("a_shape, b_shape, groups, expected", [
    ((10, 8), (3, 8, 5), 3, (10, 5)),   # ragged M
    ((6, 10), (10, 5), 4, (4, 6, 5)),   # ragged K
    ((4, 7, 8), (8, 30), 4, (7, 30)),   # ragged N
    ((3, 7, 8), (3, 8, 5), None, (3, 7, 5)),  # batched
])
def test_fake_implementation_shapes(fake, a_shape, b_shape, groups, expected, out_dtype):
    offs = offsets(groups) if groups else None
    out = torch.ops.gg_runtime.grouped_mm(cuda(*a_shape), cuda(*b_shape), offs, None, out_dtype)
    assert tuple(out.shape) == expected and out.dtype == (out_dtype or torch.bfloat16)


def test_fake_implementation_validates(fake):
    """The operator itself checks (its Meta kernel is the CUDA one without the
    launch); called directly, its errors carry a tag naming the class that the
    public function raises (torch makes them ValueError or RuntimeError)."""
    with pytest.raises((ValueError, RuntimeError), match=r"\[gg_runtime ValueError\] K differs"):
        torch.ops.gg_runtime.grouped_mm(cuda(10, 8), cuda(3, 9, 5), offsets(3), None, None)
    with pytest.raises((ValueError, RuntimeError),
                       match=r"\[gg_runtime TypeError\] out_dtype=torch.float16"):
        torch.ops.gg_runtime.grouped_mm(cuda(10, 8), cuda(3, 8, 5), offsets(3), None, torch.float16)


def test_grouped_mm_cpu_tensor_with_grad_is_a_clear_error():
    a = torch.empty(10, 8, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="mat_a must be on a CUDA device"):
        gg_runtime.grouped_mm(a, torch.empty(3, 8, 5, dtype=torch.bfloat16),
                              torch.zeros(3, dtype=torch.int32))


@fake_autograd
def test_grouped_mm_records_a_gradient_only_where_an_input_needs_one(fake):
    """Calls whose inputs need no gradient skip the operator's autograd kernel
    (_native.call_untracked_if_possible); those that do still record one."""
    a, offs = cuda(10, 8), offsets(3)
    w = cuda(3, 8, 5).requires_grad_()
    assert gg_runtime.grouped_mm(a, w, offs).grad_fn is not None
    assert gg_runtime.grouped_mm(a.requires_grad_(), w.detach(), offs).grad_fn is not None
    assert gg_runtime.grouped_mm(a.detach(), w.detach(), offs).grad_fn is None
    with torch.no_grad():
        out = gg_runtime.grouped_mm(a, w, offs)
    assert out.grad_fn is None and not out.requires_grad and out.shape == (10, 5)


def test_forcing_a_variant_this_build_lacks_is_refused_on_entry():
    """The test hook resolves the key once, when the block is entered (a
    forced launch then costs the host what a dispatched one does)."""
    with pytest.raises(ValueError, match="no variant nonsense in this build"), forced("nonsense"):
        pytest.fail("the block ran")
    with forced(_C.variants()[0]["key"]):
        pass
