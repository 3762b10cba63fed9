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


def bias_gradient(grad, offs, mm):
    """[G, N]: the sum of each group's rows of grad, in grad's dtype.  Batched
    (3-D grad): over M.  Ragged M: a ragged-K product of a row of ones with
    grad, so the kernels' reading of offs decides which rows a group has.
    The row of ones is a transposed view (of [T, 8]): the weight gradient's
    layout, with a 16-byte row stride."""
    if grad.dim() == 3:
        return grad.sum(1)
    ones = grad.new_ones(grad.shape[0], 8).t()[:1]
    return mm(ones, grad, offs)[:, 0]


def backward(a, b, offs, grad, need_a: bool, need_b: bool, mm, need_bias: bool):
    """(grad_a, grad_b, grad_bias) of grouped_mm(a, b, offs, bias) for the
    output gradient grad: grad_a = grad @ b^T and grad_b = a^T @ grad as
    grouped products (ragged M's dB is ragged K, and so on), each on
    transposed views, no copies; grad_bias as bias_gradient.
    mm(x, y, offs) computes one grouped_mm, its case told by the dimensions.
    A float32 gradient of a 16-bit product (out_dtype=float32) is rounded to
    the inputs' dtype for grad_a and grad_b: the kernels take one input dtype."""
    grad_bias = bias_gradient(grad, offs, mm) if need_bias else None
    grad = grad.to(a.dtype)
    grad_a = input_gradient(a, grad, b.mT, offs, mm) if need_a else None
    grad_b = input_gradient(b, a.mT, grad, offs, mm) if need_b else None
    return grad_a, grad_b, grad_bias


def _run(x, y, offs):
    return ragged.run(case_of(x, y), x, y, offs)


class GroupedMM(torch.autograd.Function):
    """Eager autograd for inputs classify() has checked."""

    @staticmethod
    def forward(ctx, case, a, b, offs, bias, out_dtype):
        ctx.case = case
        ctx.save_for_backward(a, b, offs)
        return ragged.run(case, a, b, offs, out_dtype, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        a, b, offs = ctx.saved_tensors
        _, need_a, need_b, _, need_bias, _ = ctx.needs_input_grad
        grad_a, grad_b, grad_bias = backward(a, b, offs, grad, need_a, need_b, _run, need_bias)
        return None, grad_a, grad_b, None, grad_bias, None


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
    ctx = _SavedContext(case, (a, b, offs), (False, need_a, need_b, False, False, False))
    return GroupedMM.backward(ctx, grad)[1:3]  # no bias: the bridge takes none


# Cases whose forward returns a new tensor, not a view: the bridge's node is
# given to such outputs only (Function.apply handles views of its own).
_FRESH_OUTPUT = frozenset({Case.RAGGED_M, Case.RAGGED_K})


def _compiled_autograd_on() -> bool:
    """Whether compiled autograd is on (inside its context manager,
    torch._dynamo.compiled_autograd._enable): it traces every node of the
    backward, which GroupedMM's node allows and the bridge's C++ node does not."""
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    return module is not None and bool(getattr(module, "compiled_autograd_enabled", False))


def grouped_mm_with_autograd(case: Case, a, b, offs, bias, out_dtype):
    """What GroupedMM.apply(case, a, b, offs, bias, out_dtype) gives, without
    the wrapper's generic Python work where no functorch transform is active: a
    C++ node where the torch bridge is loaded (no bias), else the Function's C
    part."""
    if _transforms_active is None or _unwrap_if_dead is None or _transforms_active():
        return GroupedMM.apply(case, a, b, offs, bias, out_dtype)
    if (_native.bridge is not None and bias is None and case in _FRESH_OUTPUT
            and not _compiled_autograd_on()):
        out = _native.bridge.with_autograd(ragged.run, _bridge_backward, case, a, b, offs,
                                           out_dtype)
        if out is not None:
            return out
    offs, bias = (None if x is None else _unwrap_if_dead(x) for x in (offs, bias))
    return _FUNCTION_APPLY(case, _unwrap_if_dead(a), _unwrap_if_dead(b), offs, bias, out_dtype)


@torch.library.custom_op("gg_runtime::grouped_mm", mutates_args=())
def grouped_mm_op(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Optional[torch.Tensor],
                  bias: Optional[torch.Tensor], out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    # No device_types: a CPU tensor reaches classify() and gets its clear error.
    case = classify(mat_a, mat_b, offs, bias, out_dtype)
    return ragged.run(case, mat_a, mat_b, offs, out_dtype, bias)


@grouped_mm_op.register_fake
def _grouped_mm_fake(mat_a, mat_b, offs, bias, out_dtype):
    case = classify(mat_a, mat_b, offs, bias, out_dtype)
    return empty_output(case, mat_a, mat_b, offs, out_dtype)


def _setup_context(ctx, inputs, output):
    a, b, offs, _, _ = inputs
    ctx.save_for_backward(a, b, offs)


def _traced_mm(x, y, offs):
    # Gradients as calls of the op, so that compiled graphs keep them.
    return torch.ops.gg_runtime.grouped_mm(x, y, offs, None, None)


def _op_backward(ctx, grad):
    a, b, offs = ctx.saved_tensors
    need_a, need_b, _, need_bias, _ = ctx.needs_input_grad
    grad_a, grad_b, grad_bias = backward(a, b, offs, grad, need_a, need_b, _traced_mm, need_bias)
    return grad_a, grad_b, None, grad_bias, None


grouped_mm_op.register_autograd(_op_backward, setup_context=_setup_context)
