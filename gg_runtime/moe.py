"""The experts of an MoE layer as one differentiable function, with no bf16
atomics and no host sync.  The forward is one operator
(torch.ops.gg_runtime.moe_experts): routing on the GPU, the up projection
reading the tokens through the routing's order with SwiGLU in its epilogue,
the down projection, and the weighted combine of each token's k outputs
read through the inverse permutation.  The backward, in Python, composes
operators: one kernel for SwiGLU's backward (swiglu_backward), grouped
products (those of the tokens' or the gradient's rows read them through the
routing's order, gathered_mm and gathered_mm_k, where the forward's did:
the operator decides, by aot/families/ragged_glu.py's GATHER_MAX_INTER),
and combine.  With an fp8 recipe (moe_experts(fp8=...)) the forward is the
fp8 weights' operator on the weights quantized (or on fp8_expert_weights'
copies, made once), and the backward's products are fp8_training's; with
the blockwise recipe SwiGLU's backward kernel quantizes what it makes as
those products read it (swiglu_backward_fp8) where its blocks allow.

What the autograd function keeps for backward is the routing, the inputs
and the up projection's output (freed as soon as the backward has read it:
_release); everything else is recomputed.  Every
gather, scatter and combine is a permutation or a sum over the k slots of a
token, never an index_add."""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import fp8_training
from .formats import RECIPES
from .autograd import Gathered, bias_gradient, input_gradient, stored_transposed
from .fp8_expert_weights import Fp8ExpertWeights, quantize_expert_weights
from ._native import OPS, _C, call, call_untracked_if_possible, check_types

# The values the kernels are built for, read from the swiglu family's axes
# (aot/families/swiglu.py), the one description the operators parse them by.
_SWIGLU_AXES = _C.families()["swiglu"]["axes"]
GATE_UP_VALUES = tuple(_SWIGLU_AXES["gate_up"])
# silu(gate) * up, and gpt-oss's clamped form (the kernels' GPT_OSS_ALPHA and
# GPT_OSS_LIMIT): (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7).
ACTIVATIONS = tuple(_SWIGLU_AXES["activation"])
GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0


def _check_choices(gate_up, activation):
    """Before anything is recorded for autograd (the operator parses them by
    the same values)."""
    if gate_up not in GATE_UP_VALUES:
        raise ValueError(f"gate_up must be one of {GATE_UP_VALUES}, got {gate_up!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def _experts_forward(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation):
    """The forward in one operator (torch.ops.gg_runtime.moe_experts,
    csrc/ops/moe_experts.cc: every check of the arguments, the routing, both
    projections, the combine)."""
    return call(OPS.moe_experts.default, x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up,
                activation)


def _mm(a, b, offs, bias=None):
    return call_untracked_if_possible(OPS.grouped_mm.default, a, b, offs, bias, None, False)


class _Experts(torch.autograd.Function):
    """moe_experts' autograd function: its products in x's dtype, or with a
    recipe in fp8 (moe_experts(fp8=...)): one backward, each product by
    _product and _weight_gradient."""

    @staticmethod
    def forward(ctx, x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation, recipe,
                quantized):
        # The forward and what the backward reads beyond the inputs (csrc/ops/ops.h
        # ExpertsForBackward, ExpertsFp8ForBackward), with whether the products
        # gathered the tokens (fp8's do).
        if recipe is None:
            out, gu, order, offs, inverse, gathered = call(
                OPS.moe_experts_for_backward.default, x, topk_ids, topk_weights, w13, w2, b13, b2,
                gate_up, activation)
        else:
            out, gu, order, offs, inverse = _fp8_forward(x, topk_ids, topk_weights, w13, w2, b13,
                                                         b2, gate_up, activation, recipe, True,
                                                         quantized)
            gathered = True
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
    blockwise recipe's products read them (fp8_training.Quantized), made in
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
    return (fp8_training.Quantized(rows, (dgu, dgu_scale), (dgu_columns, dgu_columns_scale)),
            fp8_training.Quantized(rows, None, (h_columns, h_columns_scale)), dot.sum(0),
            db13_parts)


def _fp8_forward(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation, recipe,
                 for_backward, quantized=None):
    """The fp8 forward of 16-bit or float32 weights: each weight quantized by the
    recipe (fp8_training's granularities, the forward's orientation), or
    taken from `quantized` (Fp8ExpertWeights), then the fp8 experts'
    operator (moe_experts_fp8, or with for_backward
    moe_experts_fp8_for_backward: (out, gu, order, offs, inverse))."""
    if quantized is None:
        (q13, scale13), (q2, scale2) = (fp8_training.quantize_weight(w, recipe)
                                        for w in (w13, w2))
    else:
        (q13, scale13), (q2, scale2) = quantized.forward
    op = OPS.moe_experts_fp8_for_backward if for_backward else OPS.moe_experts_fp8
    return call(op.default, x, topk_ids, topk_weights, q13, q2, scale13, scale2, b13, b2, gate_up,
                activation)


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


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                w13: torch.Tensor, w2: torch.Tensor, *, gate_up: str = "concatenated",
                activation: str = "swiglu", b13: torch.Tensor | None = None,
                b2: torch.Tensor | None = None, w13_scale: torch.Tensor | None = None,
                w2_scale: torch.Tensor | None = None,
                fp8: str | Fp8ExpertWeights | None = None) -> torch.Tensor:
    """The experts of a token-choice MoE layer, given the router's choice: one function.

    `out[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])`, each
    expert a gated MLP: `expert_e(v) = w2[e] @ act(g, u) (+ b2[e])`, with `g`
    and `u` the gate and up halves of `w13[e] @ v (+ b13[e])`; float32
    accumulation.

    Routing runs on the GPU (a stable counting sort of the token slots by
    expert, the groups' offsets and the inverse permutation): nothing waits for
    the host, so the call can be captured in a CUDA graph and replayed with new
    routing.  An id outside `[0, E)` marks a dropped slot: it adds nothing and
    its weight gets a zero gradient (`-1`, or the ids >= E that transformers'
    expert parallelism gives other ranks' experts).  Any T (0 included) and any
    k from 1 up.

    Autograd: differentiable in x, topk_weights, w13, w2 and the biases, once
    (not twice); the weights' gradients come back in the weights' own strides.
    Traceable by `torch.compile` (`fullgraph=True` included; with an
    `Fp8ExpertWeights` as `fp8`, whose check reads version counters, the
    graph breaks there and `fullgraph=True` refuses it).  Memory: for the
    backward it keeps the routing and the up projection's output `[T*k, 2I]`
    (the gathered tokens and the activation's output are recomputed) and frees
    that output once the backward has read it (unless `retain_graph=True`);
    with no gradient wanted (`torch.no_grad()`, inference) it keeps nothing.
    The forward is the operator `torch.ops.gg_runtime.moe_experts`; the guide
    (docs/guides/moe.md) says which kernels it runs.

    Args:
        x: `[T, H]`, the tokens, float16 or bfloat16 on a CUDA device.
        topk_ids: `[T, k]`, int32 or int64: each token's k experts.
        topk_weights: `[T, k]`, any floating dtype (converted to float32 for
            the combine): each slot's routing weight; its gradient comes back
            in this dtype.
        w13: `[E, 2I, H]` in x's dtype (with an fp8 recipe, or float32):
            each expert's gate and up projections in nn.Linear's `[out, in]`
            layout (transformers' `gate_up_proj`), or any strided view of
            that shape (a transposed `[E, H, 2I]` tensor, say).
        w2: `[E, H, I]` in w13's dtype: the down projections, `[out, in]`
            (transformers' `down_proj`), or any strided view of that shape.
        gate_up: how w13's rows hold the two halves: `"concatenated"` (gate
            rows, then up rows: Qwen3-MoE, Mixtral, DeepSeek, OLMoE) or
            `"interleaved"` (gate, up, gate, ...: gpt-oss).
        activation: `"swiglu"`, `act(g, u) = silu(g) * u`; or `"gpt_oss"`,
            gpt-oss's clamped form `(clamp(u, -7, 7) + 1) * g' * sigmoid(1.702 g')`
            with `g' = min(g, 7)` (gradients zero where a clamp holds, as
            `torch.clamp`'s).
        b13: None, or `[E, 2I]` in x's dtype; float32 too with
            float8_e4m3fn weights, and with an fp8 recipe the weights'
            dtype: the up projection's bias.
        b2: None, or `[E, H]`, as b13: the down projection's bias.
        w13_scale: None for 16-bit weights. With w13 and w2 in
            `torch.float8_e4m3fn` (inference; see below): w13's float32
            scales, `[E, ceil(2I/128), ceil(H/128)]` (one per 128 x 128 block
            of each expert's `[2I, H]`: DeepSeek-V3's and vLLM's
            `block_shape=[128, 128]`) or `[E, 2I]` (one per output channel;
            `[E, 2I, 1]` too).
        w2_scale: w2's scales, of the same kind: `[E, ceil(H/128),
            ceil(I/128)]` or `[E, H]` (`[E, H, 1]`).
        fp8: None, or an fp8 training recipe for 16-bit weights,
            `"blockwise"` or `"rowwise"` (see below), or w13 and w2
            quantized by one before (`quantize_expert_weights`).

    fp8 weights (`w13_scale` and `w2_scale` given): each weight is its fp8
    values times its scale (`w ~ q * scale`, as `quantize_fp8` makes them
    from 16-bit weights: `"128x128"` or `"rowwise"`), stored `[E, N, K]` with
    unit stride along K (fp8 tensor cores read it K-major); H and I multiples
    of 16. x's rows are quantized on the GPU as the weights are: per token
    per 128 columns for 128 x 128 blocks, per token for per-channel scales;
    the activation's output (the down projection's input) per token per 128
    columns with either, in the up projection's epilogue;
    `scale = max(amax, 1e-12) / 448`. The products accumulate in float32 on
    the tensor cores, the blocks' scales applied per 128 columns of K; the
    activation reads the up projection's float32 sums and the down
    projection's rows are rounded to bfloat16. Inference only: with gradients
    enabled, an input that requires grad is refused. Both gate_up layouts,
    both activations, the biases, dropped slots, T = 0 and CUDA-graph capture
    work as with 16-bit weights. The forward is the operator
    `torch.ops.gg_runtime.moe_experts_fp8` (sm90: H100, H200).

    fp8 training (`fp8="blockwise"` or `"rowwise"`, 16-bit weights, no
    scales; sm90): every product of the forward and the backward runs in fp8
    on operands quantized as they are read, the recipes of `fp8_grouped_mm`.
    The forward quantizes w13 and w2 on each call (`"blockwise"`: 128 x 128
    blocks, `"rowwise"`: per output channel) and runs the fp8 weights'
    forward above, which also keeps the up projection's output `[T*k, 2I]`
    in bfloat16 for the backward.  The backward quantizes the output
    gradient's and d(gu)'s rows along their reduced dimension (per 128
    columns, or per row) and the weights in the transposed orientation for
    the input gradients, and both operands of each weight gradient along
    the rows within each expert's group (per 128 rows from the group's
    first, or per group), accumulating in float32 per 128-deep step.  With
    `"blockwise"`, SwiGLU's backward writes d(gu) and the down projection's
    scaled input already quantized both ways, not in 16 bits, where each
    half of gu holds whole 128-column blocks (`gate_up="interleaved"`, or I
    a multiple of 128) and b13 needs no gradient.
    Differentiable in x, topk_weights, w13, w2 and the biases (once); the
    gradients come back in their inputs' dtypes and the weights' strides.
    float32 weights (master weights, with 16-bit x) are quantized from their
    float32 values, and their gradients are the float32 products, not
    rounded to 16 bits; float32 biases are added in x's dtype.  Kept for the
    backward: as with 16-bit products.  Without gradients
    (no_grad, nothing requiring grad) the call is the fp8 weights' forward
    on the weights quantized.  With `fp8=quantize_expert_weights(w13, w2,
    fp8=recipe)` the call skips both weights' quantizations, forward and
    backward, and computes the same as with the recipe; those weights must be
    the ones given, unchanged since.

    Returns:
        `[T, H]` in x's dtype.

    Raises:
        TypeError: an argument that is not a tensor (the biases: nor None), or
            of a dtype that does not fit, naming it (with `fp8`: x not
            float16 or bfloat16, weights neither both of its dtype nor both
            float32, or a bias of neither's); fp8 weights with a scale not
            given.
        ValueError: an unknown gate_up or activation; shapes that do not fit
            `[T, H]`, `[T, k]`, `[E, 2I, H]`, `[E, H, I]`, `[E, 2I]`, `[E, H]`;
            tensors on different devices or not on a CUDA device; fp8
            weights: scales of neither kind or of two kinds, weights not
            K-major, an input that requires grad; fp8 weights or `fp8`: H or
            I not multiples of 16; `fp8`: a value other than None, the
            recipes and an Fp8ExpertWeights, or given with scales; an
            Fp8ExpertWeights of other weights than w13 and w2, or of them
            before a change.
        UnsupportedDeviceError: a GPU this wheel has no kernels for (fp8: any
            GPU but compute capability 9.0).
        CudaError: a driver or launch failure.
    """
    _check_types(x, topk_ids, topk_weights, w13, w2, b13, b2)
    _check_choices(gate_up, activation)
    if fp8 is not None:
        return _fp8_training_experts(x, topk_ids, topk_weights, w13, w2, b13, b2, w13_scale,
                                     w2_scale, gate_up, activation, fp8)
    if w13_scale is not None or w2_scale is not None or w13.dtype == torch.float8_e4m3fn:
        return _fp8_experts(x, topk_ids, topk_weights, w13, w2, b13, b2, w13_scale, w2_scale,
                            gate_up, activation)
    args = (x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation)
    if _wants_gradient(x, topk_weights, w13, w2, b13, b2):
        return _Experts.apply(*args, None, None)
    return _experts_forward(*args)  # nothing to differentiate, nothing kept


def _wants_gradient(x, topk_weights, w13, w2, b13, b2) -> bool:
    """Whether autograd records the call (else nothing is kept).  Spelled
    out, not a loop: the forward's host time counts."""
    return torch.is_grad_enabled() and (
        x.requires_grad or topk_weights.requires_grad or w13.requires_grad
        or w2.requires_grad or (b13 is not None and b13.requires_grad)
        or (b2 is not None and b2.requires_grad))


def _fp8_experts(x, topk_ids, topk_weights, w13, w2, b13, b2, w13_scale, w2_scale, gate_up,
                 activation):
    """moe_experts with fp8 weights: inference only, one operator."""
    for name, scale in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor with fp8 weights (w13 and w2 "
                            "float8_e4m3fn with both scales; 16-bit weights with neither), got "
                            f"{type(scale).__name__}")
    if torch.is_grad_enabled():
        named = (("x", x), ("topk_weights", topk_weights), ("w13", w13), ("w2", w2),
                 ("b13", b13), ("b2", b2), ("w13_scale", w13_scale), ("w2_scale", w2_scale))
        grad = [name for name, value in named if value is not None and value.requires_grad]
        if grad:
            raise ValueError(f"moe_experts with fp8 weights is inference-only, but {grad[0]} "
                             "requires grad (run it under torch.no_grad() or "
                             "torch.inference_mode(), or detach it)")
    return call(OPS.moe_experts_fp8.default, x, topk_ids, topk_weights, w13, w2, w13_scale,
                w2_scale, b13, b2, gate_up, activation)


def _fp8_training_experts(x, topk_ids, topk_weights, w13, w2, b13, b2, w13_scale, w2_scale,
                          gate_up, activation, fp8):
    """moe_experts(fp8=...): the weights' checks that their quantization
    would hide (the operator checks the rest, naming the same arguments),
    then _Experts where a gradient is wanted, else the forward alone."""
    quantized = fp8 if isinstance(fp8, Fp8ExpertWeights) else None
    recipe = fp8.recipe if quantized is not None else fp8
    if recipe not in RECIPES:
        raise ValueError(f"fp8 must be None, one of {RECIPES} or an "
                         f"Fp8ExpertWeights, got {fp8!r}")
    if w13_scale is not None or w2_scale is not None:
        raise ValueError(f"fp8={recipe!r} quantizes 16-bit or float32 weights itself: give w13 "
                         "and w2 in x's dtype or float32 and no w13_scale or w2_scale")
    if x.dtype not in (torch.float16, torch.bfloat16) or w13.dtype not in (
            x.dtype, torch.float32) or w2.dtype != w13.dtype:
        raise TypeError(f"with fp8={recipe!r}, x must be float16 or bfloat16 and w13 and w2 "
                        f"both of its dtype or both float32, got x {x.dtype}, w13 {w13.dtype} "
                        f"and w2 {w2.dtype}")
    for name, b in (("b13", b13), ("b2", b2)):
        if b is not None and b.dtype not in (x.dtype, w13.dtype):
            raise TypeError(f"with fp8={recipe!r}, {name} must have x's or the weights' dtype, "
                            f"got {b.dtype}")
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dim() != 3 or w.device != x.device:
            raise ValueError(f"{name} must be 3-D on x's device {x.device}, got shape "
                             f"{tuple(w.shape)} on {w.device}")
    if quantized is not None:
        quantized.check(w13, w2)
    if _wants_gradient(x, topk_weights, w13, w2, b13, b2):
        return _Experts.apply(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation,
                              recipe, quantized)
    return _fp8_forward(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation, recipe,
                        False, quantized)


def _check_types(x, topk_ids, topk_weights, w13, w2, b13, b2):
    """A TypeError naming the argument that is no tensor (the operator checks
    the rest).  Spelled out, not a loop: the forward's host time counts."""
    tensor = torch.Tensor
    if (isinstance(x, tensor) and isinstance(topk_ids, tensor)
            and isinstance(topk_weights, tensor) and isinstance(w13, tensor)
            and isinstance(w2, tensor) and (b13 is None or isinstance(b13, tensor))
            and (b2 is None or isinstance(b2, tensor))):
        return
    check_types(tensors=(("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights),
                         ("w13", w13), ("w2", w2)),
                optional=(("b13", b13), ("b2", b2)))


class MoEExperts(torch.nn.Module):
    """The experts of a token-choice MoE layer (`moe_experts`) as a module.

    Its parameters have the names and layouts of transformers' fused experts:
    `gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]` and, with `bias=True`,
    `gate_up_proj_bias [E, 2I]` and `down_proj_bias [E, H]`, initialised as
    nn.Linear's, expert by expert.  `forward(hidden_states [T, H],
    top_k_index [T, k], top_k_weights [T, k]) -> [T, H]`, as transformers
    calls its experts module: `moe_experts` with these parameters.

    Args:
        num_experts: E.
        hidden_size: H, the tokens' width.
        intermediate_size: I, each expert's hidden width (w13 has 2I rows).
        gate_up: `"concatenated"` or `"interleaved"`, as in `moe_experts`.
        activation: `"swiglu"` or `"gpt_oss"`, as in `moe_experts`.
        bias: whether the two projections have biases (gpt-oss's do).
        fp8: None, or an fp8 training recipe, `"blockwise"` or `"rowwise"`
            (`moe_experts`' `fp8`): the module then quantizes its weights
            once after each change (an optimizer step, found by the weights'
            version counters: `quantize_expert_weights`) and its calls
            until the next change reuse them, as gradient accumulation's
            micro-batches do.  The module keeps those fp8 copies, as many
            bytes as its weights, between calls.  Writes through `.data`
            bypass the version counters and are not seen (write the
            parameters under `torch.no_grad()` instead); `torch.compile`
            breaks its graph at the check.
        device (torch.device | str | None): where the parameters are made.
        dtype (torch.dtype | None): the parameters' dtype (float16 or bfloat16
            to run; with `fp8` also float32, master weights for 16-bit
            hidden states).

    Raises:
        TypeError: a size that is not an int.
        ValueError: a size below 1; an unknown gate_up, activation or fp8 recipe.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 gate_up: str = "concatenated", activation: str = "swiglu", bias: bool = False,
                 fp8: str | None = None, device=None, dtype=None):
        super().__init__()
        sizes = (("num_experts", num_experts), ("hidden_size", hidden_size),
                 ("intermediate_size", intermediate_size))
        check_types(ints=sizes)
        for name, size in sizes:
            if size < 1:
                raise ValueError(f"{name} must be at least 1, got {size}")
        _check_choices(gate_up, activation)
        if fp8 is not None and fp8 not in RECIPES:
            raise ValueError(f"fp8 must be None or one of {RECIPES}, got {fp8!r}")
        self.gate_up, self.activation, self.fp8 = gate_up, activation, fp8
        self._fp8_weights = None  # quantize_expert_weights' of the weights as they are
        factory = {"device": device, "dtype": dtype}
        self.gate_up_proj = torch.nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size, **factory))
        self.down_proj = torch.nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size, **factory))
        self.gate_up_proj_bias = self.down_proj_bias = None
        if bias:
            self.gate_up_proj_bias = torch.nn.Parameter(
                torch.empty(num_experts, 2 * intermediate_size, **factory))
            self.down_proj_bias = torch.nn.Parameter(
                torch.empty(num_experts, hidden_size, **factory))
        self.reset_parameters()

    def reset_parameters(self):
        """nn.Linear's initialisation, expert by expert: uniform in ±1/sqrt(fan_in)."""
        for weight in (self.gate_up_proj, self.down_proj):
            bound = weight.shape[-1] ** -0.5
            torch.nn.init.uniform_(weight, -bound, bound)
        for bias, weight in ((self.gate_up_proj_bias, self.gate_up_proj),
                             (self.down_proj_bias, self.down_proj)):
            if bias is not None:
                bound = weight.shape[-1] ** -0.5
                torch.nn.init.uniform_(bias, -bound, bound)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        """`moe_experts(hidden_states, top_k_index, top_k_weights, ...)` with this
        module's parameters, gate_up, activation and fp8: `[T, H]` -> `[T, H]`."""
        return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
                           self.down_proj, gate_up=self.gate_up, activation=self.activation,
                           b13=self.gate_up_proj_bias, b2=self.down_proj_bias,
                           fp8=self._quantized_weights())

    def _quantized_weights(self) -> Fp8ExpertWeights | None:
        """None without fp8, else the weights quantized once per change."""
        if self.fp8 is None:
            return None
        weights = (self.gate_up_proj, self.down_proj)
        if self._fp8_weights is None or not self._fp8_weights.matches(*weights):
            self._fp8_weights = None  # the old copies go before the new ones are made
            self._fp8_weights = quantize_expert_weights(*weights, fp8=self.fp8)
        return self._fp8_weights


def transformers_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor,
                                 top_k_index: torch.Tensor,
                                 top_k_weights: torch.Tensor) -> torch.Tensor:
    """The forward of a transformers experts module, through `moe_experts`.

    An entry for transformers' `ExpertsInterface` (transformers 5): it runs
    the module's `gate_up_proj`, `down_proj` and their biases (where its
    `has_bias` says), in the layout its `is_transposed` and `is_concatenated`
    flags give, for SwiGLU experts (Qwen3-MoE, Mixtral, DeepSeek, OLMoE, ...)
    and gpt-oss's (`GptOssExperts` with its alpha 1.702 and limit 7.0, run with
    `activation="gpt_oss"`):

        from transformers.integrations.moe import ExpertsInterface
        ExpertsInterface.register("gg_runtime", gg_runtime.transformers_experts_forward)
        model.config._experts_implementation = "gg_runtime"

    Ids transformers uses as expert-parallel sentinels (>= the number of
    experts) are dropped slots, as in its grouped_mm implementation.

    Args:
        module: the model's experts module.
        hidden_states: `[T, H]` tokens.
        top_k_index: `[T, k]` expert ids.
        top_k_weights: `[T, k]` routing weights.

    Returns:
        `[T, H]` in hidden_states' dtype.

    Raises:
        TypeError: a module without `gate_up_proj` and `down_proj`.
        ValueError: experts without a gate, with their own gating, with an
            activation other than SiLU, or a GptOssExperts whose alpha and
            limit differ from 1.702 and 7.0.
    """
    activation = _activation_of(module)
    if not (hasattr(module, "gate_up_proj") and hasattr(module, "down_proj")):
        raise TypeError(f"module must be a transformers experts module (gate_up_proj and "
                        f"down_proj), got {type(module).__name__}")
    transposed = getattr(module, "is_transposed", False)
    weights = [module.gate_up_proj, module.down_proj]
    w13, w2 = (w.mT if transposed else w for w in weights)
    has_bias = getattr(module, "has_bias", False)
    return moe_experts(hidden_states, top_k_index, top_k_weights, w13, w2,
                       gate_up="concatenated" if getattr(module, "is_concatenated", True)
                       else "interleaved", activation=activation,
                       b13=module.gate_up_proj_bias if has_bias else None,
                       b2=module.down_proj_bias if has_bias else None)


def _activation_of(module) -> str:
    """moe_experts' activation for a transformers experts module, or a ValueError."""
    name = type(module).__name__
    apply_gate = getattr(type(module), "_apply_gate", None)
    own_gate = getattr(apply_gate, "__name__", "_default_apply_gate") != "_default_apply_gate"
    if name == "GptOssExperts":
        constants = (getattr(module, "alpha", None), getattr(module, "limit", None))
        if constants != (GPT_OSS_ALPHA, GPT_OSS_LIMIT):
            raise ValueError(f"{name}: moe_experts runs gpt-oss's activation with alpha "
                             f"{GPT_OSS_ALPHA} and limit {GPT_OSS_LIMIT}, this module has "
                             f"(alpha, limit) = {constants}")
        return "gpt_oss"
    if not getattr(module, "has_gate", True) or own_gate:
        raise ValueError(f"{name}: moe_experts runs SwiGLU experts (silu(gate) * up) and "
                         f"gpt-oss's, not this module's own gating")
    activation = getattr(module, "act_fn", None)
    if activation is not None and type(activation).__name__ not in ("SiLU", "SiLUActivation"):
        raise ValueError(f"{name}: moe_experts runs SwiGLU experts only, this module's "
                         f"activation is {type(activation).__name__}")
    return "swiglu"
