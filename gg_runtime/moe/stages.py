"""The MoE layer's stages on their own: route (the token slots sorted by
expert) and combine (each token's weighted sum of its experts' rows), each
one operator, graph-capturable, with no host sync.  moe_experts runs them
fused with the experts, in its one operator."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from .._native import OPS, call, check_types


class Routing(NamedTuple):
    """The token slots of a top-k routing sorted by expert, as `route` gives them.

    Slot `s = t * k + j` is token t's j-th choice. Attributes:
        order: `[T*k]` int64: the slot of each sorted row (row r holds slot
            `order[r]`, token `order[r] // k`).
        offs: `[E]` int32: each expert's end among the sorted rows (expert e
            holds rows `offs[e-1]:offs[e]`); the rows of dropped slots lie past
            `offs[-1]`.
        inverse: `[T*k]` int64: the sorted row of each slot
            (`order[inverse[s]] == s`).
    """
    order: torch.Tensor
    offs: torch.Tensor
    inverse: torch.Tensor


def route(topk_ids: torch.Tensor, num_experts: int) -> Routing:
    """The token slots of a top-k routing, sorted by expert, on the GPU.

    A stable counting sort of the slots by expert id: within an expert the
    slots keep their order. An id outside `[0, num_experts)` is a dropped
    slot: its row comes after every expert's (past `offs[-1]`). Nothing is
    read back to the host, so the call can be captured in a CUDA graph and
    replayed with new ids. Not differentiable (integers only).

    Args:
        topk_ids: `[T, k]` int32 or int64 on a CUDA device: each token's
            experts.
        num_experts: E, at least 0.

    Returns:
        A `Routing` (order, offs, inverse).

    Raises:
        TypeError: topk_ids not a tensor or of another dtype; num_experts not
            an int.
        ValueError: topk_ids not 2-D or not on a CUDA device; num_experts
            below 0.
        UnsupportedDeviceError: a GPU this wheel has no kernels for.
        CudaError: a driver or launch failure.
    """
    check_types(tensors=(("topk_ids", topk_ids),), ints=(("num_experts", num_experts),))
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be 2-D [T, k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    return Routing(*call(OPS.route.default, topk_ids.reshape(-1).long(), num_experts))


def mapped_ids(topk_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Each id through a table of the experts (an expert map): `table[id]` for
    an id in `[0, len(table))`, -1 (a dropped slot) for any other; int64,
    on the GPU with no host sync (what fused_experts' expert_map and
    expert_parallel's placement do to the ids)."""
    padded = torch.cat((table.long(), table.new_full((1,), -1, dtype=torch.long)))
    return padded[topk_ids.long().clamp(-1, table.shape[0])]  # -1 and E read the -1


def combine(rows: torch.Tensor, routing: Routing, topk_weights: torch.Tensor) -> torch.Tensor:
    """Each token's weighted sum of its slots' rows: `out[t] = sum_j
    topk_weights[t, j] * rows[routing.inverse[t * k + j]]`.

    `rows` are the experts' outputs in the sorted order `route` gave; a
    dropped slot (its row past `routing.offs[-1]`) adds nothing, whatever its
    weight. The sum is in float32, over the k slots of a token (no atomics:
    the same result every run). Graph-capturable, no host sync.

    Autograd: differentiable in rows and topk_weights (once). The gradient of
    a row is its slot's weight times its token's output gradient (zero for a
    dropped slot's row and rows past the slots); the gradient of a weight is
    the dot product of its token's output gradient and its row (zero for a
    dropped slot), in topk_weights' dtype; both computed in float32.

    Args:
        rows: `[R, H]`, float16 or bfloat16 on a CUDA device, R at
            least the number of routed slots (`routing.offs[-1]`).
        routing: the `Routing` of the call's topk_ids (`route`).
        topk_weights: `[T, k]`, any floating dtype (summed in float32).

    Returns:
        `[T, H]` in rows' dtype.

    Raises:
        TypeError: an argument that is not a tensor (routing: a Routing) or
            of a dtype that does not fit, naming it.
        ValueError: shapes that do not fit; tensors on different devices.
        UnsupportedDeviceError: a GPU this wheel has no kernels for.
        CudaError: a driver or launch failure.
    """
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a Routing (route's result), got "
                        f"{type(routing).__name__}")
    check_types(tensors=(("rows", rows), ("topk_weights", topk_weights)))
    if topk_weights.dim() != 2 or topk_weights.numel() != routing.inverse.numel():
        raise ValueError(f"topk_weights must be [T, k] with T * k = {routing.inverse.numel()} "
                         f"slots (routing's), got shape {tuple(topk_weights.shape)}")
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights must be a floating dtype, got {topk_weights.dtype}")
    if torch.is_grad_enabled() and (rows.requires_grad or topk_weights.requires_grad):
        return _Combine.apply(rows, routing.order, routing.offs, routing.inverse, topk_weights)
    return _combined(rows, routing.inverse, routing.offs, topk_weights)


def _combined(rows, inverse, offs, topk_weights):
    index = inverse.view(topk_weights.shape)
    return call(OPS.combine.default, rows, index, topk_weights.float(), offs)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, order, offs, inverse, topk_weights):
        ctx.save_for_backward(rows, order, offs, inverse, topk_weights)
        return _combined(rows, inverse, offs, topk_weights)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        rows, order, offs, inverse, topk_weights = ctx.saved_tensors
        tokens, k = topk_weights.shape
        dtype = torch.promote_types(rows.dtype, torch.float32)  # as the forward sums
        grad = grad.to(dtype)
        # A slot is kept where its row lies within the experts' rows.
        kept = inverse < offs[-1] if offs.numel() else torch.zeros_like(inverse, dtype=torch.bool)
        weights = torch.where(kept, topk_weights.reshape(-1).to(dtype), 0.0)
        d_rows = d_weights = None
        # Rows past the slots' (and the slots' past rows', all dropped) are not read.
        reached = min(order.numel(), rows.shape[0])
        if ctx.needs_input_grad[0]:
            d_rows = rows.new_zeros(rows.shape, dtype=dtype)
            d_rows[:reached] = (grad.index_select(0, order[:reached] // k)
                                * weights.index_select(0, order[:reached]).unsqueeze(1))
            d_rows = d_rows.to(rows.dtype)
        if ctx.needs_input_grad[4]:
            dots = grad.new_zeros(tokens, k)
            if reached:
                picked = rows.index_select(0, inverse.clamp(max=reached - 1)).to(dtype)
                dots = (picked.view(tokens, k, rows.shape[1]) * grad.unsqueeze(1)).sum(-1)
            d_weights = torch.where(kept.view(tokens, k), dots, 0.0).to(topk_weights.dtype)
        return d_rows, None, None, None, d_weights
