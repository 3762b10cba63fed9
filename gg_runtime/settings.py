"""Process-wide settings of the runtime, each also an environment variable
read once at import (this module is its one reader)."""
from __future__ import annotations

import os

from . import _C

FORCE_PTX_VARIABLE = "GG_RUNTIME_FORCE_PTX"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def force_ptx(on: bool = True) -> None:
    """Run the kernels compiled by the driver from the PTX in the wheel (the
    sm80 variants) on every GPU of compute capability 8.0 or later, even where
    a cubin would run: how an H100 tests the path that GPUs newer than this
    wheel take.  The driver compiles each kernel on its first use and caches
    the result.  `on` must be a bool.  Same as the environment variable
    GG_RUNTIME_FORCE_PTX at import (1/true/yes/on, or 0/false/no/off/unset,
    any case); `info()["device"]["path"]` says which path the current device takes."""
    if not isinstance(on, bool):
        raise TypeError(f"force_ptx: on must be a bool, not {type(on).__name__} ({on!r})")
    _C.set_force_ptx(on)


def _force_ptx_from_environment() -> bool:
    value = os.environ.get(FORCE_PTX_VARIABLE, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"{FORCE_PTX_VARIABLE}={os.environ[FORCE_PTX_VARIABLE]!r}: expected one "
                         f"of {', '.join(_TRUE)} (on) or {', '.join(v for v in _FALSE if v)} or "
                         "unset (off)")
    return value in _TRUE


force_ptx(_force_ptx_from_environment())
