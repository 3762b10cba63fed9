"""quantize_fp8: float16 / bfloat16 / float32 -> float8_e4m3fn with float32
scales (the quantize_fp8 kernel family), the inputs of scaled_grouped_mm in one
call each.  Checks, allocation, one launch."""
from __future__ import annotations

import torch

from . import _native
from .fp8 import FP8, blocks, sm90_only
from .validate import check_tensor

_LAUNCH = _native.launcher("quantize_fp8")
DTYPES = _native.family_dtypes("quantize_fp8")
GRANULARITIES = ("rowwise", "1x128", "128x128")  # the family's layouts
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-12  # an all-zero block's amax: scale 1e-12 / 448, q = 0


def _check(x, granularity) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, got "
                         f"{granularity!r}")
    if x.dim() not in (2, 3):
        raise ValueError("x must be 2-D [T, K] (activations) or 3-D [G, N, K] (weights), got "
                         f"shape {tuple(x.shape)}")
    check_tensor(x, "x", x.dim(), DTYPES)


def _scale_shape(granularity: str, shape: tuple) -> tuple:
    """The scales of x of this shape: per row, per row and 128 columns, or per
    128 x 128 block of each group's [N, K]."""
    *groups, rows, cols = shape
    if granularity == "rowwise":
        return (*groups, rows)
    if granularity == "1x128":
        return (*groups, rows, blocks(cols))
    return (*groups, blocks(rows), blocks(cols))


def _rows(x: torch.Tensor) -> tuple:
    """(x as [R, C] with unit inner stride, its row stride), groups stacked;
    copies only where no such view exists."""
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        x = x.contiguous()
    flat = x.reshape(-1, x.shape[-1])  # a copy when 3-D groups are not stacked rows
    # A single row's stride is arbitrary: C keeps the aligned flavour's rule.
    return flat, flat.stride(0) if flat.shape[0] > 1 else flat.shape[1]


def _launch(granularity: str, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    flat, ld = _rows(x)
    device = x.get_device()
    with sm90_only():
        # Input codes straight from the table: _native.target would map float32
        # to tf32 where torch allows TF32 matmuls, a distinction without meaning here.
        _LAUNCH(granularity, device, _native.current_stream(device),
                _native.DTYPE_CODES[x.dtype], _native.DTYPE_CODES[FP8],
                x_ptr=flat.data_ptr(), q_ptr=q.data_ptr(), scale_ptr=scale.data_ptr(),
                R=flat.shape[0], C=flat.shape[1], group_rows=x.shape[-2], ldx=ld)


def quantize_fp8(x, granularity: str = "rowwise") -> tuple:
    """(q, scale) with x ~ q * scale, torch._scaled_grouped_mm's convention:
    scale = max(amax(|x|) over the elements it covers, 1e-12) / 448 and
    q = x / scale clamped to [-448, 448] (saturating), rounded to nearest even
    float8_e4m3fn; an all-zero block gives q = 0.  Exactly what float32 torch
    computes by these formulas on CUDA.

    x is [T, K] (activations) or [G, N, K] (weights, group by group): float16,
    bfloat16 or float32 on a CUDA device, any strides (a last dimension without
    unit stride is copied first).  granularity and the scale it gives:
    - "rowwise": [T] or [G, N], one per row;
    - "1x128": [T, ceil(K/128)] or [G, N, ceil(K/128)], per row and 128 columns;
    - "128x128": [ceil(T/128), ceil(K/128)] or [G, ceil(N/128), ceil(K/128)],
      per 128 x 128 block, no block spanning two groups.
    q is contiguous, of x's shape.  One launch, no host sync; not
    differentiable.  sm90 (H100, H200) only, as the fp8 GEMMs.
    """
    _check(x, granularity)
    q = _native.empty(tuple(x.shape), x, FP8)
    scale = _native.empty(_scale_shape(granularity, tuple(x.shape)), x, torch.float32)
    if q.numel() > 0:
        _launch(granularity, x, q, scale)
    elif scale.numel() > 0:  # rowwise scales of empty rows: an all-zero row's
        scale.fill_(AMAX_FLOOR).div_(E4M3_MAX)
    return q, scale
