"""OpenAI's triton_kernels MoE with MXFP4 weights, gpt-oss's layer as vLLM
0.33 runs it on Hopper (its TRITON MXFP4 backend), for the w4_experts bench
section's anchor: the triton_kernels package vLLM ships (bench/vendor_vllm.py
copies it; its API is Triton 3.5.1's, JIT-compiled by this process's Triton)
driven by a host path written here.

It follows vLLM 0.33's gpt_oss_triton_kernels_moe and its MXFP4 weight
swizzle for sm90: at load, split_k held at 1, each weight's scales padded to a
multiple of 4 groups along K, values and scales transposed to K-major and
converted to triton_kernels' default MXFP4 layouts for this GPU; each call:
`routing` (top-k of the router's logits, a softmax over the k, the slots
sorted by expert), matmul_ogs for w13 gathering the tokens with gpt-oss's
SwiGLU fused (alpha 1.702, limit 7; gate and up interleaved), matmul_ogs for
w2 weighting each slot by its gate and summing a token's k slots as it
scatters them.  No biases (the bench's layers have none).
"""
from __future__ import annotations

import importlib
from typing import NamedTuple

import torch

# gpt-oss's SwiGLU: the gate clamped at LIMIT from above, the up half to
# [-LIMIT, LIMIT], gate * sigmoid(ALPHA * gate) * (up + 1).
ALPHA, LIMIT = 1.702, 7.0
# vLLM's swizzle for sm90 pads each weight's scale groups along K to a
# multiple of this (its patch for triton_kernels' issue 47303).
SCALE_GROUPS_ALIGN = 4
# Warps the Hopper scale layout is made for (vLLM's _swizzle_mxfp4 default).
SCALE_LAYOUT_WARPS = 8


class Experts(NamedTuple):
    """One layer's MXFP4 weights in triton_kernels' layouts."""
    w13: object  # triton_kernels Tensor [E, H, 2I], FP4
    w2: object  # [E, I, H]
    w13_precision: object  # its PrecisionConfig (the swizzled scales)
    w2_precision: object


def modules(triton_kernels) -> dict:
    """The triton_kernels submodules the host path calls, by short name."""
    names = ("matmul_ogs", "routing", "swiglu", "numerics", "tensor", "tensor_details.layout",
             "matmul_ogs_details.opt_flags")
    return {name.split(".")[-1]: importlib.import_module(f"{triton_kernels.__name__}.{name}")
            for name in names}


def swizzled(tk: dict, weight):
    """(values, PrecisionConfig) of one MXFP4 weight, a gg_runtime Quantized
    [E, N, K] (values [E, N, K/2] two a byte, scales [E, N, K/32] e8m0), in
    triton_kernels' layouts for this GPU, K-major as matmul_ogs reads it."""
    layout, tensor = tk["layout"], tk["tensor"]
    values = weight.values.view(torch.uint8).transpose(-2, -1)
    scales = weight.scales.view(torch.uint8)
    scales = torch.nn.functional.pad(scales, (0, -scales.shape[-1] % SCALE_GROUPS_ALIGN))
    value_layout, value_options = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_options = layout.make_default_matmul_mxfp4_w_scale_layout(
        mx_axis=1, num_warps=SCALE_LAYOUT_WARPS)
    values = tensor.convert_layout(tensor.wrap_torch_tensor(values, dtype=tensor.FP4),
                                   value_layout, **value_options)
    scales = tensor.convert_layout(tensor.wrap_torch_tensor(scales.transpose(-2, -1)),
                                   scale_layout, **scale_options)
    matmul = tk["matmul_ogs"]
    flex = matmul.FlexCtx(rhs_data=tk["numerics"].InFlexData())
    return values, matmul.PrecisionConfig(weight_scale=scales, flex_ctx=flex)


def load_experts(tk: dict, w13, w2) -> Experts:
    """The layer's weights swizzled once, as vLLM does at load on sm90 (its
    split_k constraint set in the process, as vLLM sets it)."""
    tk["opt_flags"].update_opt_flags_constraints({"split_k": 1})
    (w13_values, w13_precision), (w2_values, w2_precision) = swizzled(tk, w13), swizzled(tk, w2)
    return Experts(w13_values, w2_values, w13_precision, w2_precision)


def route(tk: dict, logits: torch.Tensor, top_k: int) -> tuple:
    """(RoutingData, GatherIndx, ScatterIndx) of logits [T, E]: each token's
    top k, their weights a softmax over the k."""
    return tk["routing"].routing(logits, top_k, sm_first=False)


def experts_forward(tk: dict, x: torch.Tensor, experts: Experts, routed: tuple) -> torch.Tensor:
    """[T, H]: the two matmul_ogs launches of the layer on routed tokens."""
    matmul = tk["matmul_ogs"]
    routing_data, gather, scatter = routed
    swiglu = matmul.FusedActivation(
        matmul.FnSpecs("swiglu", tk["swiglu"].swiglu_fn, ("alpha", "limit")), (ALPHA, LIMIT), 2)
    h = matmul.matmul_ogs(x, experts.w13, None, routing_data, gather_indx=gather,
                          precision_config=experts.w13_precision, fused_activation=swiglu)
    y = matmul.matmul_ogs(h, experts.w2, None, routing_data, scatter_indx=scatter,
                          precision_config=experts.w2_precision, gammas=routing_data.gate_scal)
    return y.view(x.shape[0], -1)


def forward(tk: dict, x: torch.Tensor, logits: torch.Tensor, top_k: int,
            experts: Experts) -> torch.Tensor:
    """[T, H]: the layer from the router's logits, routing included, as vLLM
    calls it."""
    return experts_forward(tk, x, experts, route(tk, logits, top_k))
