"""Test-only settings, kept off the hot-path signatures: force one compiled
variant (by key) or the `basic` flavour, see which variant ran, poison every
output."""
from __future__ import annotations

from contextlib import contextmanager

from . import _C, _ops


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
def poisoned():
    """Within the block every output the operators allocate starts as NaN, so
    elements a kernel fails to write show.  Process-wide."""
    _ops.set_poison(True)
    try:
        yield
    finally:
        _ops.set_poison(False)
