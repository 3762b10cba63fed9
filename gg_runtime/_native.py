"""The compiled extension, its kernel folder, and the small facts the Python
layer passes to it (dtype codes, the caller's stream)."""
from __future__ import annotations

from pathlib import Path

import torch

from . import _C

KERNEL_DIR = Path(__file__).parent / "_kernels"
_C.set_kernel_dir(str(KERNEL_DIR))

# Must match gg::DType (csrc/registry.h).
DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1}

CudaError = _C.CudaError
UnsupportedDeviceError = _C.UnsupportedDeviceError


def _stream_getter():
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw  # a plain int, without building a torch.cuda.Stream object
    return lambda index: torch.cuda.current_stream(index).cuda_stream


current_stream = _stream_getter()
