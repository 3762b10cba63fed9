"""Test-only settings, kept off the hot-path signatures: force one compiled
variant (by key) or the `basic` flavour, and see which variant ran."""
from __future__ import annotations

from contextlib import contextmanager

from . import _C


@contextmanager
def forced(variant: str = "", allow_tma: bool = True):
    """Within the block every launch runs exactly `variant` (an error if it
    cannot run the call), or with allow_tma=False only `basic` variants.
    Process-wide: not for concurrent use."""
    _C.set_override(variant, allow_tma)
    try:
        yield
    finally:
        _C.set_override("", True)


def last_variant() -> str:
    """Key of the variant this thread's last launch ran ('' if it launched nothing)."""
    return _C.last_variant()
