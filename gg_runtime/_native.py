"""The compiled extension, its kernel folder, and the small facts the Python
layer passes to it: dtype codes (from the generated tables), the caller's
device and stream.  Every output tensor is allocated through `empty`."""
from __future__ import annotations

from pathlib import Path

import torch

from . import _C

KERNEL_DIR = Path(__file__).parent / "_kernels"
_C.set_kernel_dir(str(KERNEL_DIR))

# torch dtype -> the code _C.launch takes; the build's dtype list is the only owner.
DTYPE_CODES = {getattr(torch, name): code for code, name in enumerate(_C.dtypes())}

CudaError = _C.CudaError
UnsupportedDeviceError = _C.UnsupportedDeviceError
launch = _C.launch  # launch(family, layout, device, stream, dtype_code, **arguments)


def _stream_getter():
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw  # a plain int, without building a torch.cuda.Stream object
    return lambda index: torch.cuda.current_stream(index).cuda_stream


current_stream = _stream_getter()


def target(x: torch.Tensor) -> tuple:
    """(device, stream, dtype code) of a call whose inputs are like x."""
    index = x.get_device()
    return index, current_stream(index), DTYPE_CODES[x.dtype]


def empty(shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """Every output is allocated here (tests replace it to poison outputs)."""
    return like.new_empty(shape)
