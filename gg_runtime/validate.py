"""Input checks run before anything launches.  Every message names the
argument (and group), what was expected and what was given.  Messages are
only formatted on failure: these checks run on every call."""
from __future__ import annotations

import torch


def require(condition: bool, message: str, error=ValueError) -> None:
    """For checks off the hot path (the message is built by the caller)."""
    if not condition:
        raise error(message)


def check_tensors(a, b) -> None:
    """The two operands are tensors (before anything else reads them)."""
    for x, name in ((a, "mat_a"), (b, "mat_b")):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_tensor(x, name: str, ndim: int, dtypes: tuple) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must be {names}, got {x.dtype}")
    if not (x.is_cuda or x.is_meta):  # meta tensors: shapes only (the op's fake kernel)
        raise ValueError(f"{name} must be on a CUDA device, got {x.device} (gg_runtime has "
                         "no CPU kernels)")


def check_same(x, name: str, ref, ref_name: str) -> None:
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but {ref_name} has {ref.dtype}")
    if x.get_device() != ref.get_device():  # an int: cheaper than comparing torch.device
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}")


def check_unit_inner_stride(x, name: str) -> None:
    """The last dimension must be contiguous (a size-1 dimension has no stride to speak of)."""
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        raise ValueError(f"{name} must have unit stride in its last dimension, got strides "
                         f"{tuple(x.stride())} for shape {tuple(x.shape)} (call .contiguous())")


def check_offsets(offs, groups_name: str, groups: int, like) -> None:
    if not isinstance(offs, torch.Tensor):
        raise TypeError(f"offs must be a torch.Tensor, got {type(offs).__name__}")
    if offs.dtype != torch.int32:
        raise TypeError(f"offs must be int32, got {offs.dtype}")
    if offs.dim() != 1:
        raise ValueError(f"offs must be 1-D, got shape {tuple(offs.shape)}")
    if offs.get_device() != like.get_device():
        raise ValueError(f"offs is on {offs.device} but the inputs are on {like.device}")
    if offs.shape[0] != groups:
        raise ValueError(f"offs has {offs.shape[0]} entries but {groups_name} has {groups} groups")
    if offs.shape[0] > 1 and offs.stride(0) != 1:
        raise ValueError("offs must be contiguous")


def check_out_dtype(out_dtype, dtype) -> None:
    """None (the inputs' dtype), the inputs' dtype, or float32."""
    if out_dtype is not None and out_dtype != dtype and out_dtype != torch.float32:
        raise TypeError(f"out_dtype={out_dtype} is not supported: give None, the inputs' dtype "
                        f"({dtype}) or torch.float32")


def check_companion(x, name: str, shape: tuple, dtype, like, dtype_text: str,
                    shape_text: str) -> None:
    """A tensor that goes with the operands (a scale, a bias): of `dtype`
    (dtype_text names it), on like's (mat_a's) device, of `shape` (shape_text
    says why)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must be {dtype_text}, got {x.dtype}")
    if x.get_device() != like.get_device():
        raise ValueError(f"{name} is on {x.device} but mat_a is on {like.device}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} {shape_text}, got {tuple(x.shape)}")


def check_bias(bias, shape: tuple, dtype, like) -> None:
    """A per-group bias [G, N] of the output's dtype."""
    check_companion(bias, "bias", shape, dtype, like, f"of the output's dtype ({dtype})",
                    "(one row of N values per group)")
