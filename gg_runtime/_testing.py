"""Test-only settings, kept off the hot-path signatures: force one compiled
variant (by key) or the `basic` flavour, see which variant ran, run the
Python twins of the torch bridge."""
from __future__ import annotations

from contextlib import contextmanager

from . import _C, _native


@contextmanager
def forced(variant: str = "", basic: bool = False):
    """Within the block every launch runs exactly `variant` (an error if it
    cannot run the call), or with basic=True only `basic` variants.
    Process-wide: not for concurrent use."""
    _C.set_override(variant, basic)
    try:
        yield
    finally:
        _C.set_override("", False)


def last_variant() -> str:
    """Key of the variant this thread's last launch ran ('' if it launched nothing)."""
    return _C.last_variant()


@contextmanager
def python_host_path():
    """Within the block tensors are read in Python (the twins that run where
    gg_runtime._torch_C is not loaded), bridge or not.  Process-wide."""
    bridge, _native.bridge = _native.bridge, None
    try:
        yield
    finally:
        _native.bridge = bridge
