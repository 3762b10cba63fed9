"""grouped_mm as a torch.library custom op: autograd through the same AOT
kernels, and a fake (meta) implementation so torch.compile traces it whole."""
from __future__ import annotations

from typing import Optional

import torch

from . import raw


@torch.library.custom_op("gg_runtime::grouped_mm", mutates_args=(), device_types="cuda")
def grouped_mm_op(a: torch.Tensor, b: torch.Tensor, offs: Optional[torch.Tensor]) -> torch.Tensor:
    return raw.grouped_mm(a, b, offs)[0]


@grouped_mm_op.register_fake
def _grouped_mm_fake(a, b, offs):
    raw.check_grouped_mm(a, b, offs, None)
    return a.new_empty(raw.output_shape(a, b, offs))


def _setup_context(ctx, inputs, output):
    a, b, offs = inputs
    ctx.save_for_backward(a, b, offs)


def _backward(ctx, grad):
    """Each gradient is one more grouped_mm with operands transposed (views, no copies)."""
    a, b, offs = ctx.saved_tensors
    need_a, need_b, _ = ctx.needs_input_grad
    op = torch.ops.gg_runtime.grouped_mm
    grad_a = grad_b = None
    if a.dim() == 2 and b.dim() == 3:  # ragged M: out[T, N]
        if need_a:
            grad_a = op(grad, b.transpose(-2, -1), offs)  # ragged M again
        if need_b:
            grad_b = op(a.t(), grad, offs)  # ragged K: [G, K, N]
    elif a.dim() == 2:  # ragged K: out[G, M, N]
        if need_a:
            grad_a = op(b, grad.transpose(-2, -1), offs).t()  # [T, M] -> [M, T]
        if need_b:
            grad_b = op(a.t(), grad, offs)  # [T, N]
    else:  # batched
        if need_a:
            grad_a = op(grad, b.transpose(-2, -1), None)
        if need_b:
            grad_b = op(a.transpose(-2, -1), grad, None)
    return grad_a, grad_b, None


grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)
