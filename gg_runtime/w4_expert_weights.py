"""4-bit expert weights served by moe_experts (W4A16, MXFP4 and INT4): the
layout its kernels read, made once at load from a checkpoint's (gpt-oss's
MXFP4, compressed-tensors' and GPTQ's INT4)."""
from __future__ import annotations

import torch

from ._native import check_types
from .formats import INT4, INT4_GROUPS, MXFP4, MXFP4_GROUP, Quantized

# Bytes a group of MXFP4_GROUP e2m1 values takes, two a byte.
_GROUP_BYTES = MXFP4_GROUP // 2


def mxfp4_expert_weights(blocks: torch.Tensor, scales: torch.Tensor) -> Quantized:
    """MXFP4 expert weights in the layout `moe_experts` reads, from a checkpoint's.

    For one weight of every expert (w13 or w2). With gpt-oss's checkpoints
    as transformers loads them (`Mxfp4Config(dequantize=False)` keeps them
    packed):

        w13 = gg_runtime.mxfp4_expert_weights(experts.gate_up_proj_blocks,
                                              experts.gate_up_proj_scales)
        w2 = gg_runtime.mxfp4_expert_weights(experts.down_proj_blocks,
                                             experts.down_proj_scales)
        out = gg_runtime.moe_experts(x, ids, weights, w13, w2, gate_up="interleaved",
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
        A `Quantized` in format `"mxfp4"`: values `[E, N, K/2]`
        float4_e2m1fn_x2 and scales `[E, N, K/32]` float8_e8m0fnu,
        contiguous, on blocks' device.

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
    return Quantized(blocks.contiguous().view(torch.float4_e2m1fn_x2),
                     scales.contiguous().view(torch.float8_e8m0fnu), MXFP4)


# INT4's encodings of q in -8 .. 7 in a nibble: q + 8 (compressed-tensors'
# pack-quantized, GPTQ's symmetric), or two's complement (signed).
INT4_ENCODINGS = ("offset8", "signed")


def int4_expert_weights(packed: torch.Tensor, scales: torch.Tensor, *,
                        encoding: str = "offset8") -> Quantized:
    """Symmetric INT4 expert weights in the layout `moe_experts` reads, from a checkpoint's.

    For one weight of every expert (w13 or w2), quantized symmetrically per
    group of 32 or 128 values along K with a bfloat16 scale (`w = q *
    scale`, q in -8 .. 7). From compressed-tensors' `pack-quantized` format
    (Kimi-K2's experts, symmetric groups of 32), its `weight_packed` int32
    `[N, K/8]` of each expert stacked:

        w13 = gg_runtime.int4_expert_weights(w13_packed, w13_scale)
        w2 = gg_runtime.int4_expert_weights(w2_packed, w2_scale)
        out = gg_runtime.moe_experts(x, ids, weights, w13, w2)

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
        A `Quantized` in format `"int4"`: values `[E, N, K/2]` uint8 with q
        stored as `q + 8` and scales `[E, N, K/group]` bfloat16, contiguous,
        on packed's device.

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
    # int32: little-endian, the first value lowest.  An empty tensor counts as
    # contiguous whatever its strides, and view(uint8) needs a unit last stride.
    dense = packed.contiguous() if packed.numel() else packed.new_empty(packed.shape)
    values = dense.view(torch.uint8)
    k = 2 * values.shape[2]
    group = k // scales.shape[2] if scales.shape[2] else 0
    if scales.shape[:2] != values.shape[:2] or group not in INT4_GROUPS or k % group:
        raise ValueError(f"scales must be [E, N, K/32] or [E, N, K/128] for packed values of "
                         f"[E, N, K] = {(*values.shape[:2], k)}, got {tuple(scales.shape)}")
    if encoding == "signed":
        values = values ^ 0x88  # q + 8 = q xor 8 in four bits
    return Quantized(values, scales.contiguous(), INT4)


def gptq_expert_weights(qweight: torch.Tensor, scales: torch.Tensor, *,
                        qzeros: torch.Tensor | None = None,
                        g_idx: torch.Tensor | None = None) -> Quantized:
    """Symmetric INT4 expert weights in the layout `moe_experts` reads, from GPTQ's.

    For one weight of every expert (each of gate, up and down), each
    expert's GPTQ tensors stacked along a first dimension. GPTQ stores a
    linear layer's `[N, K]` weight transposed, eight 4-bit values of K to an
    int32 word (`qweight [K/8, N]`, the first in the lowest bits), each q
    in -8 .. 7 stored as q + 8 (symmetric checkpoints: `sym=True`), and a
    scale per group of 32 or 128 values along K (`scales [K/group, N]`):

        gate = gg_runtime.gptq_expert_weights(gate_qweight, gate_scales)
        up = gg_runtime.gptq_expert_weights(up_qweight, up_scales)
        w2 = gg_runtime.gptq_expert_weights(down_qweight, down_scales)
        w13 = gg_runtime.Quantized(torch.cat((gate.values, up.values), 1),
                                   torch.cat((gate.scales, up.scales), 1), "int4")
        out = gg_runtime.moe_experts(x, ids, weights, w13, w2)

    Once, at load: one copy. float16 scales are rounded to bfloat16 (the
    kernels' scale dtype; the weights they give then differ from float16
    scales' by at most 2^-9 relatively, as where vLLM serves a bfloat16
    model's GPTQ weights). Reads `qzeros` and `g_idx` back to the host to
    check them.

    Args:
        qweight: `[E, K/8, N]` int32, GPTQ's `qweight` of each expert.
        scales: `[E, K/group, N]`, float16 or bfloat16, group 32 or 128.
        qzeros: None, or `[E, K/group, N/8]` int32, GPTQ's zero points:
            each must be 8, the symmetric one (stored 8, or 7 in the
            original GPTQ format, which stores the zero point minus 1).
        g_idx: None, or `[E, K]` or `[K]` int32 or int64, each row's group:
            it must be `k // group` (no act-order reordering).

    Returns:
        A `Quantized` in format `"int4"`: values `[E, N, K/2]` uint8 (two
        values a byte along K, q + 8, the first in the low nibble) and
        scales `[E, N, K/group]` bfloat16, contiguous, on qweight's device.

    Raises:
        TypeError: an argument that is not a tensor (qzeros and g_idx: nor
            None), or of another dtype.
        ValueError: shapes that do not fit each other, a group other than
            32 or 128, zero points other than the symmetric ones
            (asymmetric GPTQ), rows in another order than their groups'
            (act-order).
    """
    check_types(tensors=(("qweight", qweight), ("scales", scales)),
                optional=(("qzeros", qzeros), ("g_idx", g_idx)))
    if qweight.dtype != torch.int32:
        raise TypeError(f"qweight must be int32, got {qweight.dtype}")
    if scales.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"scales must be float16 or bfloat16, got {scales.dtype}")
    if qweight.dim() != 3 or scales.dim() != 3:
        raise ValueError(f"qweight must be [E, K/8, N] and scales [E, K/group, N], got "
                         f"{tuple(qweight.shape)} and {tuple(scales.shape)}")
    experts, words, n = qweight.shape
    k, groups = 8 * words, scales.shape[1]
    group = k // groups if groups else 0
    if (scales.shape[0], scales.shape[2]) != (experts, n) or group not in INT4_GROUPS or k % group:
        raise ValueError(f"scales must be [E, K/32, N] or [E, K/128, N] for qweight's [E, K, N] "
                         f"= {(experts, k, n)}, got {tuple(scales.shape)}")
    _check_symmetric(qzeros, (experts, groups, n // 8))
    _check_in_order(g_idx, experts, k, group)
    nibbles = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    values = (qweight.unsqueeze(2) >> nibbles.view(1, 1, 8, 1)) & 15  # [E, K/8, 8, N]
    values = values.reshape(experts, k, n).transpose(1, 2).to(torch.uint8)  # [E, N, K], q + 8
    packed = values[..., 0::2] | (values[..., 1::2] << 4)
    return Quantized(packed.contiguous(), scales.transpose(1, 2).to(torch.bfloat16).contiguous(),
                     INT4)


def _check_symmetric(qzeros, shape):
    """A ValueError unless GPTQ's zero points (where given) are all the
    symmetric 8, stored as 8 or as 7 (the original format's zero - 1)."""
    if qzeros is None:
        return
    if qzeros.dtype != torch.int32:
        raise TypeError(f"qzeros must be int32, got {qzeros.dtype}")
    if tuple(qzeros.shape) != shape:
        raise ValueError(f"qzeros must be [E, K/group, N/8] = {shape}, got "
                         f"{tuple(qzeros.shape)}")
    words = {int(w) for w in qzeros.unique().tolist()}
    if not words <= {0x77777777, -0x77777778}:  # 8 x 7, 8 x 8 (as a signed int32)
        raise ValueError("qzeros must be 8 (or 7, the original GPTQ format's 8 - 1) "
                         "everywhere: symmetric INT4; asymmetric GPTQ (other zero points) "
                         "is not supported")


def _check_in_order(g_idx, experts, k, group):
    """A ValueError unless each row's group (where given) is k // group."""
    if g_idx is None:
        return
    if g_idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"g_idx must be int32 or int64, got {g_idx.dtype}")
    if tuple(g_idx.shape) not in ((k,), (experts, k)):
        raise ValueError(f"g_idx must be [K] or [E, K] with K = {k}, got {tuple(g_idx.shape)}")
    in_order = torch.arange(k, device=g_idx.device) // group
    if not torch.equal(g_idx.long(), in_order.expand_as(g_idx)):
        raise ValueError("g_idx must be k // group for every row k: GPTQ's act-order "
                         "(desc_act, rows reordered) is not supported")
