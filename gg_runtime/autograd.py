"""grouped_mm's gradients, registered as the autograd formula of the operator
torch.ops.gg_runtime.grouped_mm: the one route in eager mode, under
torch.compile and under functorch transforms.  Each gradient is one more
grouped_mm of a known case on transposed views (no copies), computed in the
layout of the input it belongs to.  Also the pieces the other autograd
functions (moe/differentiable.py, fp8_training.py) share: a gradient in its input's layout,
a bias's gradient, an operand read through the routing's order."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._native import OPS, call_untracked_if_possible


@dataclass(frozen=True)
class Gathered:
    """A product's operand whose row r is x's row rows[r] // k (int64 rows:
    the routing's order over token slots), read without a permuted copy."""
    x: torch.Tensor
    rows: torch.Tensor
    k: int


def grouped_mm_op(a, b, offs, tf32: bool):
    """The operator (the gradients below are grouped_mm products of known cases)."""
    return call_untracked_if_possible(OPS.grouped_mm.default, a, b, offs, None, None, tf32)


def stored_transposed(x) -> bool:
    """Whether x's last two dimensions are stored transposed (column-major
    matrices, as b = w.transpose(1, 2) for nn.Linear-style weights w)."""
    return x.shape[-1] > 1 and x.shape[-2] > 1 and x.stride(-2) == 1 and x.stride(-1) != 1


def input_gradient(x, left, right, offs, tf32: bool):
    """The gradient of input x, left @ right, in x's layout: where x is stored
    transposed it is computed as (right^T @ left^T)^T, so it comes back with
    x's strides and autograd need not copy it into x's layout (AccumulateGrad
    copies a gradient whose strides differ from its parameter's).  Every case
    writes its output row-major, so both ways give x's strides."""
    if stored_transposed(x):
        return grouped_mm_op(right.mT, left.mT, offs, tf32).mT
    return grouped_mm_op(left, right, offs, tf32)


def bias_gradient(grad, offs, tf32: bool):
    """[G, N]: the sum of each group's rows of grad, in grad's dtype.  Batched
    (3-D grad): over M.  Ragged M: a ragged-K product of a row of ones with
    grad, so the kernels' reading of offs decides which rows a group has.
    The row of ones is a transposed view (of [T, 8]): the weight gradient's
    layout, with a 16-byte row stride."""
    if grad.dim() == 3:
        return grad.sum(1)
    ones = grad.new_ones(grad.shape[0], 8).t()[:1]
    return grouped_mm_op(ones, grad, offs, tf32)[:, 0]


def _setup_context(ctx, inputs, output):
    a, b, offs, _, _, tf32 = inputs
    ctx.save_for_backward(a, b, offs)
    ctx.tf32 = tf32


def _backward(ctx, grad):
    """grad_a = grad @ b^T and grad_b = a^T @ grad as grouped products (ragged
    M's dB is ragged K, and so on); grad_bias as bias_gradient.  A float32
    gradient of a 16-bit product (out_dtype=float32) is rounded to the inputs'
    dtype for grad_a and grad_b: the kernels take one input dtype.  The
    dispatcher drops trailing arguments equal to their defaults, so
    needs_input_grad (and the gradients returned) cover the arguments given."""
    a, b, offs = ctx.saved_tensors
    given = len(ctx.needs_input_grad)
    need_a, need_b = ctx.needs_input_grad[:2]
    need_bias = given > 3 and ctx.needs_input_grad[3]
    grad_bias = bias_gradient(grad, offs, ctx.tf32) if need_bias else None
    grad = grad.to(a.dtype)
    grad_a = input_gradient(a, grad, b.mT, offs, ctx.tf32) if need_a else None
    grad_b = input_gradient(b, a.mT, grad, offs, ctx.tf32) if need_b else None
    return (grad_a, grad_b, None, grad_bias, None, None)[:given]


torch.library.register_autograd("gg_runtime::grouped_mm", _backward, setup_context=_setup_context)
