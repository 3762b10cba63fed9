"""moe_experts with fp8 expert weights: the weights and scales made from 16-bit
ones, data that fp8 holds exactly, a float64 reference of the forward that
quantizes the activations as the implementation does
(csrc/ops/expert_products_fp8.cc), and the exact layer of the weights the fp8
ones stand for (what quantizing the activations costs).

The reference mirrors each of the implementation's steps:
1. each token's row quantized as the weights' scales say: per 128 columns
   (`"1x128"`) for 128 x 128 weight blocks, per row (`"rowwise"`) for
   per-channel weights;
2. up projection in float64 on the dequantized operands (+ b13 rounded to
   bfloat16), not rounded (the kernel's epilogue reads its float32 sums);
3. the activation (gated_activation) in float64;
4. that output quantized per 128 columns (`"1x128"`, whatever the weights'
   scales: the up projection's epilogue quantizes it so), the down
   projection on it in float64 (+ b2 rounded to bfloat16), rounded to
   bfloat16 as the fp8 products write it;
5. each token's k rows weighted (the routing weights in float32, as the
   combine reads them) and summed in float64.

Quantization by quantize_ref, not by the implementation's own quantize_fp8:
on CUDA tensors quantize_ref gives quantize_fp8's bits exactly (the formula
and its float32 roundings; tests/runtime/test_gpu_quantize.py compares them
bit for bit), so on the tokens' rows the reference agrees with the kernels
exactly, while a wrong quantization kernel cannot agree with itself.  The
activation's output h is the reference's own (the implementation keeps its
h): the kernel computes it in float32 from the fp8 tensor cores'
reduced-precision sums (use_fast_accum), so an element of h that lies near
an e4m3 rounding boundary may quantize one step apart (and, being its
block's largest, move the block's scale).  On normal data these steps cost
a few times the output's own rounding; on data made by exactly_quantized the
up projection is exact, and only the activation's float32 rounding remains.
Dequantization is exact: an e4m3 value times a float32 scale has at most 28
significant bits.
"""
from __future__ import annotations

import torch

from ..api import quantize_fp8
from ..formats import FP8_WEIGHT_SCALINGS, ROW_BLOCKS, Quantized
from .fp8 import FP8_BLOCK, quantize_ref
from .moe_layers import gated_activation

# The fp8 weights' formats: 128 x 128 blocks, per output channel.
KINDS = tuple(FP8_WEIGHT_SCALINGS)
# The down projection's input, SwiGLU's output, whatever the weights' scales.
H_GRANULARITY = ROW_BLOCKS


def fp8_experts(w13: torch.Tensor, w2: torch.Tensor, kind: str):
    """(w13, w2) quantized, each a Quantized in float8_e4m3fn and float32,
    from 16-bit expert weights `[E, 2I, H]` and `[E, H, I]` by
    gg_runtime.quantize_fp8: kind `"128x128"`, scales `[E, ceil(N/128),
    ceil(K/128)]`, or `"rowwise"`, `[E, N]` (CUDA tensors on an sm90 GPU)."""
    return quantize_fp8(w13, kind), quantize_fp8(w2, kind)


def exactly_quantized(shape, granularity: str, scale: float = 1.0, dtype=torch.bfloat16,
                      device="cuda") -> torch.Tensor:
    """Random data that fp8 holds exactly: integers in [-7, 7] times `scale`
    (a power of two) times a random power of two (1/2, 1 or 2) per block of
    `granularity` ("rowwise", "1x128", "128x128"), each block holding a +-7.
    quantize_fp8 maps it to 64 times those integers without rounding, and the
    fp8 tensor cores sum the products of two such operands exactly despite
    their reduced-precision accumulation (multiples of one unit, at most 49
    units each, of random signs: partial sums stay far below 2**13 units).
    A product of the two then leaves a reference no rounding to disagree on
    but that of its output."""
    ints = torch.randint(-7, 8, shape, device=device, dtype=torch.float64)
    rows = FP8_BLOCK if granularity == "128x128" else 1
    cols = max(shape[-1], 1) if granularity == "rowwise" else FP8_BLOCK
    corners = ints[..., ::rows, ::cols]
    corners.copy_(7 * (2 * torch.randint(0, 2, corners.shape, device=device) - 1))
    exponents = torch.randint(-1, 2, corners.shape, device=device)
    return dequantize64(ints, scale * 2.0 ** exponents, granularity).to(dtype)




def dequantize64(q: torch.Tensor, scale: torch.Tensor, granularity: str) -> torch.Tensor:
    """q * scale in float64, exactly, for quantize_fp8's layouts: `"rowwise"`
    (scale [..., R] or [..., R, 1]), `"1x128"` or `"128x128"`; q 2-D or 3-D."""
    scale = scale.double()
    if granularity == "rowwise":
        full = scale.reshape(*q.shape[:-1], 1)
    else:
        rows = FP8_BLOCK if granularity == "128x128" else 1
        full = scale.repeat_interleave(rows, -2).repeat_interleave(FP8_BLOCK, -1)
        full = full[..., :q.shape[-2], :q.shape[-1]]
    return q.double() * full


def dequantized_experts(w13: Quantized, w2: Quantized):
    """(w13, w2) in float64: the weights the fp8 ones stand for."""
    return tuple(dequantize64(*w) for w in (w13, w2))


def moe_experts_fp8_ref(x, topk_ids, topk_weights, w13, w2, b13=None, b2=None,
                        gate_up="concatenated", activation="swiglu") -> torch.Tensor:
    """moe_experts with fp8 weights (its arguments; x in 16 bits) in float64
    with the implementation's quantization and roundings (the module's
    docstring): `[T, H]` float64 on x's device."""
    return _layer(x, topk_ids, topk_weights, *dequantized_experts(w13, w2), b13, b2, gate_up,
                  activation, FP8_WEIGHT_SCALINGS[w13.format].rows)


def one_step_changes(x, topk_ids, topk_weights, w13, w2, b13=None, b2=None,
                     gate_up="concatenated", activation="swiglu") -> torch.Tensor:
    """Each token's largest output change (2-norm, float64 `[T]`) that moving
    one element of one of its slots' quantized activation output one e4m3
    step would make: what the implementation's float32 activation may do to
    an element the reference's float64 one puts by a rounding boundary."""
    changes = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    _layer(x, topk_ids, topk_weights, *dequantized_experts(w13, w2), b13, b2, gate_up,
           activation, FP8_WEIGHT_SCALINGS[w13.format].rows, changes)
    return changes


def e4m3_steps(h: torch.Tensor, granularity: str) -> torch.Tensor:
    """The e4m3 step (the larger of the two about each value) of every element
    of h quantized by `granularity`, in h's units: float64, h's shape."""
    q, scale = quantize_ref(h, granularity)
    binade = torch.floor(torch.log2(q.double().abs().clamp(min=2.0 ** -6)))
    return dequantize64(2.0 ** (binade - 3), scale, granularity)


def dequantized_layer(x, topk_ids, topk_weights, w13, w2, b13=None, b2=None,
                      gate_up="concatenated", activation="swiglu") -> torch.Tensor:
    """The layer of the weights the fp8 ones stand for, exactly: float64, the
    activations neither quantized nor rounded (what a 16-bit layer on the
    dequantized weights approximates): `[T, H]` float64."""
    return _layer(x, topk_ids, topk_weights, *dequantized_experts(w13, w2), b13, b2, gate_up,
                  activation, None)


def _layer(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up, activation, granularity,
           changes=None):
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) in float64 over
    float64 weights, expert by expert (ids outside [0, E) add nothing).  With
    `granularity` x is quantized by it, the activation's output by
    H_GRANULARITY, and the biases and the down projection's output are
    rounded to bfloat16; None: exact.  `changes` (float64 [T]) gets each
    token's one_step_changes."""
    def rounded(t):
        return t if granularity is None else t.to(torch.bfloat16).double()

    def quantized(t, how):
        return t if granularity is None else dequantize64(*quantize_ref(t, how), how)

    def product(rows, weight, bias):
        return rows @ weight.T + (0 if bias is None else rounded(bias.double()))

    tokens = quantized(x.double(), granularity)
    weights = topk_weights.float().double()
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in range(w13.shape[0]):
        token, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        gu = product(tokens[token], w13[e], None if b13 is None else b13[e])
        h = gated_activation(gu, gate_up == "interleaved", activation)
        y = rounded(product(quantized(h, H_GRANULARITY), w2[e], None if b2 is None else b2[e]))
        out.index_add_(0, token, y * weights[token, slot, None])
        if changes is not None and len(token):
            # w2's column norms as its transpose's row norms: torch's float64
            # reduction down the columns of a large matrix reads scratch it
            # never wrote (initcheck's reports, docs/notes).
            column_norms = w2[e].T.contiguous().norm(dim=1)
            one_step = (e4m3_steps(h, H_GRANULARITY) * column_norms).amax(dim=1)
            changes.index_reduce_(0, token, one_step * weights[token, slot].abs(), "amax")
    return out
