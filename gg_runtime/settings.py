"""Process-wide settings of the runtime (each also an environment variable)."""
from __future__ import annotations

from . import _C


def force_ptx(on: bool = True) -> None:
    """Run the kernels compiled by the driver from the PTX in the wheel (the
    sm80 variants) on every GPU of compute capability 8.0 or later, even where
    a cubin would run: how an H100 tests the path that GPUs newer than this
    wheel take.  The driver compiles each kernel on its first use and caches
    the result.  Same as the environment variable GG_RUNTIME_FORCE_PTX=1 at
    import; `info()["device"]["path"]` says which path the current device takes."""
    _C.set_force_ptx(bool(on))
