"""moe_experts(fp8=recipe) (fp8 training of the experts): a float64
reference of its output and every gradient, computed from the operands
quantized as the implementation quantizes them and rounded where it
writes bfloat16, expert by expert:

1. forward: moe_fp8.moe_experts_fp8_ref on the weights quantize_fp8 makes
   (`"128x128"` blocks for `"blockwise"`, per output channel for
   `"rowwise"`); gu, the up projection plus b13, rounded to bfloat16 (the
   forward keeps it so);
2. dh = dY's rows (the output gradient, quantized along H) times
   w2 quantized in the transposed orientation ([I, H] rows), rounded;
3. the activation's backward in float64 on the rounded gu and dh: d(gu)
   (times the routing weight), h times the routing weight, <dh, h>; d(gu)
   and that h rounded;
4. dx: d(gu)'s rows (quantized along 2I) times w13 quantized as [H, 2I],
   rounded, summed over each token's slots;
5. dW13 and dW2: fp8_training's weight gradient (both operands' columns
   quantized along the expert's rows, from its first), as fp8_grouped_mm's;
6. d(topk_weights) = <dh, h> + <dY's row, b2>; the biases' gradients summed
   over the expert's rows.

Rows of an expert are its token slots in (token, slot) order, as the
routing's stable sort orders them (blocks along the rows start at the
expert's first).  Ids outside [0, E) add nothing and get zero gradients.
"""
from __future__ import annotations

import torch

from ..api import quantize_fp8
from .fp8 import SCALE_KINDS, quantize_ref
from .moe_fp8 import dequantize64, moe_experts_fp8_ref
from .moe_layers import gated_activation

GRADIENTS = ("x", "topk_weights", "w13", "w2", "b13", "b2")


def _dequantized(x: torch.Tensor, granularity: str) -> torch.Tensor:
    return dequantize64(*quantize_ref(x, granularity), granularity)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double()


def moe_experts_fp8_training_ref(x, topk_ids, topk_weights, w13, w2, grad, recipe: str, b13=None,
                                 b2=None, gate_up="concatenated", activation="swiglu") -> dict:
    """{"out": [T, H], and each name of GRADIENTS (None for a bias not
    given): its gradient} in float64 for moe_experts(x, topk_ids,
    topk_weights, w13, w2, fp8=recipe, ...) and the output gradient grad."""
    rows_kind, weight_kind = SCALE_KINDS[recipe]
    q13, q2 = quantize_fp8(w13, weight_kind), quantize_fp8(w2, weight_kind)
    out = moe_experts_fp8_ref(x, topk_ids, topk_weights, q13, q2, b13, b2, gate_up, activation)
    w13_up = dequantize64(*q13)
    w13_back = _dequantized(w13.mT, weight_kind)  # [E, H, 2I]
    w2_back = _dequantized(w2.mT, weight_kind)  # [E, I, H]
    tokens = _dequantized(x, rows_kind)
    dy = grad
    weights = topk_weights.float().double()
    grads = {name: torch.zeros(t.shape, dtype=torch.float64, device=x.device)
             for name, t in (("x", x), ("topk_weights", topk_weights), ("w13", w13), ("w2", w2))}
    for name, bias in (("b13", b13), ("b2", b2)):
        grads[name] = None if bias is None else torch.zeros(bias.shape, dtype=torch.float64,
                                                            device=x.device)
    for e in range(w13.shape[0]):
        token, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if token.numel() == 0:
            continue
        scale = weights[token, slot, None]
        gu = tokens[token] @ w13_up[e].mT + (0 if b13 is None else _bf16(b13[e]))
        dys = dy[token]
        dh = _bf16(_dequantized(dys, rows_kind) @ w2_back[e].mT)
        gu = _bf16(gu).requires_grad_()
        with torch.enable_grad():
            h = gated_activation(gu, gate_up == "interleaved", activation)
            (dgu,) = torch.autograd.grad(h, gu, dh * scale)
        h = h.detach()
        dgu, hs = _bf16(dgu), _bf16(h * scale)
        rows = _bf16(_dequantized(dgu, rows_kind) @ w13_back[e].mT)
        grads["x"].index_add_(0, token, rows)
        dot = (dh * h).sum(-1) + (0 if b2 is None else dys.double() @ _bf16(b2[e]))
        grads["topk_weights"][token, slot] = dot
        grads["w13"][e] = _column_product(dgu, x[token], rows_kind)
        grads["w2"][e] = _column_product(dys, hs, rows_kind)
        if b13 is not None:
            grads["b13"][e] = dgu.sum(0)
        if b2 is not None:
            grads["b2"][e] = (dys.double() * scale).sum(0)
    return {"out": out, **grads}


def _column_product(left, right, granularity) -> torch.Tensor:
    """left^T @ right with both operands' columns quantized along the rows
    (fp8_training's weight gradient of one group)."""
    return _dequantized(left.mT, granularity) @ _dequantized(right.mT, granularity).mT
