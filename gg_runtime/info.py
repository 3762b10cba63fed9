"""What this build contains and whether the current device can run it."""
from __future__ import annotations

import torch

from . import _C


def build_info() -> dict:
    variants = _C.variants()
    return {
        "triton_version": _C.triton_version(),
        "archs": sorted({f"sm{v['arch']}" for v in variants}),
        "dtypes": sorted({v["dtype"] for v in variants}),
        "families": sorted({v["family"] for v in variants}),
        "variants": len(variants),
    }


def device_info() -> dict:
    """The current CUDA device and whether this wheel has kernels for it."""
    if not torch.cuda.is_available():
        return {"available": False, "supported": False, "reason": "no CUDA device visible to torch"}
    index = torch.cuda.current_device()
    props = _C.device_info(index)  # with a "reason" where the wheel has no kernels for it
    props.update(available=True, index=index, supported=props["kernel_arch"] is not None)
    return props


def info() -> dict:
    """{'build': {...}, 'device': {...}}: see build_info() and device_info()."""
    return {"build": build_info(), "device": device_info()}
