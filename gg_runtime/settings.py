"""Process-wide settings of the runtime, each also an environment variable
read once at import (this module is its one reader)."""
from __future__ import annotations

import os

from . import _C

FORCE_PTX_VARIABLE = "GG_RUNTIME_FORCE_PTX"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def force_ptx(on: bool = True) -> None:
    """Run the driver-compiled sm80 PTX on every GPU of compute capability 8.0 or later.

    The wheel ships the sm80 variants' PTX as well as their cubins: a GPU
    newer than the wheel's archs (B200, RTX 50xx, ...) runs that PTX, compiled
    by the driver on each kernel's first use and cached by it.  With this
    setting on, every GPU >= 8.0 takes that path, even where a cubin would
    run: how an H100 tests it (`make test` runs the GPU tests a second time
    so).  `info()["device"]["path"]` says which path the current device
    takes.  Process-wide.

    The environment variable `GG_RUNTIME_FORCE_PTX`, read once at import, sets
    it too: `1`, `true`, `yes` or `on` (any case) turn it on; `0`, `false`,
    `no`, `off`, empty or unset leave it off; anything else is a `ValueError`
    at import.

    Args:
        on: whether to take the PTX path, a bool.

    Raises:
        TypeError: on is not a bool.
    """
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
