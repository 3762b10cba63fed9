"""fp8 (float8_e4m3fn) quantisation in float32 torch (quantize_fp8's and
quantize_fp8_columns' layouts), scaled_grouped_mm's inputs made from random
data, and its float32 reference."""
from __future__ import annotations

import torch

from ..formats import SCALINGS
from .cases import offsets_from_counts, randn
from .references import effective_ends, ref_grouped_mm

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_BLOCK = 128
# Against float32 products of the dequantised inputs.  float32 output: looser than
# TOLERANCE[torch.float32], as fp8 tensor cores do not accumulate in IEEE float32.
FP8_TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 1e-3}
# scaled_grouped_mm's granularities -> quantize_ref's for a's and b's scales.
SCALE_KINDS = {name: (s.rows, s.weights) for name, s in SCALINGS.items()}


def _blocks(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [R, C] as [ceil(R/rows), ceil(C/128), rows, 128], zero-padded."""
    r, c = x.shape
    row_blocks, col_blocks = -(-r // rows), -(-c // FP8_BLOCK)
    padded = x.new_zeros(row_blocks * rows, col_blocks * FP8_BLOCK)
    padded[:r, :c] = x
    return padded.view(row_blocks, rows, col_blocks, FP8_BLOCK).transpose(1, 2)


def _expand(scale: torch.Tensor, rows: int, shape) -> torch.Tensor:
    """Per-block scales [RB, CB] spread over the [R, C] elements they cover."""
    full = scale.repeat_interleave(rows, 0).repeat_interleave(FP8_BLOCK, 1)
    return full[:shape[0], :shape[1]]


def quantize_ref(x: torch.Tensor, granularity: str):
    """(q, scale) with x ~ q * scale, in float32 torch: scale = amax / 448 over
    a row ('rowwise'), a 1x128 or a 128x128 block; x 2-D [R, C], or 3-D
    [G, R, C] quantised group by group.  The amax skips NaNs, which stay
    NaN in q."""
    if x.dim() == 3:
        # No groups: one group's shapes, none of it (stack takes no empty list).
        groups = x if len(x) else x.new_zeros(1, *x.shape[1:])
        pairs = [quantize_ref(group, granularity) for group in groups]
        q, scale = torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])
        return q[:len(x)], scale[:len(x)]
    x = x.float()
    magnitudes = torch.where(x.isnan(), 0, x.abs())
    if granularity == "rowwise":
        amax = magnitudes.amax(dim=1) if x.shape[1] else x.new_zeros(x.shape[0])
        scale = amax.clamp(min=1e-12) / FP8_MAX
        full = scale[:, None]
    else:
        rows = 1 if granularity == "1x128" else FP8_BLOCK
        scale = _blocks(magnitudes, rows).amax(dim=(2, 3)).clamp(min=1e-12) / FP8_MAX
        full = _expand(scale, rows, x.shape)
    q = (x / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def column_blocks(offs: torch.Tensor, rows: int) -> list:
    """(start, end, first block) of each group in quantize_fp8_columns' layout:
    the group's rows [start, end) of x (offsets read as effective_ends), and
    the first of q's 128-column blocks its 128-row blocks take in order
    (start // 128 + the group's index)."""
    groups, start = [], 0
    for g, end in enumerate(effective_ends(offs, rows)):
        groups.append((start, end, start // FP8_BLOCK + g))
        start = end
    return groups


def quantize_columns_ref(x: torch.Tensor, offs: torch.Tensor, granularity: str):
    """quantize_fp8_columns' (q, scale) in float32 torch: each group's rows of
    x [T, C], transposed, quantised by quantize_ref, 'rowwise' (a scale per
    column of the group: [G, C]) or '1x128' (per 128 of its rows:
    [T // 128 + G, C]).  q [C, 128 * (T // 128 + G)] holds a group's columns
    from its first block's on, its last block padded with zeros; columns and
    scales in no group's blocks are zero here (the operator leaves them
    unwritten)."""
    rows, cols = x.shape
    blocks = rows // FP8_BLOCK + len(offs)
    q = torch.zeros(cols, blocks * FP8_BLOCK, dtype=torch.float8_e4m3fn, device=x.device)
    scale = x.new_zeros(len(offs) if granularity == "rowwise" else blocks, cols,
                        dtype=torch.float32)
    for g, (start, end, first) in enumerate(column_blocks(offs, rows)):
        group_q, group_scale = quantize_ref(x[start:end].t(), granularity)
        q[:, first * FP8_BLOCK:first * FP8_BLOCK + end - start] = group_q
        if granularity == "rowwise":
            scale[g] = group_scale
        else:
            scale[first:first + group_scale.shape[1]] = group_scale.t()
    return q, scale


def dequantize_ref(q: torch.Tensor, scale: torch.Tensor, granularity: str) -> torch.Tensor:
    """float32 q * scale, the inverse of quantize_ref's layout."""
    if q.dim() == 3:
        return torch.stack([dequantize_ref(g, s, granularity) for g, s in zip(q, scale)])
    if granularity == "rowwise":
        return q.float() * scale[:, None]
    rows = 1 if granularity == "1x128" else FP8_BLOCK
    return q.float() * _expand(scale, rows, q.shape)


def fp8_moe_inputs(counts, n: int, k: int, granularity: str, device="cuda"):
    """(a [T, K], b [G, K, N] K-major, scale_a, scale_b, offs) quantised from
    random data: 'rowwise', 'blockwise' (1x128 activations, 128x128 weights)
    or 'blockwise_rowwise' (1x128 activations, per-channel weights)."""
    x = randn(sum(counts), k, dtype=torch.float32, device=device)
    w = randn(len(counts), n, k, dtype=torch.float32, device=device, scale=max(k, 1) ** -0.5)
    a_kind, b_kind = SCALE_KINDS[granularity]
    a, scale_a = quantize_ref(x, a_kind)
    b, scale_b = quantize_ref(w, b_kind)
    return a, b.transpose(1, 2), scale_a, scale_b, offsets_from_counts(counts, device)


def dequantized(a, b, scale_a, scale_b, granularity: str):
    """float32 (a, b) of scaled_grouped_mm's inputs (b [G, K, N] K-major)."""
    a_kind, b_kind = SCALE_KINDS[granularity]
    a32 = dequantize_ref(a, scale_a, a_kind)
    return a32, dequantize_ref(b.transpose(-2, -1), scale_b, b_kind).transpose(-2, -1)


def ref_scaled_grouped_mm(a, b, scale_a, scale_b, offs, granularity: str) -> torch.Tensor:
    """scaled_grouped_mm in float32 on the dequantised inputs (b [G, K, N] K-major)."""
    return ref_grouped_mm(*dequantized(a, b, scale_a, scale_b, granularity), offs)
