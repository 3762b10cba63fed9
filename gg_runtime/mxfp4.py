"""MXFP4 expert weights served by moe_experts (W4A16): the layout its
kernels read, made once at load from a checkpoint's."""
from __future__ import annotations

import torch

from ._native import check_types
from .formats import MXFP4_GROUP

# Bytes a group of MXFP4_GROUP e2m1 values takes, two a byte.
_GROUP_BYTES = MXFP4_GROUP // 2


def mxfp4_expert_weights(blocks: torch.Tensor,
                         scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 expert weights in the layout `moe_experts` reads, from a checkpoint's.

    For one weight of every expert (w13 or w2). With gpt-oss's checkpoints
    as transformers loads them (`Mxfp4Config(dequantize=False)` keeps them
    packed):

        w13, w13_scale = gg_runtime.mxfp4_expert_weights(
            experts.gate_up_proj_blocks, experts.gate_up_proj_scales)
        w2, w2_scale = gg_runtime.mxfp4_expert_weights(
            experts.down_proj_blocks, experts.down_proj_scales)
        out = gg_runtime.moe_experts(x, ids, weights, w13, w2, w13_scale=w13_scale,
                                     w2_scale=w2_scale, gate_up="interleaved",
                                     activation="gpt_oss", b13=..., b2=...)

    Once, at load: a view where the tensors are contiguous, else one copy.

    Args:
        blocks: `[E, N, K/32, 16]` (transformers' `*_blocks`) or `[E, N,
            K/2]`, uint8 or float4_e2m1fn_x2: each expert's `[N, K]` weight
            (nn.Linear's `[out, in]`) as e2m1 values two a byte along K, the
            first of each pair in the low nibble (OCP's order).
        scales: `[E, N, K/32]`, uint8 or float8_e8m0fnu: each group of 32
            values' scale, `2 ** (byte - 127)` (255: NaN).

    Returns:
        The pair (values, scales), `[E, N, K/2]` float4_e2m1fn_x2 and `[E, N,
        K/32]` float8_e8m0fnu, contiguous, on blocks' device.

    Raises:
        TypeError: an argument that is not a tensor, or of another dtype.
        ValueError: shapes that do not fit each other.
    """
    check_types(tensors=(("blocks", blocks), ("scales", scales)))
    if blocks.dtype not in (torch.uint8, torch.float4_e2m1fn_x2):
        raise TypeError(f"blocks must be uint8 or float4_e2m1fn_x2, got {blocks.dtype}")
    if scales.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise TypeError(f"scales must be uint8 or float8_e8m0fnu, got {scales.dtype}")
    if blocks.dim() == 4 and blocks.shape[3] == _GROUP_BYTES:
        blocks = blocks.reshape(*blocks.shape[:2], -1) if blocks.is_contiguous() \
            else blocks.contiguous().flatten(2)
    if blocks.dim() != 3 or scales.dim() != 3 or scales.shape != (
            *blocks.shape[:2], blocks.shape[2] // _GROUP_BYTES) or blocks.shape[2] % _GROUP_BYTES:
        raise ValueError(f"blocks must be [E, N, K/32, 16] or [E, N, K/2] and scales [E, N, K/32] "
                         f"(K a multiple of 32), got {tuple(blocks.shape)} and "
                         f"{tuple(scales.shape)}")
    return (blocks.contiguous().view(torch.float4_e2m1fn_x2),
            scales.contiguous().view(torch.float8_e8m0fnu))
