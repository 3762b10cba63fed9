"""scaled_grouped_mm: fp8 (e4m3) grouped GEMM with float32 scales, rowwise or
per 128-block (the scaled_ragged_m kernel family).  Checks, then one launch."""
from __future__ import annotations

from typing import Optional

import torch

from . import _native, ragged
from .fp8 import FP8, blocks, sm90_only
from .validate import (check_bias, check_companion, check_offsets, check_same, check_tensor,
                       check_tensors, require)

_LAUNCH = _native.launcher("scaled_ragged_m")
OUT_DTYPES = (torch.bfloat16, torch.float32)
_ALIGN = 16  # bytes: TMA's rule for bases and strides, which torch also sets for fp8


def _check_scale(scale, name: str, shape: tuple, a) -> None:
    check_companion(scale, name, shape, torch.float32, a, "float32", "for these inputs")


def _granularity(a, scale_a) -> str:
    """rowwise: one scale per row of a; blockwise: one per row and 128-wide K block."""
    dims = scale_a.dim() if isinstance(scale_a, torch.Tensor) else -1
    if dims == a.dim() - 1:
        return "rowwise"
    if dims == a.dim():
        return "blockwise"
    raise ValueError(f"scale_a must be {a.dim() - 1}-D (rowwise) or {a.dim()}-D (per 1x128 "
                     f"block) for a {a.dim()}-D mat_a, got shape "
                     f"{tuple(getattr(scale_a, 'shape', ()))}")


def _scale_shapes(granularity: str, groups: int, rows: tuple, n: int, k: int) -> tuple:
    """(scale_a's, scale_b's) shape; rows: a's leading dimensions."""
    if granularity == "rowwise":
        return rows, (groups, n)
    return rows + (blocks(k),), (groups, blocks(n), blocks(k))


def _check_layouts(a, b) -> None:
    """a row-major, b K-major, every stride 16-byte aligned.  (Every call runs
    this: messages are formatted only on failure.)"""
    k, n = b.shape[-2:]
    if a.stride(-1) != 1 and k > 1:
        raise ValueError("mat_a must be row-major (unit stride in its last dimension), got "
                         f"strides {tuple(a.stride())}")
    if b.stride(-2) != 1 and k > 1:
        raise ValueError("mat_b must be K-major: [G, K, N] as a transposed view of a [G, N, K] "
                         "tensor (fp8 tensor cores read both operands K-major), got strides "
                         f"{tuple(b.stride())} for shape {tuple(b.shape)}; pass "
                         "w.transpose(-2, -1) of the [G, N, K] weight")
    if k % _ALIGN or n % _ALIGN:
        raise ValueError(f"fp8 needs K and N to be multiples of {_ALIGN} (16-byte rows), got "
                         f"K={k}, N={n}")
    if k and (a.stride(-2) % _ALIGN or b.stride(0) % _ALIGN or b.stride(-1) % _ALIGN):
        raise ValueError(f"fp8 inputs need row strides that are multiples of {_ALIGN} elements, "
                         f"got mat_a strides {tuple(a.stride())}, mat_b strides "
                         f"{tuple(b.stride())}")


def _check_scale_result(scale_result, a) -> None:
    if scale_result is None:
        return
    if not isinstance(scale_result, torch.Tensor):
        raise TypeError(f"scale_result must be a torch.Tensor or None, got "
                        f"{type(scale_result).__name__}")
    if scale_result.dtype != torch.float32 or scale_result.numel() != 1:
        raise ValueError(f"scale_result must be one float32 value, got {scale_result.dtype} of "
                         f"shape {tuple(scale_result.shape)}")
    if scale_result.get_device() != a.get_device():
        raise ValueError(f"scale_result is on {scale_result.device} but mat_a is on {a.device}")


def _check(a, b, scale_a, scale_b, offs, bias, scale_result, out_dtype, use_fast_accum) -> str:
    """Every check of scaled_grouped_mm's inputs; returns the granularity."""
    check_tensors(a, b)
    if (a.dim(), b.dim()) not in ((2, 3), (3, 3)):
        raise ValueError("scaled_grouped_mm takes mat_a [T, K] with mat_b [G, K, N] and offs, or "
                         f"mat_a [G, M, K] with mat_b [G, K, N]; got mat_a {tuple(a.shape)}, "
                         f"mat_b {tuple(b.shape)} (fp8 weight gradients, 2-D x 2-D, are not "
                         "supported)")
    check_tensor(a, "mat_a", a.dim(), (FP8,))
    check_tensor(b, "mat_b", 3, (FP8,))
    check_same(b, "mat_b", a, "mat_a")
    groups, k, n = b.shape
    if a.shape[-1] != k or (a.dim() == 3 and a.shape[0] != groups):
        raise ValueError(f"mat_a is {tuple(a.shape)} and mat_b is {tuple(b.shape)}: expected "
                         "mat_a [T, K] or [G, M, K] with mat_b [G, K, N]")
    if a.dim() == 2:
        require(offs is not None, "offs is required when mat_a is 2-D")
        check_offsets(offs, "mat_b", groups, a)
    else:
        require(offs is None, "offs must be None when mat_a is 3-D")
    if not isinstance(use_fast_accum, bool):
        raise TypeError(f"use_fast_accum must be a bool, got {type(use_fast_accum).__name__}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    granularity = _granularity(a, scale_a)
    shape_a, shape_b = _scale_shapes(granularity, groups, tuple(a.shape[:-1]), n, k)
    _check_scale(scale_a, "scale_a", shape_a, a)
    _check_scale(scale_b, "scale_b", shape_b, a)
    _check_scale_result(scale_result, a)
    if bias is not None:
        check_bias(bias, (groups, n), out_dtype, a)
    _check_layouts(a, b)
    if torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in (a, b, scale_a, scale_b, bias,
                                                        scale_result)):
        raise RuntimeError("scaled_grouped_mm is not differentiable: fp8 training is not "
                           "supported (run it under torch.no_grad() or detach the inputs)")
    return granularity


def _launch(layout, a, b, scale_a, scale_b, offs, bias, out_dtype) -> torch.Tensor:
    """out[T, N] of a [T, K] (row-major), b [G, K, N] (K-major), int32 end
    offsets, bias [G, N] contiguous or None; layout: the family's (granularity,
    '_fast' for fast accumulation)."""
    (rows, k), (groups, _, n) = a.shape, b.shape
    if a.data_ptr() % _ALIGN or b.data_ptr() % _ALIGN:
        raise ValueError("fp8 inputs need 16-byte aligned data pointers (a view starting at an "
                         f"offset that is not a multiple of {_ALIGN} elements is not): call "
                         ".contiguous()")
    if k == 0 and bias is not None:  # an empty product plus bias: ragged_m's 16-bit kernels
        empty = torch.bfloat16
        return ragged.ragged_m(a.new_empty((rows, 0), dtype=empty),
                               b.new_empty((groups, 0, n), dtype=empty), offs, out_dtype, bias)
    out = _native.empty((rows, n), a, out_dtype)
    if groups == 0 or k == 0:  # nothing to multiply: the product is zero
        return out.zero_()
    with sm90_only():
        _LAUNCH(layout, *_native.target(a, out.dtype),
                a_ptr=a.data_ptr(), b_ptr=b.data_ptr(), c_ptr=out.data_ptr(),
                offs_ptr=offs.data_ptr(), scale_a_ptr=scale_a.data_ptr(),
                scale_b_ptr=scale_b.data_ptr(), T=rows, N=n, K=k, G=groups,
                lda=a.stride(0), b_group_stride=b.stride(0), ldb=b.stride(2), ldc=n,
                **ragged.bias_arguments(bias))
    return out


def _output_shape(a, b) -> tuple:
    return (*a.shape[:-1], b.shape[2])


def scaled_grouped_mm(a, b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                      out_dtype=torch.bfloat16, use_fast_accum=False):
    """See gg_runtime.api.scaled_grouped_mm (out_dtype None: bfloat16, as torch)."""
    out_dtype = out_dtype or torch.bfloat16
    granularity = _check(a, b, scale_a, scale_b, offs, bias, scale_result, out_dtype,
                         use_fast_accum)
    layout = granularity + ("_fast" if use_fast_accum else "")
    if scale_result is not None:
        scale_a = scale_a * scale_result.reshape(())
    scale_a, scale_b = scale_a.contiguous(), scale_b.contiguous()
    bias = None if bias is None else bias.contiguous()
    if a.dim() == 2:
        return _launch(layout, a, b, scale_a, scale_b, offs, bias, out_dtype)
    groups, m, k = a.shape
    if a.stride(0) != m * a.stride(1):  # batches not stacked rows: one copy makes them so
        a = a.contiguous()
    offs = ragged.batch_offsets(groups, m, a.device)
    flat_scale_a = scale_a.reshape(groups * m, *scale_a.shape[2:])
    out = _launch(layout, a.reshape(groups * m, k), b, flat_scale_a, scale_b, offs, bias,
                  out_dtype)
    return out.view(_output_shape(a, b))


@torch.library.custom_op("gg_runtime::scaled_grouped_mm", mutates_args=())
def scaled_grouped_mm_op(mat_a: torch.Tensor, mat_b: torch.Tensor, scale_a: torch.Tensor,
                         scale_b: torch.Tensor, offs: Optional[torch.Tensor],
                         bias: Optional[torch.Tensor], scale_result: Optional[torch.Tensor],
                         out_dtype: Optional[torch.dtype], use_fast_accum: bool) -> torch.Tensor:
    """What torch.compile traces (not differentiable, as the eager function)."""
    return scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype,
                             use_fast_accum)


@scaled_grouped_mm_op.register_fake
def _scaled_grouped_mm_fake(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype,
                            use_fast_accum):
    out_dtype = out_dtype or torch.bfloat16
    _check(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype, use_fast_accum)
    return mat_a.new_empty(_output_shape(mat_a, mat_b), dtype=out_dtype)
