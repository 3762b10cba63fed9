"""The runtime's test hooks (process-wide, not for concurrent use): force a
variant, read the variant a launch ran, poison the outputs, guard them."""
from __future__ import annotations

import contextlib

from .. import _C, _ops


@contextlib.contextmanager
def forced(variant: str = "", basic: bool = False):
    """Within the block every launch of `variant`'s family runs exactly
    `variant` (an error if it cannot run the call; the other families
    dispatch as usual: a fused operator's one kernel can be chosen), or with
    basic=True every launch runs only `basic` variants.  A key this build
    lacks raises ValueError on entry."""
    _C.set_override(variant, basic)
    try:
        yield
    finally:
        _C.set_override("", False)


def last_variant() -> str:
    """Key of the variant this thread's last launch ran ('' if it launched nothing)."""
    return _C.last_variant()


@contextlib.contextmanager
def poisoned():
    """Within the block every output the operators allocate starts as NaN, so
    elements a kernel fails to write show."""
    _ops.set_poison(True)
    try:
        yield
    finally:
        _ops.set_poison(False)


@contextlib.contextmanager
def guarded():
    """Within the block every output and scratch tensor the operators allocate
    lies between two guard regions filled with a canary byte (each a block
    of its own, kept until the check); leaving the block checks them
    (synchronizing) and raises AssertionError naming each tensor whose guards
    a kernel overwrote: a write out of bounds, seen without a sanitizer.  Not
    for CUDA-graph capture: the guards' fills would be captured, not run."""
    _ops.set_guards(True)
    try:
        yield
    finally:
        _ops.set_guards(False)
        damaged = _ops.guard_report()
    if damaged:
        raise AssertionError("writes outside gg_runtime's tensors: " + "; ".join(damaged))
