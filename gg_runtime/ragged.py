"""grouped_mm's launches, one per case, on inputs classify() has checked:
allocate the output, pick the layout, name the kernel's arguments.  No
validation and no autograd here."""
from __future__ import annotations

import torch

from . import _native
from .cases import Case

_RAGGED_M = _native.launcher("ragged_m")
_RAGGED_K = _native.launcher("ragged_k")


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
    """(x, ld) with unit inner stride, copying only when needed: ragged_k's
    operands, whose groups' K ranges must be ranges of whole rows (TMA zeroes
    rows past a group's end, not columns)."""
    row_stride, col_stride = x.stride()[-2:]
    if col_stride != 1 and x.shape[-1] > 1:
        x = x.contiguous()
        row_stride = x.stride(-2)
    return x, row_stride


def _tma_reads(x: torch.Tensor, ld: int) -> bool:
    """Whether sm90's kernels read x, whose groups' rows lie along its
    contiguous dimension, in place: TMA with a 16-byte aligned row stride and
    base.  Elsewhere element loads along that dimension, where groups start
    anywhere, ran 3.4x slower than copying x first (sm90's basic flavour) and
    1.2x slower (the sm80 path) on an H100 (bench/RESULTS.md), so x is copied."""
    return (ld * x.element_size() % 16 == 0 and x.data_ptr() % 16 == 0
            and _native.runs_tma(x.get_device()))


def _ragged_rows(a: torch.Tensor):
    """_layout of ragged_m's a [T, K]: stored [K, T] only where _tma_reads,
    else copied to row-major."""
    a, a_t, lda = _layout(a)
    if a_t and not _tma_reads(a, lda):
        a = a.contiguous()
        return a, False, a.stride(0)
    return a, a_t, lda


def ragged_m(a, b, offs, out_dtype=None, bias=None) -> torch.Tensor:
    """out[T, N]; rows offs[g-1]:offs[g] of a times b[g], plus bias[g] where
    given.  a [T, K], b [G, K, N], bias [G, N]."""
    out_dtype = out_dtype or a.dtype
    if _native.bridge is not None and bias is None:  # the same in C++, or None: run this
        out = _native.bridge.ragged_m(a, b, offs, out_dtype, *_native.target(a, out_dtype))
        if out is not None:
            return out
    a, a_t, lda = _ragged_rows(a)
    b, b_t, ldb = _layout(b)
    (rows, k), (groups, _, n) = a.shape, b.shape
    out = _native.empty((rows, n), a, out_dtype)
    if groups == 0:
        return out.zero_()
    layout = ("t" if a_t else "n") + ("t" if b_t else "n")  # aot/variants.py's names
    bias = None if bias is None else bias.contiguous()
    _RAGGED_M(layout, *_native.target(a, out_dtype),
              a_ptr=a.data_ptr(), b_ptr=b.data_ptr(), c_ptr=out.data_ptr(),
              offs_ptr=offs.data_ptr(), T=rows, N=n, K=k, G=groups,
              lda=lda, b_group_stride=b.stride(0), ldb=ldb, ldc=n, **bias_arguments(bias))
    return out


def bias_arguments(bias) -> dict:
    """The bias parameters of the ragged_m families for a contiguous bias or None."""
    if bias is None:
        return {"bias_ptr": 0, "has_bias": 0}  # never read
    return {"bias_ptr": bias.data_ptr(), "has_bias": 1}


def ragged_k(a, b, offs, out_dtype=None) -> torch.Tensor:
    """out[G, M, N]; out[g] = a[:, rows of g] @ b[rows of g].  a [M, T], b [T, N]."""
    out_dtype = out_dtype or a.dtype
    if _native.bridge is not None:  # the weight gradient's layout in C++, else None
        out = _native.bridge.ragged_k(a, b, offs, out_dtype, *_native.target(a, out_dtype))
        if out is not None:
            return out
    m, n, groups = a.shape[0], b.shape[1], offs.shape[0]
    b, ldb = _row_major(b)
    if a.stride(1) == 1 and a.stride(0) != 1 and _tma_reads(a, a.stride(0)):
        layout, lda = "nn", a.stride(0)  # row-major [M, T], read in place
    else:
        a_rows, lda = _row_major(a.t())  # [T, M]: no copy for dB's a = x^T
        layout, a = "tn", a_rows.t()
    out = _native.empty((groups, m, n), a, out_dtype)
    _RAGGED_K(layout, *_native.target(a, out.dtype),
              a_ptr=a.data_ptr(), b_ptr=b.data_ptr(), c_ptr=out.data_ptr(),
              offs_ptr=offs.data_ptr(), M=m, N=n, T=a.shape[1], G=groups,
              lda=lda, ldb=ldb, ldc=n)
    return out


def ragged_n(a, b, offs, out_dtype=None) -> torch.Tensor:
    """out[M, T]; columns offs[g-1]:offs[g] are a[g] @ b[:, those columns].
    a [G, M, K], b [K, T].  Computed as out^T = b^T (ragged rows) @ a[g]^T, one
    ragged_m on transposed views: the result is a transposed view of [T, M]."""
    return ragged_m(b.t(), a.transpose(1, 2), offs, out_dtype).t()


def batch_offsets(groups: int, size: int, device) -> torch.Tensor:
    """[size, 2*size, ...]: built on the device, no host sync."""
    return torch.arange(1, groups + 1, dtype=torch.int32, device=device) * size


def batched(a, b, offs=None, out_dtype=None, bias=None) -> torch.Tensor:
    """out[G, M, N] = a[g] @ b[g] (+ bias[g]; offs is None in this case).  Mapped
    onto the ragged kernels without copies when a's batches are stacked rows
    ([G*M, K]) or, without bias, stacked columns (a transposed view of [G, K, M],
    as in the backward)."""
    groups, m, k = a.shape
    n = b.shape[2]
    stacked_columns = (bias is None and m > 1 and k > 1 and a.stride(1) == 1
                       and a.stride(0) == k * a.stride(2) and b.is_contiguous())
    if stacked_columns:
        offs = batch_offsets(groups, k, a.device)
        return ragged_k(a.transpose(1, 2).reshape(groups * k, m).t(), b.reshape(groups * k, n),
                        offs, out_dtype)
    if not (a.shape[-1] <= 1 or a.stride(-1) == 1) or a.stride(0) != m * a.stride(1):
        a = a.contiguous()
    offs = batch_offsets(groups, m, a.device)
    return ragged_m(a.reshape(groups * m, k), b, offs, out_dtype, bias).view(groups, m, n)


_LAUNCH = {Case.RAGGED_M: ragged_m, Case.RAGGED_K: ragged_k, Case.RAGGED_N: ragged_n,
           Case.BATCHED: batched}


def run(case: Case, a, b, offs, out_dtype=None, bias=None) -> torch.Tensor:
    """grouped_mm of checked inputs of this case; out_dtype None: a's dtype.
    bias only where classify() allowed it (ragged M, batched)."""
    if bias is None:
        return _LAUNCH[case](a, b, offs, out_dtype)
    return _LAUNCH[case](a, b, offs, out_dtype, bias)
