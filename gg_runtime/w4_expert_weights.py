"""4-bit expert weights served by moe_experts (W4A16, MXFP4 and INT4): the
layout its kernels read, made once at load from a checkpoint's."""
from __future__ import annotations

import torch

from ._native import check_types
from .formats import INT4_GROUPS, MXFP4_GROUP

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
        blocks = blocks.flatten(2)  # a view where contiguous, else the one copy
    if blocks.dim() != 3 or scales.dim() != 3 or scales.shape != (
            *blocks.shape[:2], blocks.shape[2] // _GROUP_BYTES) or blocks.shape[2] % _GROUP_BYTES:
        raise ValueError(f"blocks must be [E, N, K/32, 16] or [E, N, K/2] and scales [E, N, K/32] "
                         f"(K a multiple of 32), got {tuple(blocks.shape)} and "
                         f"{tuple(scales.shape)}")
    return (blocks.contiguous().view(torch.float4_e2m1fn_x2),
            scales.contiguous().view(torch.float8_e8m0fnu))


# INT4's encodings of q in -8 .. 7 in a nibble: q + 8 (compressed-tensors'
# pack-quantized, GPTQ's symmetric), or two's complement (signed).
INT4_ENCODINGS = ("offset8", "signed")


def int4_expert_weights(packed: torch.Tensor, scales: torch.Tensor, *,
                        encoding: str = "offset8") -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT4 expert weights in the layout `moe_experts` reads, from a checkpoint's.

    For one weight of every expert (w13 or w2), quantized symmetrically per
    group of 32 or 128 values along K with a bfloat16 scale (`w = q *
    scale`, q in -8 .. 7). From compressed-tensors' `pack-quantized` format
    (Kimi-K2's experts, symmetric groups of 32), its `weight_packed` int32
    `[N, K/8]` of each expert stacked:

        w13, w13_scale = gg_runtime.int4_expert_weights(w13_packed, w13_scale)
        out = gg_runtime.moe_experts(x, ids, weights, w13, w2, w13_scale=w13_scale,
                                     w2_scale=w2_scale)

    Once, at load: a view where the tensors are contiguous and stored
    offset by 8, else one copy.

    Args:
        packed: `[E, N, K/2]` uint8 (two values a byte along K, the first in
            the low nibble) or `[E, N, K/8]` int32 (eight a word, the first
            in the lowest bits: compressed-tensors' packing): each expert's
            `[N, K]` weight (nn.Linear's `[out, in]`).
        scales: `[E, N, K/group]`, bfloat16, group 32 or 128.
        encoding: how a nibble holds q: `"offset8"`, `q + 8` (compressed-
            tensors, GPTQ's symmetric checkpoints); `"signed"`, two's complement.

    Returns:
        The pair (values, scales), `[E, N, K/2]` uint8 with q stored as `q +
        8` and `[E, N, K/group]` bfloat16, contiguous, on packed's device.

    Raises:
        TypeError: an argument that is not a tensor, or of another dtype.
        ValueError: shapes that do not fit each other, a group other than
            32 or 128, an unknown encoding.
    """
    check_types(tensors=(("packed", packed), ("scales", scales)))
    if encoding not in INT4_ENCODINGS:
        raise ValueError(f"encoding must be one of {INT4_ENCODINGS}, got {encoding!r}")
    if packed.dtype not in (torch.uint8, torch.int32):
        raise TypeError(f"packed must be uint8 or int32, got {packed.dtype}")
    if scales.dtype != torch.bfloat16:
        raise TypeError(f"scales must be bfloat16, got {scales.dtype} (a float16 or float32 "
                        "scale rounds to bfloat16 with .bfloat16())")
    if packed.dim() != 3 or scales.dim() != 3:
        raise ValueError(f"packed must be [E, N, K/2] or [E, N, K/8] and scales [E, N, K/group], "
                         f"got {tuple(packed.shape)} and {tuple(scales.shape)}")
    values = packed.contiguous().view(torch.uint8)  # int32: little-endian, the first value lowest
    k = 2 * values.shape[2]
    group = k // scales.shape[2] if scales.shape[2] else 0
    if scales.shape[:2] != values.shape[:2] or group not in INT4_GROUPS or k % group:
        raise ValueError(f"scales must be [E, N, K/32] or [E, N, K/128] for packed values of "
                         f"[E, N, K] = {(*values.shape[:2], k)}, got {tuple(scales.shape)}")
    if encoding == "signed":
        values = values ^ 0x88  # q + 8 = q xor 8 in four bits
    return values, scales.contiguous()
