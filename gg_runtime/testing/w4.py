"""moe_experts with 4-bit expert weights (MXFP4, INT4): random weights and
scales, the values they stand for, and a float64 reference of the forward
with the implementation's roundings (csrc/ops/expert_products_w4.cc): the
weights widened as the kernels widen them (MXFP4 exactly: an e2m1 value
times a power of two is a 16-bit value; INT4's q * scale rounded once to
bfloat16), the up projection in float64 (+ b13), the activation in
float64, h rounded to x's dtype (the up projection stores it so), the down
projection in float64 (+ b2) rounded to x's dtype (its rows are stored so),
each token's k rows weighted (float32 weights) and summed in float64.

At prefill moe_experts widens MXFP4 weights to fp8 and runs its fp8
products on them (W4A8): widened_fp8 gives the fp8 weights it makes, for
gg_runtime.testing.moe_fp8's reference."""
from __future__ import annotations

import torch

from ..formats import INT4, MXFP4, MXFP4_GROUP, SQUARE_BLOCKS, Quantized
from .fp8 import FP8_BLOCK
from .moe_layers import gated_activation

# e2m1's 16 values by their 4 bits (sign, 2 exponent bits, 1 mantissa bit).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def random_mxfp4(experts: int, n: int, k: int, exponents=(118, 124), device="cuda",
                 generator=None):
    """A Quantized in MXFP4 (values [E, N, K/2] float4_e2m1fn_x2, scales
    [E, N, K/32] float8_e8m0fnu): every byte of values drawn uniformly, the
    scales' exponents uniformly in [exponents[0], exponents[1]] (2 ** (e -
    127))."""
    values = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, device=device,
                           generator=generator)
    scales = torch.randint(exponents[0], exponents[1] + 1, (experts, n, k // MXFP4_GROUP),
                           dtype=torch.uint8, device=device, generator=generator)
    return Quantized(values.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e8m0fnu),
                     MXFP4)


def dequantize_mxfp4(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The weights [E, N, K] in float64 that MXFP4 values and scales stand for."""
    packed = values.view(torch.uint8)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=packed.device)
    low, high = table[(packed & 15).long()], table[(packed >> 4).long()]
    weights = torch.stack((low, high), dim=-1).flatten(-2)
    exponents = scales.view(torch.uint8).double()
    scale = torch.where(exponents == 255, float("nan"), torch.exp2(exponents - 127))
    return weights * scale.repeat_interleave(MXFP4_GROUP, dim=-1)


def random_int4(experts: int, n: int, k: int, group: int = 32, device="cuda", generator=None):
    """A Quantized in INT4 (values [E, N, K/2] uint8, every byte uniform (q +
    8 in each nibble), scales [E, N, K/group] bfloat16 uniform in [2^-7,
    2^-5))."""
    values = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, device=device,
                           generator=generator)
    scales = torch.rand(experts, n, k // group, device=device, generator=generator) * 3 + 1
    return Quantized(values, (scales * 2.0 ** -7).bfloat16(), INT4)


def dequantize_int4(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The weights [E, N, K] in float64 that INT4 values (stored q + 8) and
    bfloat16 scales stand for, exactly (q * scale)."""
    q = torch.stack(((values & 15).double(), (values >> 4).double()), dim=-1).flatten(-2) - 8
    return q * scales.double().repeat_interleave(q.shape[-1] // scales.shape[-1], dim=-1)


def widened(w: Quantized) -> torch.Tensor:
    """The weights [E, N, K] of w (MXFP4 or INT4) as the kernels widen them,
    in float64: MXFP4's exact values, INT4's rounded once to bfloat16."""
    if w.format == INT4:
        return dequantize_int4(w.values, w.scales).bfloat16().double()
    return dequantize_mxfp4(w.values, w.scales)


# The binades a widened block's scale lies below its largest e8m0 exponent's
# 2^(e - 127): 6, so that e2m1's largest, 6, becomes 384 (e4m3's is 448).
FP8_HEADROOM = 6


def widened_fp8(w: Quantized) -> Quantized:
    """MXFP4 weights [E, N, K] as moe_experts widens them to fp8 at prefill:
    128 x 128 blocks, each scaled 2^(top - 127 - 6), top its largest e8m0
    exponent (NaN's 255 aside), the values over that scale rounded to
    float8_e4m3fn by torch (exact within 14 binades of the top)."""
    exponents = w.scales.view(torch.uint8).int()
    experts, n, groups = exponents.shape
    rows, per_block = -n % FP8_BLOCK, FP8_BLOCK // MXFP4_GROUP
    padded = torch.nn.functional.pad(torch.where(exponents == 255, 0, exponents),
                                     (0, -groups % per_block, 0, rows))
    top = padded.reshape(experts, padded.shape[1] // FP8_BLOCK, FP8_BLOCK,
                         padded.shape[2] // per_block, per_block).amax(dim=(2, 4))
    scale = torch.exp2((top - 127 - FP8_HEADROOM).double())
    full = scale.repeat_interleave(FP8_BLOCK, 1).repeat_interleave(FP8_BLOCK, 2)
    values = dequantize_mxfp4(w.values, w.scales)
    q = (values / full[:, :n, :values.shape[2]]).to(torch.float8_e4m3fn)
    return Quantized(q, scale.float(), SQUARE_BLOCKS)


def moe_experts_w4_ref(x, topk_ids, topk_weights, w13, w2, b13=None, b2=None,
                       gate_up="concatenated", activation="swiglu") -> torch.Tensor:
    """moe_experts with 4-bit weights (its arguments) in float64 with the
    implementation's roundings (the module's docstring): `[T, H]` float64."""
    w13_64, w2_64 = widened(w13), widened(w2)
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in range(w13_64.shape[0]):
        token, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        gu = x[token].double() @ w13_64[e].T + (0 if b13 is None else b13[e].double())
        h = gated_activation(gu, gate_up == "interleaved", activation).to(x.dtype).double()
        y = (h @ w2_64[e].T + (0 if b2 is None else b2[e].double())).to(x.dtype).double()
        out = out.index_add(0, token, y * topk_weights[token, slot, None].float().double())
    return out
