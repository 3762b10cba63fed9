"""fp8_grouped_mm (fp8 training): its inputs made from random data, and its
float64 reference, the output and the gradients computed from the operands
quantized as the implementation quantizes them, so that only the fp8
products' accumulation and the bfloat16 roundings of the results remain
between the two.

Quantization by quantize_ref (quantize_fp8's bits on CUDA tensors),
dequantization by dequantize64 (exact in float64).  What one scale covers,
by recipe ("rowwise" / "blockwise"):

- forward: x's rows (per row / per 1x128 block) and w = mat_b.mT [G, N, K]
  (per (g, n) over K / per 128 x 128 block);
- grad_a = dY @ w: dY's rows as x's; rowwise quantizes mat_b [G, K, N] per
  (g, k) over N, blockwise reuses the forward's 128 x 128 blocks;
- grad_b[g] = x_g^T @ dY_g: the columns of x and dY along T within group g
  (per column / per column and 128 rows, the blocks starting at the group's
  first row, the last one cut by its end).

Offsets are read as grouped_mm reads them (effective_ends): rows past the
last group give zero rows of the output and of grad_a and add nothing to
grad_b; an empty group's grad_b is zero.
"""
from __future__ import annotations

import torch

from ..formats import RECIPES
from .cases import offsets_from_counts, randn
from .fp8 import FP8_BLOCK, SCALE_KINDS, quantize_ref
from .moe_fp8 import dequantize64
from .references import effective_ends



def fp8_training_inputs(counts, n: int, k: int, weight_layout: str = "nk", extra_rows: int = 0,
                        device="cuda"):
    """(a [T, K], b [G, K, N], offs, grad [T, N]) in bfloat16 from random data,
    `counts` rows per group and `extra_rows` past the last one; b a transposed
    view of nn.Linear-style weights w [G, N, K] (weight_layout "nk") or
    contiguous ("kn")."""
    tokens, groups, scale = sum(counts) + extra_rows, len(counts), max(k, 1) ** -0.5
    a = randn(tokens, k, dtype=torch.bfloat16, device=device)
    if weight_layout == "nk":
        b = randn(groups, n, k, dtype=torch.bfloat16, device=device, scale=scale).transpose(1, 2)
    else:
        b = randn(groups, k, n, dtype=torch.bfloat16, device=device, scale=scale)
    grad = randn(tokens, n, dtype=torch.bfloat16, device=device)
    return a, b, offsets_from_counts(counts, device), grad


def stepped_within_groups(a, grad, offs, step: float = 2.0 ** -20) -> tuple:
    """(a, grad) with, in each group, grad's first 128 rows and a's later rows
    scaled by `step`: grad_b's two parts weigh alike, and blocks of a's
    columns along T that do not start at the group's first row (against the
    blockwise recipe) put large and small rows into one block, whose small
    ones quantize to zero."""
    a_scale = torch.ones(a.shape[0], 1, device=a.device)
    grad_scale = torch.ones_like(a_scale)
    start = 0
    for end in effective_ends(offs, a.shape[0]):
        grad_scale[start:min(start + FP8_BLOCK, end)] = step
        a_scale[start + FP8_BLOCK:end] = step
        start = end
    return (a * a_scale).to(a.dtype), (grad * grad_scale).to(grad.dtype)


def _granularities(recipe: str) -> tuple:
    """(activations' granularity, weights') of quantize_ref for `recipe`."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    return SCALE_KINDS[recipe]


def _dequantized(x: torch.Tensor, granularity: str) -> torch.Tensor:
    """x as quantization at `granularity` leaves it, in float64."""
    return dequantize64(*quantize_ref(x, granularity), granularity)


def _groups(offs: torch.Tensor, total: int):
    """(g, slice of its rows) for each group that has rows."""
    start = 0
    for g, end in enumerate(effective_ends(offs, total)):
        if end > start:
            yield g, slice(start, end)
        start = end


@torch.no_grad()
def fp8_grouped_mm_ref(a, b, offs, recipe: str) -> torch.Tensor:
    """fp8_grouped_mm(a [T, K], b [G, K, N], offs, recipe=recipe) in float64: [T, N]."""
    rows_kind, weight_kind = _granularities(recipe)
    x, w = _dequantized(a, rows_kind), _dequantized(b.mT, weight_kind)
    out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64, device=a.device)
    for g, rows in _groups(offs, a.shape[0]):
        out[rows] = x[rows] @ w[g].mT
    return out


@torch.no_grad()
def fp8_grouped_mm_grads_ref(a, b, offs, grad, recipe: str) -> tuple:
    """(grad_a [T, K], grad_b [G, K, N]) of fp8_grouped_mm(a, b, offs,
    recipe=recipe) for the output gradient grad [T, N], in float64."""
    rows_kind, weight_kind = _granularities(recipe)
    dy = _dequantized(grad, rows_kind)
    if recipe == "rowwise":
        w = _dequantized(b, "rowwise").mT
    else:
        w = _dequantized(b.mT, weight_kind)
    grad_a = torch.zeros(a.shape, dtype=torch.float64, device=a.device)
    grad_b = torch.zeros(b.shape, dtype=torch.float64, device=a.device)
    for g, rows in _groups(offs, a.shape[0]):
        grad_a[rows] = dy[rows] @ w[g]
        x_t, dy_t = (_dequantized(t[rows].mT, rows_kind) for t in (a, grad))
        grad_b[g] = x_t @ dy_t.mT
    return grad_a, grad_b
