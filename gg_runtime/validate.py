"""Input checks run before anything launches.  Every message names the
argument (and group), what was expected and what was given."""
from __future__ import annotations

import torch

from ._native import DTYPE_CODES

SUPPORTED_DTYPES = tuple(DTYPE_CODES)


def require(condition: bool, message: str, error=ValueError) -> None:
    if not condition:
        raise error(message)


def check_tensor(x, name: str, ndim: int) -> None:
    require(isinstance(x, torch.Tensor), f"{name} must be a torch.Tensor, got {type(x).__name__}",
            TypeError)
    require(x.dim() == ndim, f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    require(x.dtype in SUPPORTED_DTYPES,
            f"{name} must be float16 or bfloat16, got {x.dtype}", TypeError)
    require(x.is_cuda, f"{name} must be on a CUDA device, got {x.device}")


def check_same(x, name: str, ref, ref_name: str) -> None:
    require(x.dtype == ref.dtype, f"{name} has dtype {x.dtype} but {ref_name} has {ref.dtype}",
            TypeError)
    require(x.device == ref.device, f"{name} is on {x.device} but {ref_name} is on {ref.device}")


def check_unit_inner_stride(x, name: str) -> None:
    """The last dimension must be contiguous (a size-1 dimension has no stride to speak of)."""
    require(x.shape[-1] <= 1 or x.stride(-1) == 1,
            f"{name} must have unit stride in its last dimension, got strides {tuple(x.stride())} "
            f"for shape {tuple(x.shape)} (call .contiguous())")


def check_offsets(offs, groups_name: str, groups: int, device) -> None:
    require(isinstance(offs, torch.Tensor), f"offs must be a torch.Tensor, got {type(offs).__name__}",
            TypeError)
    require(offs.dtype == torch.int32, f"offs must be int32, got {offs.dtype}", TypeError)
    require(offs.dim() == 1, f"offs must be 1-D, got shape {tuple(offs.shape)}")
    require(offs.device == device, f"offs is on {offs.device} but the inputs are on {device}")
    require(offs.shape[0] == groups,
            f"offs has {offs.shape[0]} entries but {groups_name} has {groups} groups")
    require(offs.shape[0] <= 1 or offs.stride(0) == 1, "offs must be contiguous")


def check_out_dtype(out_dtype, dtype) -> None:
    require(out_dtype is None or out_dtype == dtype,
            f"out_dtype={out_dtype} is not supported: the output has the inputs' dtype ({dtype})",
            TypeError)
