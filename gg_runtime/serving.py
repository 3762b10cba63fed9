"""Entry points in the conventions of serving engines, on moe_experts."""
from __future__ import annotations

import torch

from ._native import check_types
from .formats import INT4, INT4_GROUPS, ROWWISE, SQUARE_BLOCKS, Quantized
from .moe import moe_experts
from .moe.stages import mapped_ids

_BLOCK_SHAPE = [128, 128]


def fused_experts(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, inplace: bool = False,
                  activation: str = "silu", apply_router_weight_on_input: bool = False,
                  use_fp8_w8a8: bool = False, per_channel_quant: bool = False,
                  global_num_experts: int = -1, expert_map: torch.Tensor | None = None,
                  w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                  a1_scale: torch.Tensor | None = None, a2_scale: torch.Tensor | None = None,
                  block_shape: list[int] | None = None, use_int4_w4a16: bool = False,
                  w1_zp: torch.Tensor | None = None,
                  w2_zp: torch.Tensor | None = None) -> torch.Tensor:
    """vLLM's `fused_experts` (its keyword form), run by `moe_experts`.

    A server that calls vLLM's Triton `fused_experts` for fp8 w8a8 or int4
    w4a16 MoE layers can call this with the same arguments; nothing is
    compiled at run time. For DeepSeek-V3's format:

        out = gg_runtime.fused_experts(x, w13, w2, topk_weights, topk_ids,
                                       use_fp8_w8a8=True, w1_scale=w13_scale_inv,
                                       w2_scale=w2_scale_inv, block_shape=[128, 128])

    `gg_runtime.quantize_fp8(w, "128x128")` (or `"rowwise"` with
    `per_channel_quant=True`) makes such weights and scales from 16-bit ones.
    For symmetric INT4 weights in groups of 32 or 128 (vLLM's uint4b8: q + 8
    in each nibble, two a byte along K, no zero points), bfloat16 tokens:

        out = gg_runtime.fused_experts(x, w13, w2, topk_weights, topk_ids,
                                       use_int4_w4a16=True, w1_scale=w13_scale,
                                       w2_scale=w2_scale, block_shape=[0, 32])

    Args:
        hidden_states: `[T, H]`, float16 or bfloat16.
        w1: `[E, 2I, H]`, each expert's gate rows then up rows (vLLM's w13);
            int4 w4a16: `[E, 2I, H/2]` uint8.
        w2: `[E, H, I]`; int4 w4a16: `[E, H, I/2]` uint8.
        topk_weights: `[T, k]`, the routing weights (any floating dtype).
        topk_ids: `[T, k]`, int32 or int64; with expert_map, global ids.
        inplace: write the result into hidden_states too (and return it).
        activation: `"silu"` (`silu(gate) * up`), the one supported.
        apply_router_weight_on_input: must be False (the weights apply to
            each expert's output, as vLLM's default).
        use_fp8_w8a8: True for float8_e4m3fn weights (w1_scale and w2_scale
            given); False for 16-bit weights (no scales).
        per_channel_quant: per-output-channel weight scales (`[E, N]` or
            `[E, N, 1]`) with per-token activation scales; False: 128 x 128
            blocks (block_shape).
        global_num_experts: the experts of the whole layer (-1: w1's E).
        expert_map: None, or int `[global_num_experts]`: each global
            expert's local index in w1 / w2, -1 where another rank holds it
            (its slots are dropped: they add nothing).
        w1_scale: w1's float32 scales: `[E, ceil(2I/128), ceil(H/128)]` or
            per channel; int4 w4a16: bfloat16 `[E, 2I, H/group]`.
        w2_scale: w2's float32 scales: `[E, ceil(H/128), ceil(I/128)]` or
            per channel; int4 w4a16: bfloat16 `[E, H, I/group]`.
        a1_scale: must be None (activations are quantized dynamically).
        a2_scale: must be None.
        block_shape: fp8: `[128, 128]` or None (blockwise: the scales' shapes
            say it); int4 w4a16: `[0, group]`, group 32 or 128.
        use_int4_w4a16: True for symmetric INT4 weights with bfloat16 scales
            (w1_scale and w2_scale given), bfloat16 tokens.
        w1_zp: must be None (symmetric weights only).
        w2_zp: must be None.

    Returns:
        `[T, H]` in hidden_states' dtype.

    Raises:
        ValueError: an argument this entry does not support (named);
            global_num_experts other than -1 or w1's E without expert_map;
            or any error of `moe_experts`.
        TypeError: an argument of the wrong type (named), or as `moe_experts`.

    The errors `moe_experts` raises name its arguments: `x` for
    hidden_states, `w13` (`w13.values`) for w1, `w13.scales` and `w2.scales`
    for w1_scale and w2_scale, `topk_ids` for the local ids made through
    expert_map.
    """
    check_types(tensors=(("hidden_states", hidden_states), ("w1", w1), ("w2", w2),
                         ("topk_weights", topk_weights), ("topk_ids", topk_ids)),
                optional=(("expert_map", expert_map), ("w1_scale", w1_scale),
                          ("w2_scale", w2_scale), ("a1_scale", a1_scale), ("a2_scale", a2_scale),
                          ("w1_zp", w1_zp), ("w2_zp", w2_zp)),
                flags=(("inplace", inplace),
                       ("apply_router_weight_on_input", apply_router_weight_on_input),
                       ("use_fp8_w8a8", use_fp8_w8a8), ("per_channel_quant", per_channel_quant),
                       ("use_int4_w4a16", use_int4_w4a16)),
                ints=(("global_num_experts", global_num_experts),))
    _check_supported(activation, apply_router_weight_on_input, a1_scale, a2_scale, w1_zp, w2_zp)
    if use_fp8_w8a8 and use_int4_w4a16:
        raise ValueError("use_fp8_w8a8 and use_int4_w4a16 cannot both be True")
    quantized = use_fp8_w8a8 or use_int4_w4a16
    scales_given = (w1_scale is not None, w2_scale is not None)
    if scales_given != (quantized, quantized):
        raise ValueError("use_fp8_w8a8=True or use_int4_w4a16=True goes with w1_scale and "
                         "w2_scale (quantized weights), both False with neither; got "
                         f"use_fp8_w8a8={use_fp8_w8a8}, use_int4_w4a16={use_int4_w4a16}, "
                         f"w1_scale {'given' if scales_given[0] else 'None'}, w2_scale "
                         f"{'given' if scales_given[1] else 'None'}")
    if use_int4_w4a16:
        _check_int4(w1, w1_scale, block_shape, per_channel_quant)
    else:
        _check_fp8_block_shape(block_shape, per_channel_quant)
    if expert_map is not None:
        topk_ids = _local_ids(topk_ids, expert_map, global_num_experts)
    elif global_num_experts not in (-1, w1.shape[0]):
        raise ValueError(f"global_num_experts = {global_num_experts} needs an expert_map (its "
                         f"ids would index w1's {w1.shape[0]} experts); without one it must be "
                         "-1 or w1's E")
    if quantized:
        weight_format = INT4 if use_int4_w4a16 else ROWWISE if per_channel_quant else SQUARE_BLOCKS
        w1, w2 = Quantized(w1, w1_scale, weight_format), Quantized(w2, w2_scale, weight_format)
    out = moe_experts(hidden_states, topk_ids, topk_weights, w1, w2)
    return hidden_states.copy_(out) if inplace else out


def _check_supported(activation, apply_router_weight_on_input, a1_scale, a2_scale, w1_zp, w2_zp):
    if activation != "silu":
        raise ValueError(f"activation must be 'silu', got {activation!r}")
    if apply_router_weight_on_input:
        raise ValueError("apply_router_weight_on_input=True is not supported")
    if a1_scale is not None or a2_scale is not None:
        raise ValueError("a1_scale and a2_scale must be None: activations are quantized "
                         "dynamically (per token per 128 columns, or per token)")
    if w1_zp is not None or w2_zp is not None:
        raise ValueError("w1_zp and w2_zp must be None: symmetric int4 weights only")


def _check_block_shape_type(block_shape):
    if block_shape is not None and not isinstance(block_shape, (list, tuple)):
        raise TypeError(f"block_shape must be a list or None, got {type(block_shape).__name__}")


def _check_fp8_block_shape(block_shape, per_channel_quant):
    _check_block_shape_type(block_shape)
    if block_shape is not None and (per_channel_quant or list(block_shape) != _BLOCK_SHAPE):
        raise ValueError(f"block_shape must be {_BLOCK_SHAPE} (or None with per_channel_quant), "
                         f"got {block_shape}")


def _check_int4(w1, w1_scale, block_shape, per_channel_quant):
    """int4 w4a16's block_shape, [0, group], says the scales' group."""
    _check_block_shape_type(block_shape)
    if per_channel_quant or block_shape is None or len(block_shape) != 2 or \
            block_shape[0] != 0 or block_shape[1] not in INT4_GROUPS:
        raise ValueError(f"use_int4_w4a16=True needs block_shape [0, group] with group in "
                         f"{INT4_GROUPS} and per_channel_quant=False, got {block_shape}")
    if w1.dtype != torch.uint8 or w1_scale.dtype != torch.bfloat16 or w1_scale.dim() != 3 or \
            w1.dim() != 3 or w1_scale.shape[-1] * block_shape[1] != 2 * w1.shape[-1]:
        raise ValueError(f"use_int4_w4a16=True takes w1 uint8 [E, 2I, H/2] and w1_scale bfloat16 "
                         f"[E, 2I, H/{block_shape[1]}], got w1 {w1.dtype} {tuple(w1.shape)} and "
                         f"w1_scale {w1_scale.dtype} {tuple(w1_scale.shape)}")


def _local_ids(topk_ids, expert_map, global_num_experts):
    """Global expert ids to local ones through expert_map (-1: another rank's);
    ids outside [0, global experts) stay dropped slots (-1), as moe_experts
    drops them, read on the GPU without a host sync."""
    for name, ids in (("expert_map", expert_map), ("topk_ids", topk_ids)):
        if ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {ids.dtype}")
    if expert_map.dim() != 1:
        raise ValueError(f"expert_map must be 1-D, got shape {tuple(expert_map.shape)}")
    experts = expert_map.shape[0]
    if global_num_experts not in (-1, experts):
        raise ValueError(f"expert_map must have global_num_experts = {global_num_experts} "
                         f"entries, got {experts}")
    return mapped_ids(topk_ids, expert_map.to(topk_ids.device))
