"""What the fp8 modules (scaled.py, quantize.py) share: the element type, the
scale block, and the one rule for where their kernels exist."""
from __future__ import annotations

import contextlib

import torch

from . import _native

FP8 = torch.float8_e4m3fn
BLOCK = 128  # elements along each side of a scale block


def blocks(size: int) -> int:
    """Scale blocks covering `size` elements."""
    return -(-size // BLOCK)


@contextlib.contextmanager
def sm90_only():
    """A launch that finds no fp8 kernel for this GPU says why."""
    try:
        yield
    except _native.UnsupportedDeviceError as exc:
        raise _native.UnsupportedDeviceError(
            f"{exc} (fp8 kernels are built for compute capability 9.0, H100 and H200, only)"
        ) from None
