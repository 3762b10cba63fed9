"""moe_experts: its arguments' checks and its three modes' host paths (16-bit
weights, fp8 weights served, fp8 training recipes)."""
from __future__ import annotations

import torch

from .._native import OPS, call, check_types
from ..formats import (FP8_WEIGHT_SCALINGS, GRANULARITIES, MXFP4_BYTE_DTYPES, RECIPES,
                       WEIGHT_FORMATS, Quantized)
from ..fp8_expert_weights import Fp8ExpertWeights
from .choices import check_choices
from .differentiable import ExpertsFunction, fp8_forward
from .inputs import MoeInputs

# The arguments a gradient can be asked of, by MoeInputs' names.
_DIFFERENTIABLE = ("x", "topk_weights", "w13", "w2", "b13", "b2")


def _experts_forward(inputs: MoeInputs, out: torch.Tensor | None = None, *quantized):
    """The forward in one operator (torch.ops.gg_runtime.moe_experts,
    csrc/ops/moe_experts.cc: every check of the arguments, the routing, both
    projections, the combine); written into `out` where given
    (moe_experts_into).  `quantized`: the weights' format and the scales."""
    if out is None:
        return call(OPS.moe_experts.default, *inputs, *quantized)
    call(OPS.moe_experts_into.default, out, *inputs, *quantized)
    return out


def moe_experts(x: torch.Tensor | Quantized, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor, w13: torch.Tensor | Quantized,
                w2: torch.Tensor | Quantized, *, gate_up: str = "concatenated",
                activation: str = "swiglu", b13: torch.Tensor | None = None,
                b2: torch.Tensor | None = None,
                fp8: str | Fp8ExpertWeights | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
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
    k from 1 up.  A token holding a NaN gets an output of NaNs in every
    format (fp8's quantization keeps it NaN, and gpt-oss's clamps do, as
    torch.clamp does; with fp8 an inf does too) and reaches no other token's
    output.

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
        x: `[T, H]`, the tokens, float16 or bfloat16 on a CUDA device; or,
            with fp8 weights, a `Quantized` of them in the layout the
            weights ask (below), as expert parallelism's fp8 dispatch
            delivers them.
        topk_ids: `[T, k]`, int32 or int64: each token's k experts.
        topk_weights: `[T, k]`, any floating dtype (converted to float32 for
            the combine): each slot's routing weight; its gradient comes back
            in this dtype.
        w13: `[E, 2I, H]` in x's dtype (with an fp8 recipe, or float32):
            each expert's gate and up projections in nn.Linear's `[out, in]`
            layout (transformers' `gate_up_proj`), or any strided view of
            that shape (a transposed `[E, H, 2I]` tensor, say); or those
            weights quantized, a `Quantized` (fp8 or 4-bit: below).
        w2: `[E, H, I]` in w13's dtype: the down projections, `[out, in]`
            (transformers' `down_proj`), or any strided view of that shape;
            or, with w13 quantized, a `Quantized` in w13's format.
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
        fp8: None, or an fp8 training recipe for 16-bit weights,
            `"blockwise"` or `"rowwise"` (see below), or w13 and w2
            quantized by one before (`quantize_expert_weights`).
        out: None, or a contiguous `[T, H]` tensor of the output's dtype on
            x's device, not overlapping x: the output is written there and
            returned (inference: refused where autograd records the call,
            and with an fp8 training recipe).

    fp8 weights (w13 and w2 each a `Quantized` in format `"128x128"` or
    `"rowwise"`, as `quantize_fp8` makes them from 16-bit weights: values
    float8_e4m3fn `[E, N, K]` with unit stride along K, fp8 tensor cores
    reading it K-major, and float32 scales, `[E, ceil(N/128), ceil(K/128)]`,
    one per 128 x 128 block of each expert's `[N, K]` (DeepSeek-V3's and
    vLLM's `block_shape=[128, 128]`), or `[E, N]` (`[E, N, 1]` too), one per
    output channel; `w ~ q * scale`): H and I multiples of 16. x's rows are
    quantized on the GPU as the weights ask: per token per 128 columns
    (`"1x128"`) for 128 x 128 blocks, per token (`"rowwise"`) for
    per-channel scales; or x is given so quantized (a `Quantized` in that
    layout, `quantize_fp8(x, "1x128")` or `"rowwise"`: the same values as
    x's 16-bit rows would give, the output then bfloat16). The activation's
    output (the down projection's input) is quantized per token per 128
    columns with either, in the up projection's epilogue;
    `scale = max(amax, 1e-12) / 448`. The products accumulate in float32 on
    the tensor cores, the blocks' scales applied per 128 columns of K; the
    activation reads the up projection's float32 sums and the down
    projection's rows are rounded to bfloat16. Inference only: with gradients
    enabled, an input that requires grad is refused. Both gate_up layouts,
    both activations, the biases (float32 too), dropped slots, T = 0 and
    CUDA-graph capture work as with 16-bit weights. The forward is the
    operator `torch.ops.gg_runtime.moe_experts` (`weight_format` the
    weights' format; sm90: H100, H200).

    4-bit weights (w13 and w2 each a `Quantized` in format `"mxfp4"` or
    `"int4"`: values `[E, N, K/2]`, each byte two values along K, the first
    in the low nibble, unit stride along K, rows 16-byte aligned; x
    bfloat16; inference only, as fp8 weights):
    MXFP4 (`torch.float4_e2m1fn_x2` or uint8 values, float8_e8m0fnu or
    uint8 scales `[E, N, K/32]`; `mxfp4_expert_weights` makes them from
    gpt-oss's checkpoint layout): OCP microscaling e2m1 values, each group
    of 32 along K scaled by `2 ** (e - 127)`, widened to bfloat16 exactly;
    INT4 (uint8 values, bfloat16 scales `[E, N, K/32]` or `[E, N, K/128]`;
    `int4_expert_weights` and `gptq_expert_weights` make them from
    compressed-tensors' and GPTQ's packings): symmetric integers `q` in
    -8 .. 7 stored as `q + 8`, each weight `q * scale` rounded once to
    bfloat16. H and I multiples of the scale group. The weights are widened
    in the kernels' K loops (W4A16): bfloat16 MMAs accumulating in float32,
    the activation's output and the down projection's rows rounded to
    bfloat16. Except at prefill with MXFP4 weights on sm90 (at least 64
    slots an expert on average): there every expert's weights are widened
    once a call to float8_e4m3fn in 128 x 128 blocks, exactly (each block
    scaled `2 ** (e_max - 133)`, e_max its largest scale byte; groups more
    than 14 binades below it rounded to nearest even), into a temporary of
    `E * 3 * H * I` bytes, and the fp8 weights' forward above runs on them
    (W4A8: the tokens and the activation's output quantized per token per
    128 columns). Both gate_up layouts, both activations, the biases, dropped
    slots, T = 0 and CUDA-graph capture work as with 16-bit weights. The
    forward is the operator `torch.ops.gg_runtime.moe_experts`
    (`weight_format` the weights' format; sm80 and sm90).

    fp8 training (`fp8="blockwise"` or `"rowwise"`, 16-bit or float32
    weights; sm90): every product of the forward and the backward runs in fp8
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
        `[T, H]` in x's dtype (out, where given).

    Raises:
        TypeError: an argument that is not a tensor (the biases: nor None;
            x, w13 and w2: nor a `Quantized`), or of a dtype that does not
            fit, naming it (with `fp8`: x not float16 or bfloat16, weights
            neither both of its dtype nor both float32, or a bias of
            neither's); quantized values (float8_e4m3fn, 4-bit) given as a
            plain tensor; one of w13 and w2 quantized and not the other.
        ValueError: an unknown gate_up or activation; shapes that do not fit
            `[T, H]`, `[T, k]`, `[E, 2I, H]`, `[E, H, I]`, `[E, 2I]`, `[E, H]`;
            tensors on different devices or not on a CUDA device; quantized
            weights: an unknown format, w13 and w2 in different formats,
            scales that do not fit the format, weights not K-major, an input
            that requires grad, x quantized in another layout than the
            weights ask or with weights that are not fp8, `fp8` given too;
            fp8 weights or `fp8`: H or I not multiples of 16; `fp8`: a value
            other than None, the recipes and an Fp8ExpertWeights; an
            Fp8ExpertWeights of other weights than w13 and w2, or of them
            before a change; out given where a gradient is wanted or with an
            fp8 training recipe, or not `[T, H]` of the output's dtype,
            contiguous, on x's device, apart from x.
        UnsupportedDeviceError: a GPU this wheel has no kernels for (fp8: any
            GPU but compute capability 9.0).
        CudaError: a driver or launch failure.
    """
    if isinstance(w13, Quantized) or isinstance(w2, Quantized) or isinstance(x, Quantized):
        return _served_experts(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation,
                               fp8, out)
    _check_types(x, topk_ids, topk_weights, w13, w2, b13, b2)
    check_choices(gate_up, activation)
    inputs = MoeInputs(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation)
    if out is not None:
        check_types(tensors=(("out", out),))
        if fp8 is not None or inputs.wants_gradient():
            raise ValueError("out is for inference: moe_experts takes it neither where a "
                             "gradient is wanted nor with an fp8 training recipe")
    if fp8 is not None:
        return _fp8_training_experts(inputs, fp8)
    if w13.dtype in _QUANTIZED_DTYPES or w2.dtype in _QUANTIZED_DTYPES:
        raise TypeError(f"w13 and w2 are {w13.dtype} and {w2.dtype}: quantized weights are "
                        "given as gg_runtime.Quantized values (values, scales, format), as "
                        "quantize_fp8 and the 4-bit converters return them")
    if inputs.wants_gradient():
        return ExpertsFunction.apply(*inputs, None, None)
    return _experts_forward(inputs, out)  # nothing to differentiate, nothing kept


# Values that are quantized, and mean nothing without their scales.
_QUANTIZED_DTYPES = (torch.float8_e4m3fn, torch.float4_e2m1fn_x2, torch.uint8)


def _served_experts(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation, fp8,
                    out):
    """moe_experts with quantized weights (fp8, or 4-bit: MXFP4, INT4), the
    tokens maybe quantized too: inference only; the weights' format is the
    operator's weight_format."""
    for name, w in (("w13", w13), ("w2", w2)):
        check_quantized(name, w, WEIGHT_FORMATS, "the weights")
    if w2.format != w13.format:
        raise ValueError(f"w13 and w2 must be in one format, got {w13.format!r} and "
                         f"{w2.format!r}")
    if fp8 is not None:
        raise ValueError(f"fp8={fp8!r} is a training recipe that quantizes 16-bit weights "
                         "itself; w13 and w2 are given quantized: give one or the other")
    x_scale = None
    if isinstance(x, Quantized):
        check_quantized("x", x, GRANULARITIES, "the tokens")
        scaling = FP8_WEIGHT_SCALINGS.get(w13.format)
        if scaling is None or x.format != scaling.rows:
            asked = "none (16-bit x)" if scaling is None else repr(scaling.rows)
            raise ValueError(f"x is quantized {x.format!r}, but weights in format "
                             f"{w13.format!r} ask for {asked}")
        x, x_scale = x.values, x.scales
    _check_types(x, topk_ids, topk_weights, w13.values, w2.values, b13, b2)
    check_choices(gate_up, activation)
    inputs = MoeInputs(x, topk_ids, topk_weights, w13.values, w2.values, b13, b2, gate_up,
                       activation)
    if torch.is_grad_enabled():
        named = (*((name, getattr(inputs, name)) for name in _DIFFERENTIABLE),
                 ("w13.scales", w13.scales), ("w2.scales", w2.scales), ("x.scales", x_scale))
        grad = [name for name, value in named if value is not None and value.requires_grad]
        if grad:
            raise ValueError(f"moe_experts with quantized weights is inference-only, but "
                             f"{grad[0]} requires grad (run it under torch.no_grad() or "
                             "torch.inference_mode(), or detach it)")
    if out is not None:
        check_types(tensors=(("out", out),))
    # 4-bit values and e8m0 scales as bytes: torch's stable ABI names neither dtype.
    weights = inputs._replace(w13=_bytes(inputs.w13), w2=_bytes(inputs.w2))
    return _experts_forward(weights, out, w13.format, _bytes(w13.scales), _bytes(w2.scales),
                            x_scale)


def check_quantized(name: str, q, formats, what: str):
    """A TypeError unless q is a Quantized of tensors, a ValueError unless
    its format is one of `formats` (`what` they are the formats of)."""
    if not isinstance(q, Quantized):
        raise TypeError(f"{name} must be a gg_runtime.Quantized (values, scales, format) where "
                        f"the weights or tokens are given quantized, got {type(q).__name__}")
    check_types(tensors=((f"{name}.values", q.values), (f"{name}.scales", q.scales)))
    if q.format not in formats:
        raise ValueError(f"{name}.format must be one of {formats} for {what}, got {q.format!r}")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """An MXFP4 value or scale tensor viewed as uint8 (others as they are:
    the operator names their dtype in its refusal)."""
    return t.view(torch.uint8) if t.dtype in MXFP4_BYTE_DTYPES else t


def _fp8_training_experts(inputs: MoeInputs, fp8):
    """moe_experts(fp8=...): the weights' checks that their quantization
    would hide (the operator checks the rest, naming the same arguments),
    then ExpertsFunction where a gradient is wanted, else the forward alone."""
    x, w13, w2, b13, b2 = inputs.x, inputs.w13, inputs.w2, inputs.b13, inputs.b2
    quantized = fp8 if isinstance(fp8, Fp8ExpertWeights) else None
    recipe = fp8.recipe if quantized is not None else fp8
    if recipe not in RECIPES:
        raise ValueError(f"fp8 must be None, one of {RECIPES} or an "
                         f"Fp8ExpertWeights, got {fp8!r}")
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
    if inputs.wants_gradient():
        return ExpertsFunction.apply(*inputs, recipe, quantized)
    return fp8_forward(inputs, recipe, False, quantized)


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
