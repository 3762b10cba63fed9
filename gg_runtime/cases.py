"""The cases of grouped_mm, worked out once per call: which case a call is
(with every check of its inputs), and its output's shape.  Used by the eager
path, the custom op's fake implementation and the backward alike."""
from __future__ import annotations

import enum

import torch

from ._native import family_dtypes
from .validate import (check_bias, check_offsets, check_out_dtype, check_same, check_tensor,
                       check_tensors, require)


class Case(enum.Enum):
    RAGGED_M = (2, 3)  # a [T, K], b [G, K, N], offs [G] -> [T, N]
    RAGGED_K = (2, 2)  # a [M, T], b [T, N], offs [G] -> [G, M, N]
    RAGGED_N = (3, 2)  # a [G, M, K], b [K, T], offs [G] -> [M, T]
    BATCHED = (3, 3)   # a [G, M, K], b [G, K, N] -> [G, M, N]


_BY_DIMS = {case.value: case for case in Case}
# Every case runs on the ragged_m and ragged_k families, built for the same dtypes.
DTYPES = family_dtypes("ragged_m")


def case_of(a, b) -> Case:
    """The case of inputs already checked (by their dimensions alone)."""
    return _BY_DIMS[(a.dim(), b.dim())]


def output_shape(case: Case, a, b, offs) -> tuple:
    if case is Case.RAGGED_M:
        return (a.shape[0], b.shape[2])
    if case is Case.RAGGED_K:
        return (offs.shape[0], a.shape[0], b.shape[1])
    if case is Case.RAGGED_N:
        return (a.shape[1], b.shape[1])
    return (a.shape[0], a.shape[1], b.shape[2])


def empty_output(case: Case, a, b, offs, out_dtype) -> torch.Tensor:
    """An empty tensor shaped, typed and strided as the call's result (the
    fake implementation): RAGGED_N is written transposed (ragged.ragged_n)."""
    dtype = out_dtype or a.dtype
    if case is Case.RAGGED_N:
        return a.new_empty(output_shape(case, a, b, offs)[::-1], dtype=dtype).t()
    return a.new_empty(output_shape(case, a, b, offs), dtype=dtype)


def _is_plain_ragged_m(a, b, offs, bias, out_dtype) -> bool:
    """The MoE forward call, well formed: True only where _full_checks passes
    with RAGGED_M.  One combined test on the hot path."""
    if not (type(a) is torch.Tensor and type(b) is torch.Tensor and type(offs) is torch.Tensor
            and bias is None and out_dtype is None and a.dim() == 2 and b.dim() == 3
            and offs.dim() == 1):
        return False
    device = a.get_device()
    return (a.dtype is b.dtype and a.dtype in DTYPES and offs.dtype is torch.int32
            and a.is_cuda and b.get_device() == device and offs.get_device() == device
            and a.shape[1] == b.shape[1] and offs.shape[0] == b.shape[0]
            and (offs.shape[0] <= 1 or offs.stride(0) == 1))


def _shapes(a, b) -> str:
    return f"mat_a is {tuple(a.shape)} and mat_b is {tuple(b.shape)}"


def _full_checks(a, b, offs, bias, out_dtype) -> Case:
    check_tensors(a, b)
    dims = (a.dim(), b.dim())
    if dims[0] not in (2, 3) or dims[1] not in (2, 3):
        raise ValueError(f"mat_a and mat_b must be 2-D or 3-D: {_shapes(a, b)}")
    check_tensor(a, "mat_a", dims[0], DTYPES)
    check_tensor(b, "mat_b", dims[1], DTYPES)
    check_same(b, "mat_b", a, "mat_a")
    check_out_dtype(out_dtype, a.dtype)
    case = _BY_DIMS[dims]
    if case is Case.RAGGED_M:
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"K differs: {_shapes(a, b)} (expected [T, K] and [G, K, N])")
        require(offs is not None, "offs is required when mat_a is 2-D and mat_b is 3-D (ragged M)")
        check_offsets(offs, "mat_b", b.shape[0], a)
    elif case is Case.RAGGED_K:
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"T differs: {_shapes(a, b)} (expected [M, T] and [T, N])")
        require(offs is not None, "offs is required when mat_a and mat_b are 2-D (ragged K)")
        check_offsets(offs, "offs", offs.shape[0] if isinstance(offs, torch.Tensor) else 0, a)
    elif case is Case.RAGGED_N:
        if a.shape[2] != b.shape[0]:
            raise ValueError(f"K differs: {_shapes(a, b)} (expected [G, M, K] and [K, T])")
        require(offs is not None, "offs is required when mat_a is 3-D and mat_b is 2-D (ragged N)")
        check_offsets(offs, "mat_a", a.shape[0], a)
    elif case is Case.BATCHED:
        require(offs is None, "offs must be None when mat_a and mat_b are 3-D (batched)")
        if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
            raise ValueError(f"G or K differs: {_shapes(a, b)} (expected [G, M, K] and [G, K, N])")
    if bias is not None:
        require(b.dim() == 3, "bias is supported where mat_b is 3-D, one matrix per group "
                "(ragged M and batched): mat_b is 2-D here")
        check_bias(bias, (b.shape[0], b.shape[2]), out_dtype or a.dtype, a)
    return case


def classify(a, b, offs, bias, out_dtype) -> Case:
    """The call's case, after every check of grouped_mm's inputs: raises
    TypeError / ValueError naming the argument otherwise."""
    if _is_plain_ragged_m(a, b, offs, bias, out_dtype):
        return Case.RAGGED_M
    return _full_checks(a, b, offs, bias, out_dtype)
