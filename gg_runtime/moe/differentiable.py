"""moe_experts as an autograd function (ExpertsFunction): the forward keeps the
routing, the inputs and the up projection's output; the backward composes
operators, in the inputs' dtype or, with a recipe, fp8_training's."""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import fp8_training
from .._native import OPS, call, call_untracked_if_possible
from ..autograd import Gathered, bias_gradient, input_gradient, stored_transposed
from .inputs import MoeInputs


def _mm(a, b, offs, bias=None):
    return call_untracked_if_possible(OPS.grouped_mm.default, a, b, offs, bias, None, False)


class ExpertsFunction(torch.autograd.Function):
    """moe_experts' autograd function: its products in x's dtype, or with a
    recipe in fp8 (moe_experts(fp8=...)): one backward, each product by
    _product and _weight_gradient."""

    @staticmethod
    def forward(ctx, x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation, recipe,
                quantized):
        # The forward and what the backward reads beyond the inputs (csrc/ops/ops.h
        # ExpertsForBackward), with whether the products gathered the tokens.
        inputs = MoeInputs(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation)
        if recipe is None:
            out, gu, order, offs, inverse, gathered = call(OPS.moe_experts_for_backward.default,
                                                           *inputs)
        else:
            out, gu, order, offs, inverse, gathered = fp8_forward(inputs, recipe, True, quantized)
        ctx.save_for_backward(x, topk_weights, w13, w2, b2, order, offs, inverse, gu)
        ctx.gate_up, ctx.activation, ctx.gathered, ctx.recipe = (gate_up, activation, gathered,
                                                                 recipe)
        # The weights' quantized transposes the input gradients read, if made before.
        ctx.transposed = quantized.backward if quantized is not None else (None, None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        """The gradient of each sorted row's down projection before its routing
        weight (dys: grad's row of the slot's token) gives dh; one kernel then
        gives d(gu), h scaled by the weight (so that dW2 = dys^T (w h)) and the
        weight's gradient <dys, y> = <dh, h> (+ <dys, b2>); the rest are
        grouped products, and permutations and sums over each token's k slots
        for dx and d(topk_weights).  The products read dys from grad, and the
        tokens from x, through the routing's order (no permuted copies) where
        the forward's up projection did (ctx.gathered)."""
        x, topk_weights, w13, w2, b2, order, offs, inverse, gu = ctx.saved_tensors
        recipe = ctx.recipe
        weights = topk_weights.float()
        need_x, _, need_weights, need_w13, need_w2, need_b13, need_b2 = ctx.needs_input_grad[:7]
        tokens, k = weights.shape
        grad = grad.to(x.dtype)
        scale = weights.reshape(-1).index_select(0, order)
        dys = _token_rows(grad, order, k, ctx.gathered)
        w13_t, w2_t = ctx.transposed
        dh = _product(dys, w2, offs, recipe, w2_t)
        if _quantizes_in_swiglu_backward(recipe, ctx.gate_up, gu.shape[1] // 2):
            dgu, hs, dot, db13_parts = _swiglu_backward_fp8(gu, dh, scale, offs, ctx.gate_up,
                                                            ctx.activation, need_b13)
        else:
            dgu, hs, dot = OPS.swiglu_backward.default(gu, dh, scale, ctx.gate_up,
                                                       ctx.activation)
            db13_parts = (dgu, offs)
        # Each intermediate goes as soon as its last use is done, gu too
        # (_release).  d(gu), as large as gu, goes first: its products run
        # before dW2's, while h (half its size) waits.
        _release(gu)
        del dh
        d_weights = dw2 = dx = dw13 = db13 = bias_terms = db2 = None
        if b2 is not None and (need_weights or need_b2):
            bias_terms, db2 = _through_down_bias(grad, b2, weights, offs, inverse, need_weights,
                                                 need_b2)
        if need_weights:
            d_weights = dot.index_select(0, inverse).view(tokens, k)
            if bias_terms is not None:
                d_weights += bias_terms
            d_weights = d_weights.to(topk_weights.dtype)
        del dot
        if need_x:  # each token's k rows summed: a combine with unit weights
            ones = torch.ones_like(weights)
            rows = _product(dgu, w13, offs, recipe, w13_t)
            dx = OPS.combine.default(rows, inverse.view(tokens, k), ones, offs).to(x.dtype)
            del rows
        if need_w13:
            xs = _token_rows(x, order, k, ctx.gathered)
            dw13 = _weight_gradient(w13, dgu, xs, offs, recipe)
            del xs
        if need_b13:
            db13 = bias_gradient(*db13_parts, False).to(w13.dtype)
        del dgu, db13_parts
        if need_w2:
            dw2 = _weight_gradient(w2, dys, hs, offs, recipe)
        return dx, None, d_weights, dw13, dw2, db13, db2, None, None, None, None


def _quantizes_in_swiglu_backward(recipe, gate_up, inter) -> bool:
    """Whether SwiGLU's backward quantizes d(gu) and h where it makes them
    (swiglu_backward_fp8): the blockwise recipe, whose 1x128 blocks along
    d(gu)'s rows then lie within one half (interleaved, or I a multiple of
    128)."""
    return recipe == "blockwise" and (gate_up == "interleaved" or inter % 128 == 0)


def _swiglu_backward_fp8(gu, dh, scale, offs, gate_up, activation, need_b13):
    """swiglu_backward's (d(gu), h scaled, dot) with d(gu) and h as the
    blockwise recipe's products read them (fp8_training.QuantizedBothWays), made in
    one pass; and where need_b13 (else None), b13's gradient as
    bias_gradient's arguments: d(gu)'s sums over each group's 128-row
    blocks, whose groups end at block offs[g] // 128 + g + 1 (the blocks
    between two groups' rows are zeros)."""
    dgu, dgu_scale, dgu_columns, dgu_columns_scale, h_columns, h_columns_scale, dot, sums = (
        OPS.swiglu_backward_fp8.default(gu, dh, scale, offs, gate_up, activation, need_b13))
    rows = gu.shape[0]
    db13_parts = None
    if need_b13:
        groups = torch.arange(1, offs.shape[0] + 1, dtype=offs.dtype, device=offs.device)
        db13_parts = (sums, offs // 128 + groups)
    both_ways = fp8_training.QuantizedBothWays
    return (both_ways(rows, (dgu, dgu_scale), (dgu_columns, dgu_columns_scale)),
            both_ways(rows, None, (h_columns, h_columns_scale)), dot.sum(0), db13_parts)


def fp8_forward(inputs: MoeInputs, recipe, for_backward, quantized=None):
    """The fp8 forward of 16-bit or float32 weights: each weight quantized by the
    recipe (fp8_training's granularities, the forward's orientation), or
    taken from `quantized` (Fp8ExpertWeights), then the experts' operator
    in the recipe's weight format (moe_experts, or with for_backward
    moe_experts_for_backward: (out, gu, order, offs, inverse, gathered))."""
    if quantized is None:
        w13, w2 = (fp8_training.quantize_weight(w, recipe) for w in (inputs.w13, inputs.w2))
    else:
        w13, w2 = quantized.forward
    op = OPS.moe_experts_for_backward if for_backward else OPS.moe_experts
    return call(op.default, *inputs._replace(w13=w13.values, w2=w2.values), w13.format,
                w13.scales, w2.scales)


def _token_rows(t, order, k, gathered):
    """t's row of each sorted row's token: read through the routing's order
    (Gathered) where the products gather, else a permuted copy."""
    return Gathered(t, order, k) if gathered else t.index_select(0, order // k)


def _product(a, b, offs, recipe, quantized_b_t=None):
    """a @ b[g] over each group's rows (b [G, K, N], a a tensor or Gathered):
    grouped_mm's kernels in a's dtype, or fp8_training's with a recipe (b's
    transposed orientation quantized as a weight, or quantized_b_t where
    made before; bfloat16 out)."""
    if recipe is not None:
        return fp8_training.product(a, b.mT, recipe, offs, quantized_b_t)
    if isinstance(a, Gathered):
        return OPS.gathered_mm.default(a.x, a.rows, a.k, b, offs)
    return _mm(a, b, offs)


def _weight_gradient(w, left, right, offs, recipe):
    """The gradient of w [E, M, N], left_g^T @ right_g over each group's
    sorted rows, in w's layout and dtype (autograd.input_gradient says why
    the layout): fp8_training's with a recipe, else grouped_mm's kernels,
    those of gathered_mm_k where an operand is Gathered (at most one is)."""
    transposed = stored_transposed(w)
    if recipe is not None:
        # float32 master weights get the float32 product, 16-bit ones bfloat16's.
        out = torch.float32 if w.dtype == torch.float32 else torch.bfloat16
        if transposed:
            return fp8_training.weight_gradient(right, left, offs, recipe, out).mT.to(w.dtype)
        return fp8_training.weight_gradient(left, right, offs, recipe, out).to(w.dtype)
    if not isinstance(left, Gathered) and not isinstance(right, Gathered):
        return input_gradient(w, left.mT, right, offs, False)
    tokens = left if isinstance(left, Gathered) else right
    left_t, right_t = (a.x if isinstance(a, Gathered) else a for a in (left, right))
    tokens_left = tokens is left
    if transposed:
        return OPS.gathered_mm_k.default(right_t, left_t, offs, tokens.rows, tokens.k,
                                         not tokens_left).mT
    return OPS.gathered_mm_k.default(left_t, right_t, offs, tokens.rows, tokens.k, tokens_left)


def _release(saved):
    """Free a saved tensor's memory once its last use is enqueued, as torch's
    own nodes let theirs go before the rest of the backward runs (a node's
    saved tensors otherwise live until it returns; gu, the largest, would
    overlap the weights' gradients).  Only where nothing can read it again:
    autograd keeps no graph for another backward (retain_graph=False) and
    nothing is being compiled.  The allocator reuses the memory in stream
    order, after the kernels that read it."""
    if torch.compiler.is_compiling():  # first: the compiler cannot trace the query below
        return
    keeps_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    if keeps_graph is None or keeps_graph():
        return
    saved.untyped_storage().resize_(0)


def _through_down_bias(grad, b2, weights, offs, inverse, need_terms, need_b2):
    """What flows through the down projection's bias: each slot's
    <grad[t], b2[e]> [T, k] in float32 (the routing weight's gradient term; 0
    for a dropped id) from one [T, H] x [H, E] product, and b2's gradient (each
    expert's sum of weight * grad[t] over its slots, in b2's dtype) from one
    [E, T] x [T, H] product, both computed in float32.  A slot's expert is the
    group of its sorted row (past the last group for a dropped id: column E,
    cut off).  Each slot's weight is put in its own row before the k are
    summed: no atomics, so duplicate ids sum the same each run."""
    tokens, k = weights.shape
    experts = b2.shape[0]
    slot_experts = torch.searchsorted(offs, inverse.to(offs.dtype), right=True).view(tokens, k)
    grad = grad.float()
    terms = db2 = None
    if need_terms:
        per_expert = grad @ b2.float().t()
        dropped = per_expert.new_zeros(tokens, 1)
        terms = torch.cat([per_expert, dropped], 1).gather(1, slot_experts)
    if need_b2:
        routed = weights.new_zeros(tokens, k, experts + 1)
        routed.scatter_(2, slot_experts.unsqueeze(2), weights.unsqueeze(2))
        db2 = (routed.sum(1)[:, :experts].t() @ grad).to(b2.dtype)
    return terms, db2
