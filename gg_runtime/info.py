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
    """What this build contains and which path the current device takes.

    The result is `{"build": {...}, "device": {...}}`:

    - `build`: `triton_version` (the Triton release that compiled the
      kernels), `archs` (`["sm80", "sm90"]` built in full), `dtypes` and `families` (the
      input dtypes and kernel families it has kernels for), `variants` (how
      many kernels).
    - `device`, torch's current CUDA device: `available`, `supported`
      (whether this wheel has kernels it runs) and, with a device, `index`,
      `name`, `capability` (major, minor), `sm_count`,
      `shared_per_block_optin` (bytes), `kernel_arch` (80, 90 or None) and
      `path`: `"cubin"`, `"ptx (compiled by the driver)"` (a GPU newer than
      the wheel's archs, or `force_ptx`) or `"unsupported"`; `reason` where
      it is not supported (also without a device).

    The command line prints the same: `gg-runtime info` (the default command;
    also `python -m gg_runtime`) as a table, `gg-runtime info --json` as one
    JSON object; `--help` on each; an unknown command or flag exits with
    status 2.

    Returns:
        The build's and the device's description, as above.
    """
    return {"build": build_info(), "device": device_info()}
