"""Raw operations: validate, allocate the output, launch.  No autograd here.

Each function returns (result, variant_key); the key names the compiled
variant that ran ('' when there was nothing to launch) so that tests and
benchmarks can see which path was taken.  `allow_tma=False` forces the
`basic` kernels on sm90; `variant` runs exactly the variant with that key.
"""
from __future__ import annotations

import torch

from . import _C
from ._native import DTYPE_CODES, current_stream
from .validate import (check_offsets, check_out_dtype, check_same, check_tensor,
                       check_unit_inner_stride, require)


def empty(shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """Every output is allocated here (tests replace it to poison outputs)."""
    return like.new_empty(shape)


def _target(x: torch.Tensor, allow_tma: bool, variant: str):
    index = x.get_device()
    return index, current_stream(index), DTYPE_CODES[x.dtype], allow_tma, variant


# ----------------------------------------------------------------------------
# List layout: the tutorial's problem.


def _check_group(i: int, a, b, trans_b: bool, ref) -> None:
    check_tensor(a, f"As[{i}]", 2)
    check_tensor(b, f"Bs[{i}]", 2)
    check_same(a, f"As[{i}]", ref, "As[0]")
    check_same(b, f"Bs[{i}]", ref, "As[0]")
    check_unit_inner_stride(a, f"As[{i}]")
    check_unit_inner_stride(b, f"Bs[{i}]")
    b_k = b.shape[1] if trans_b else b.shape[0]
    if a.shape[1] != b_k:
        layout = "[N, K]" if trans_b else "[K, N]"
        raise ValueError(f"group {i}: As[{i}] is {tuple(a.shape)} ([M, K]) but Bs[{i}] is "
                         f"{tuple(b.shape)} ({layout}): K differs ({a.shape[1]} vs {b_k})")


LIST_FIELDS = 7  # per group: a, b, m, n, k, lda, ldb (csrc/ops.h ListProblem)


def _list_fields(As, Bs, trans_b: bool, dtype, device):
    """LIST_FIELDS ints per group, or None when some group fails a check.
    The hot loop of grouped_gemm: one cheap combined test per group;
    check_groups says what is wrong."""
    fields = []
    for a, b in zip(As, Bs):
        (m, k), (lda, a_inner) = a.shape, a.stride()
        (b_rows, b_cols), (ldb, b_inner) = b.shape, b.stride()
        n, b_k = (b_rows, b_cols) if trans_b else (b_cols, b_rows)
        if (a.dtype is not dtype or b.dtype is not dtype or a.get_device() != device
                or b.get_device() != device or k != b_k or (a_inner != 1 and k > 1)
                or (b_inner != 1 and b_cols > 1)):
            return None
        fields += (a.data_ptr(), b.data_ptr(), m, n, k, lda, ldb)
    return fields


def check_groups(As, Bs, trans_b: bool, ref) -> None:
    """The full checks, raising for the first bad group (off the hot path)."""
    for i, (a, b) in enumerate(zip(As, Bs)):
        _check_group(i, a, b, trans_b, ref)


_MIXED_N_ALIGN = 64  # elements: 128 bytes, so every C_g can take TMA stores


def _list_outputs(ms: list, ns: list, ref):
    """(Cs, base pointer, align): every C_g in one allocation, back to back,
    each starting at a multiple of `align` elements (run_list computes the
    same addresses).  One allocation instead of one per group; when every N is
    equal the C_g are row slices of one [sum M, N] tensor."""
    if ns.count(ns[0]) == len(ns):
        buffer = empty((sum(ms), ns[0]), ref)
        return list(buffer.split(ms)), buffer.data_ptr(), 1
    sizes = [-(-m * n // _MIXED_N_ALIGN) * _MIXED_N_ALIGN for m, n in zip(ms, ns)]
    buffer = empty((sum(sizes),), ref)
    Cs, offset = [], 0
    for m, n, size in zip(ms, ns, sizes):
        Cs.append(buffer.as_strided((m, n), (n, 1), offset))
        offset += size
    return Cs, buffer.data_ptr(), _MIXED_N_ALIGN


def grouped_gemm(As, Bs, trans_b: bool = False, allow_tma: bool = True, variant: str = ""):
    require(isinstance(As, (list, tuple)) and isinstance(Bs, (list, tuple)),
            "As and Bs must be lists of tensors", TypeError)
    require(len(As) == len(Bs), f"As has {len(As)} matrices but Bs has {len(Bs)}")
    if not As:
        return [], ""
    ref = As[0]
    check_tensor(ref, "As[0]", 2)
    try:
        fields = _list_fields(As, Bs, trans_b, ref.dtype, ref.get_device())
    except (AttributeError, TypeError, ValueError):  # not a tensor, not 2-D
        fields = None
    if fields is None:
        check_groups(As, Bs, trans_b, ref)
        raise AssertionError("the fast and the full group checks disagree")
    Cs, c_base, c_align = _list_outputs(fields[2::LIST_FIELDS], fields[3::LIST_FIELDS], ref)
    key = _C.run_list(*_target(ref, allow_tma, variant), trans_b, fields, c_base, c_align)
    return Cs, key


# ----------------------------------------------------------------------------
# MoE layout: torch._grouped_mm semantics with device-side offsets.


def _layout(x: torch.Tensor):
    """(x, transposed, ld) for the last two dims of x, read as [R, C]: row-major
    (element (r, c) at r * ld + c), or stored transposed (at c * ld + r).
    Copies only when neither dimension is contiguous."""
    rows, cols = x.shape[-2:]
    row_stride, col_stride = x.stride()[-2:]
    if cols <= 1 or col_stride == 1:
        return x, False, row_stride
    if rows <= 1 or row_stride == 1:
        return x, True, col_stride
    x = x.contiguous()
    return x, False, x.stride(-2)


def _row_major(x: torch.Tensor):
    """(x, ld) with unit inner stride, copying only when needed."""
    row_stride, col_stride = x.stride()[-2:]
    if col_stride != 1 and x.shape[-1] > 1:
        x = x.contiguous()
        row_stride = x.stride(-2)
    return x, row_stride


def ragged_m(a, b, offs, allow_tma: bool = True, variant: str = ""):
    """out[T, N]; rows offs[g-1]:offs[g] of a times b[g].  a [T, K], b [G, K, N]."""
    a, lda = _row_major(a)
    b, b_t, ldb = _layout(b)
    (rows, k), (groups, _, n) = a.shape, b.shape
    out = empty((rows, n), a)
    if groups == 0:
        return out.zero_(), ""
    key = _C.run_ragged_m(*_target(a, allow_tma, variant), b_t, a.data_ptr(), b.data_ptr(),
                          out.data_ptr(), offs.data_ptr(), rows, n, k, groups, lda,
                          b.stride(0), ldb, n)  # out is contiguous: ldc = N
    return out, key


def ragged_k(a, b, offs, allow_tma: bool = True, variant: str = ""):
    """out[G, M, N]; out[g] = a[:, rows of g] @ b[rows of g].  a [M, T], b [T, N]."""
    m, n, groups = a.shape[0], b.shape[1], offs.shape[0]
    a, a_t, lda = _layout(a)  # a_t: a transposed view of a row-major [T, M], as in dB
    b, ldb = _row_major(b)
    out = empty((groups, m, n), a)
    key = _C.run_ragged_k(*_target(a, allow_tma, variant), a_t, a.data_ptr(), b.data_ptr(),
                          out.data_ptr(), offs.data_ptr(), m, n, a.shape[1], groups, lda, ldb)
    return out, key


def _batch_offsets(groups: int, size: int, device) -> torch.Tensor:
    """[size, 2*size, ...]: built on the device, no host sync."""
    return torch.arange(1, groups + 1, dtype=torch.int32, device=device) * size


def batched(a, b, allow_tma: bool = True, variant: str = ""):
    """out[G, M, N] = a[g] @ b[g].  Mapped onto the ragged kernels without copies
    when a's batches are stacked rows ([G*M, K]) or stacked columns (a
    transposed view of [G, K, M], as in the backward pass)."""
    groups, m, k = a.shape
    n = b.shape[2]
    stacked_columns = (m > 1 and k > 1 and a.stride(1) == 1 and a.stride(0) == k * a.stride(2)
                       and b.is_contiguous())
    if stacked_columns:
        offs = _batch_offsets(groups, k, a.device)
        out, key = ragged_k(a.transpose(1, 2).reshape(groups * k, m).t(),
                            b.reshape(groups * k, n), offs, allow_tma, variant)
        return out, key
    if not (a.shape[-1] <= 1 or a.stride(-1) == 1) or a.stride(0) != m * a.stride(1):
        a = a.contiguous()
    offs = _batch_offsets(groups, m, a.device)
    out, key = ragged_m(a.reshape(groups * m, k), b, offs, allow_tma, variant)
    return out.view(groups, m, n), key


def _shapes(a, b) -> str:
    return f"a is {tuple(a.shape)} and b is {tuple(b.shape)}"


def check_grouped_mm(a, b, offs, out_dtype) -> tuple:
    """All checks of grouped_mm, shared by the real and the fake (meta)
    implementation.  Returns the case: (a.dim(), b.dim())."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise TypeError("a and b must be torch.Tensors")
    kind = (a.dim(), b.dim())
    if kind[0] not in (2, 3) or kind[1] not in (2, 3):
        raise ValueError(f"a and b must be 2-D or 3-D: {_shapes(a, b)}")
    check_tensor(a, "a", kind[0])
    check_tensor(b, "b", kind[1])
    check_same(b, "b", a, "a")
    check_out_dtype(out_dtype, a.dtype)
    if kind == (2, 3):
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"K differs: {_shapes(a, b)} (expected [T, K] and [G, K, N])")
        require(offs is not None, "offs is required when a is 2-D and b is 3-D (ragged M)")
        check_offsets(offs, "b", b.shape[0], a)
    elif kind == (2, 2):
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"T differs: {_shapes(a, b)} (expected [M, T] and [T, N])")
        require(offs is not None, "offs is required when a and b are 2-D (ragged K)")
        check_offsets(offs, "offs", offs.shape[0] if isinstance(offs, torch.Tensor) else 0, a)
    elif kind == (3, 3):
        require(offs is None, "offs must be None when a and b are 3-D (batched)")
        if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
            raise ValueError(f"G or K differs: {_shapes(a, b)} (expected [G, M, K] and [G, K, N])")
    else:
        raise ValueError(f"a 3-D and b 2-D is not a grouped_mm case ({_shapes(a, b)}); "
                         "use 2-D x 3-D for ragged M")
    return kind


def output_shape(a, b, offs) -> tuple:
    if a.dim() == 2 and b.dim() == 3:
        return (a.shape[0], b.shape[2])
    if a.dim() == 2:
        return (offs.shape[0], a.shape[0], b.shape[1])
    return (a.shape[0], a.shape[1], b.shape[2])


def _is_plain_ragged_m(a, b, offs, out_dtype) -> bool:
    """The MoE forward call, well formed: True only where check_grouped_mm
    passes with kind (2, 3).  One combined test on the hot path."""
    if not (type(a) is torch.Tensor and type(b) is torch.Tensor and type(offs) is torch.Tensor
            and out_dtype is None and a.dim() == 2 and b.dim() == 3 and offs.dim() == 1):
        return False
    device = a.get_device()
    return (a.dtype is b.dtype and a.dtype in DTYPE_CODES and offs.dtype is torch.int32
            and a.is_cuda and b.get_device() == device and offs.get_device() == device
            and a.shape[1] == b.shape[1] and offs.shape[0] == b.shape[0]
            and (offs.shape[0] <= 1 or offs.stride(0) == 1))


def grouped_mm(a, b, offs=None, out_dtype=None, allow_tma: bool = True, variant: str = ""):
    if _is_plain_ragged_m(a, b, offs, out_dtype):
        return ragged_m(a, b, offs, allow_tma, variant)
    kind = check_grouped_mm(a, b, offs, out_dtype)
    if kind == (2, 3):
        return ragged_m(a, b, offs, allow_tma, variant)
    if kind == (2, 2):
        return ragged_k(a, b, offs, allow_tma, variant)
    return batched(a, b, allow_tma, variant)
