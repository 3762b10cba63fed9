"""grouped_mm with autograd: in eager mode a C++ autograd node (the torch
bridge) or an autograd.Function, and the torch.library custom op, with a fake
implementation, that torch.compile traces.  All run one backward: each
gradient is one more grouped_mm of a known case on transposed views (no
copies, no checks)."""
from __future__ import annotations

import sys
from typing import Optional

import torch

from . import _native, ragged
from .cases import Case, case_of, classify, empty_output


def stored_transposed(x) -> bool:
    """Whether x's last two dimensions are stored transposed (column-major
    matrices, as b = w.transpose(1, 2) for nn.Linear-style weights w)."""
    return x.shape[-1] > 1 and x.shape[-2] > 1 and x.stride(-2) == 1 and x.stride(-1) != 1


def input_gradient(x, left, right, offs, mm):
    """The gradient of input x, left @ right, in x's layout: where x is stored
    transposed it is computed as (right^T @ left^T)^T, so it comes back with
    x's strides and autograd need not copy it into x's layout (AccumulateGrad
    copies a gradient whose strides differ from its parameter's).  Every case
    writes its output row-major but ragged N (3-D x 2-D), which writes a
    transposed view: the four gradients made by a ragged-N product come back
    in the other layout (README, known gap)."""
    if stored_transposed(x):
        return mm(right.mT, left.mT, offs).mT
    return mm(left, right, offs)


def backward(a, b, offs, grad, need_a: bool, need_b: bool, mm):
    """(grad_a, grad_b) of grouped_mm(a, b, offs) for the output gradient grad:
    grad_a = grad @ b^T and grad_b = a^T @ grad as grouped products (ragged M's
    dB is ragged K, and so on), each on transposed views, no copies.
    mm(x, y, offs) computes one grouped_mm, its case told by the dimensions.
    A float32 gradient of a 16-bit product (out_dtype=float32) is rounded to
    the inputs' dtype first: the kernels take one input dtype."""
    grad = grad.to(a.dtype)
    grad_a = input_gradient(a, grad, b.mT, offs, mm) if need_a else None
    grad_b = input_gradient(b, a.mT, grad, offs, mm) if need_b else None
    return grad_a, grad_b


def _run(x, y, offs):
    return ragged.run(case_of(x, y), x, y, offs)


class GroupedMM(torch.autograd.Function):
    """Eager autograd for inputs classify() has checked."""

    @staticmethod
    def forward(ctx, case, a, b, offs, out_dtype):
        ctx.case = case
        ctx.save_for_backward(a, b, offs)
        return ragged.run(case, a, b, offs, out_dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        a, b, offs = ctx.saved_tensors
        grad_a, grad_b = backward(a, b, offs, grad, *ctx.needs_input_grad[1:3], _run)
        return None, grad_a, grad_b, None, None


# What Function.apply's Python wrapper does for GroupedMM's arguments, by hand:
# the generic wrapper took ~3.7 us of a ~23 us eager call with autograd on an
# H100 host (bench/RESULTS.md).  Under functorch transforms the wrapper runs.
_FUNCTION_APPLY = super(torch.autograd.Function, GroupedMM).apply
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


class _SavedContext:
    """What GroupedMM.backward reads of its ctx, for the bridge's C++ node."""
    __slots__ = ("case", "saved_tensors", "needs_input_grad")

    def __init__(self, case, saved_tensors, needs_input_grad):
        self.case, self.saved_tensors, self.needs_input_grad = case, saved_tensors, needs_input_grad


def _bridge_backward(case, a, b, offs, grad, need_a: bool, need_b: bool):
    """(grad_a, grad_b) for the bridge's node: GroupedMM.backward itself, so
    both nodes compute (and refuse double backward) alike."""
    ctx = _SavedContext(case, (a, b, offs), (False, need_a, need_b, False, False))
    return GroupedMM.backward(ctx, grad)[1:3]


# Cases whose forward returns a new tensor, not a view: the bridge's node is
# given to such outputs only (Function.apply handles views of its own).
_FRESH_OUTPUT = frozenset({Case.RAGGED_M, Case.RAGGED_K})


def _compiled_autograd_on() -> bool:
    """Whether compiled autograd is on (inside its context manager,
    torch._dynamo.compiled_autograd._enable): it traces every node of the
    backward, which GroupedMM's node allows and the bridge's C++ node does not."""
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    return module is not None and bool(getattr(module, "compiled_autograd_enabled", False))


def grouped_mm_with_autograd(case: Case, a, b, offs, out_dtype):
    """What GroupedMM.apply(case, a, b, offs, out_dtype) gives, without the
    wrapper's generic Python work where no functorch transform is active: a
    C++ node where the torch bridge is loaded, else the Function's C part."""
    if _transforms_active is None or _unwrap_if_dead is None or _transforms_active():
        return GroupedMM.apply(case, a, b, offs, out_dtype)
    if _native.bridge is not None and case in _FRESH_OUTPUT and not _compiled_autograd_on():
        out = _native.bridge.with_autograd(ragged.run, _bridge_backward, case, a, b, offs,
                                           out_dtype)
        if out is not None:
            return out
    offs = None if offs is None else _unwrap_if_dead(offs)
    return _FUNCTION_APPLY(case, _unwrap_if_dead(a), _unwrap_if_dead(b), offs, out_dtype)


@torch.library.custom_op("gg_runtime::grouped_mm", mutates_args=())
def grouped_mm_op(a: torch.Tensor, b: torch.Tensor, offs: Optional[torch.Tensor],
                  out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    # No device_types: a CPU tensor reaches classify() and gets its clear error.
    return ragged.run(classify(a, b, offs, out_dtype), a, b, offs, out_dtype)


@grouped_mm_op.register_fake
def _grouped_mm_fake(a, b, offs, out_dtype):
    return empty_output(classify(a, b, offs, out_dtype), a, b, offs, out_dtype)


def _setup_context(ctx, inputs, output):
    a, b, offs, _ = inputs
    ctx.save_for_backward(a, b, offs)


def _traced_mm(x, y, offs):
    # Gradients as calls of the op, so that compiled graphs keep them.
    return torch.ops.gg_runtime.grouped_mm(x, y, offs, None)


def _op_backward(ctx, grad):
    a, b, offs = ctx.saved_tensors
    grad_a, grad_b = backward(a, b, offs, grad, *ctx.needs_input_grad[:2], _traced_mm)
    return grad_a, grad_b, None, None


grouped_mm_op.register_autograd(_op_backward, setup_context=_setup_context)
