"""Settings of the runtime: process-wide ones, each also an environment
variable read once at import (this module is its one reader), and the
calling thread's SM limit."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

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


@contextlib.contextmanager
def sm_limit(sms: int) -> Iterator[None]:
    """Within it, this thread's gg_runtime kernels launch at most `sms` SMs' worth of programs.

    Every gg_runtime kernel is persistent: its grid is the programs the GPU
    holds at once, each looping over the output's tiles.  Under a limit the
    grid is that share of them (programs per SM times `sms`, at least one),
    so that work on another stream, a transfer between GPUs for instance,
    finds room while these kernels run and runs beside them rather than
    after them.  It is a share of the programs, not a set of SMs: the GPU
    places them where it finds room, so a kernel running alone spreads
    them over more than `sms` SMs.  To hold work to a set of SMs, launch it
    on a stream of a CUDA green context (`torch.cuda.green_contexts`).  The
    results are the same; a kernel with fewer programs than it has tiles
    takes longer.  Only this thread's launches are limited (not torch's
    kernels, nor an autograd backward, which runs on autograd's own
    threads); limits nest, the innermost holds.

    Args:
        sms: the most SMs, an int >= 0; 0 (or the device's count or more)
            lifts the limit.

    Raises:
        TypeError: sms is not an int.
        ValueError: sms is negative.
    """
    if not isinstance(sms, int) or isinstance(sms, bool):
        raise TypeError(f"sm_limit: sms must be an int, not {type(sms).__name__} ({sms!r})")
    if sms < 0:
        raise ValueError(f"sm_limit: sms must be >= 0, got {sms}")
    before = _C.sm_limit()
    _C.set_sm_limit(sms)
    try:
        yield
    finally:
        _C.set_sm_limit(before)
