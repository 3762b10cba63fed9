"""fp8 training of grouped products: `fp8_grouped_mm`, a differentiable ragged-M
product whose forward and backward run in fp8, quantizing their inputs as
they go.  Every product is an fp8 operator (scaled_grouped_mm for the
forward and the input gradient, scaled_grouped_mm_k for the weight
gradient); every quantization one quantize_fp8 or quantize_fp8_columns
launch (a weight's two orientations, blockwise, one
quantize_fp8_both_orientations launch).  What autograd keeps is the inputs
themselves, as for grouped_mm.  Its products and quantizations (product,
weight_gradient, quantize_weight) are moe_experts(fp8=...)'s too (moe/),
whose operands may be read through the routing's order (autograd.Gathered)
or quantized where they were made (QuantizedBothWays)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from ._native import OPS, call, check_types
from .autograd import Gathered, stored_transposed
from .formats import RECIPES, SCALINGS, Quantized

# fp8 rows are read in 16-byte copies (TMA), as torch requires of fp8 inputs too.
_ALIGN = 16
# fp8_grouped_mm's inputs, each also its gradient's dtype (float32: master
# weights, whose gradient is the float32 product, not rounded to 16 bits).
_DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class QuantizedBothWays:
    """An operand quantized by the kernel that made it (moe/differentiable.py's SwiGLU
    backward), as the blockwise recipe quantizes: along its rows
    (quantize_fp8's (q, scale), 1x128) for a product that reduces them,
    along its rows within each group (quantize_fp8_columns' (q, scale),
    1x128) for a weight gradient; None where not made.  `count`: its rows."""
    count: int
    along_rows: tuple | None
    along_columns: tuple


def _quantize(x, granularity):
    return call(OPS.quantize_fp8.default, x, granularity)


def _quantized_rows(a, granularity):
    """(q, scale) of a's rows, each quantized along itself: a Gathered
    operand's tokens once, then the rows picked (fp8, a byte an element)."""
    if isinstance(a, QuantizedBothWays):
        return a.along_rows
    if not isinstance(a, Gathered):
        return _quantize(a, granularity)
    q, scale = _quantize(a.x, granularity)
    token = a.rows // a.k
    return q.view(torch.uint8).index_select(0, token).view(q.dtype), _picked_rows(scale, token)


def _picked_rows(t, rows):
    """t.index_select(0, rows) of a contiguous 1-D or 2-D t; a 2-D t's
    elements picked one by one through a flat index, as index_select is slow
    on rows as short as the 1x128 scales' (a few dozen bytes)."""
    if t.dim() == 1:
        return t.index_select(0, rows)
    columns = torch.arange(t.shape[1], device=t.device)
    return t.view(-1)[(rows * t.shape[1]).unsqueeze(1) + columns]


def _quantized_columns(a, offs, granularity):
    """quantize_fp8_columns of a (a Gathered operand's rows read in place)."""
    if isinstance(a, QuantizedBothWays):
        return a.along_columns
    if isinstance(a, Gathered):
        return call(OPS.quantize_fp8_columns.default, a.x, offs, granularity, a.rows, a.k)
    return call(OPS.quantize_fp8_columns.default, a, offs, granularity)


def quantize_weight(w, recipe) -> Quantized:
    """w [G, C, R] quantized as the recipe quantizes weights for products
    that reduce R (per 128 x 128 block, or per row of each w[g])."""
    layout = SCALINGS[recipe].weights
    return Quantized(*_quantize(w, layout), layout)


def quantize_weight_both(w, recipe):
    """(quantize_weight(w, recipe), quantize_weight(w.mT, recipe)): blockwise
    from one read of w (its 128 x 128 blocks, transposed, are w.mT's)."""
    if recipe == "blockwise":
        q, scale, q_t, scale_t = call(OPS.quantize_fp8_both_orientations.default, w)
        layout = SCALINGS[recipe].weights
        return Quantized(q, scale, layout), Quantized(q_t, scale_t, layout)
    return quantize_weight(w, recipe), quantize_weight(w.mT, recipe)


def _row_count(a) -> int:
    if isinstance(a, QuantizedBothWays):
        return a.count
    return a.rows.shape[0] if isinstance(a, Gathered) else a.shape[0]


def product(a, b_t, recipe, offs, quantized_b=None, out_dtype=torch.bfloat16):
    """a [T, R] (a tensor, Gathered or QuantizedBothWays) @ b[g] for b given as b_t [G, C, R]
    (R the reduced dimension), both quantized by the recipe: [T, C] in
    out_dtype (bfloat16 or float32).  quantized_b: quantize_weight(b_t,
    recipe), made before (None: made here)."""
    qa, scale_a = _quantized_rows(a, SCALINGS[recipe].rows)
    qb, scale_b, _ = quantize_weight(b_t, recipe) if quantized_b is None else quantized_b
    return call(OPS.scaled_grouped_mm.default, qa, qb.mT, scale_a, scale_b, offs, None, None,
                out_dtype, False)


def weight_gradient(left, right, offs, recipe, out_dtype=torch.bfloat16):
    """[G, L, R] in out_dtype (bfloat16 or float32): left_g^T @ right_g for
    left [T, L], right [T, R] (tensors, Gathered or QuantizedBothWays), each
    quantized along T within the groups."""
    granularity = SCALINGS[recipe].rows
    q_left, scale_left = _quantized_columns(left, offs, granularity)
    q_right, scale_right = _quantized_columns(right, offs, granularity)
    return call(OPS.scaled_grouped_mm_k.default, q_left, q_right, scale_left, scale_right, offs,
                _row_count(left), recipe, out_dtype)


class _Fp8GroupedMm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, offs, recipe):
        ctx.save_for_backward(a, b, offs)
        ctx.recipe = recipe
        return product(a, b.mT, recipe, offs, out_dtype=a.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        """grad_a = grad @ b[g]^T (b [G, K, N] is its own [G, C, R] form:
        its 128 x 128 blocks are the forward's transposed, so blockwise
        dequantizes to the same weights); grad_b in b's layout: stored
        transposed (w.mT), computed as (grad^T a)^T, else as a^T grad."""
        a, b, offs = ctx.saved_tensors
        recipe = ctx.recipe
        grad = grad.to(a.dtype)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = product(grad, b, recipe, offs, out_dtype=a.dtype)
        if ctx.needs_input_grad[1]:
            if stored_transposed(b):
                grad_b = weight_gradient(grad, a, offs, recipe, b.dtype).mT
            else:
                grad_b = weight_gradient(a, grad, offs, recipe, b.dtype)
        return grad_a, grad_b, None, None


def _check(mat_a, mat_b, offs, recipe):
    """Every error of the arguments, named by fp8_grouped_mm's names, before
    the first launch (the operators would name the quantized copies, after
    the quantizations ran)."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    check_types(tensors=(("mat_a", mat_a), ("mat_b", mat_b), ("offs", offs)))
    for name, x, dims in (("mat_a", mat_a, 2), ("mat_b", mat_b, 3), ("offs", offs, 1)):
        if x.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D, got shape {tuple(x.shape)}")
    for name, x in (("mat_a", mat_a), ("mat_b", mat_b)):
        if x.dtype not in _DTYPES:
            raise TypeError(f"{name} must be torch.bfloat16 or torch.float32, got {x.dtype}")
    if offs.dtype != torch.int32:
        raise TypeError(f"offs must be torch.int32, got {offs.dtype}")
    if mat_a.device.type not in ("cuda", "meta"):
        raise ValueError(f"mat_a must be on a CUDA device, got {mat_a.device}")
    for name, x in (("mat_b", mat_b), ("offs", offs)):
        if x.device != mat_a.device:
            raise ValueError(f"{name} is on {x.device} but mat_a is on {mat_a.device}")
    groups, k, n = mat_b.shape
    if mat_a.shape[1] != k:
        raise ValueError(f"mat_a is {tuple(mat_a.shape)} and mat_b is {tuple(mat_b.shape)}: "
                         "expected mat_a [T, K] with mat_b [G, K, N]")
    if offs.shape[0] != groups:
        raise ValueError(f"offs has {offs.shape[0]} entries but mat_b has {groups} groups")
    if groups > 1 and offs.stride(0) != 1:
        raise ValueError("offs must be contiguous")
    if k % _ALIGN or n % _ALIGN:
        raise ValueError(f"fp8 needs K and N to be multiples of {_ALIGN}, got K={k}, N={n}")


def fp8_grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor, *,
                   recipe: str = "blockwise") -> torch.Tensor:
    """grouped_mm's ragged-M product for training in fp8, on compute capability 9.0.

    `out[rows of g] = a[rows of g] @ b[g]` as `grouped_mm(mat_a, mat_b,
    offs)`, with every product of the forward and the backward run by fp8
    tensor cores on operands quantized as they are read (float8_e4m3fn,
    `scale = amax / 448`, as `quantize_fp8`):

    - `"blockwise"` (DeepSeek-V3's recipe): activations and output
      gradients per row per 128 columns (1x128), weights per 128 x 128
      block, and, for the weight gradient, both operands per column per 128
      rows of a group (blocks start at each group's first row, so none
      spans two groups).  Each block's product is scaled and added in
      float32.
    - `"rowwise"` (torchao's): activations and output gradients per row,
      weights per output channel (per row of `b[g]^T` forward, per row of
      `b[g]` for the input gradient), and, for the weight gradient, both
      operands per column per group.  Each 128-deep step's product is added
      to float32.

    The weight gradient's operands are stored transposed, each group's rows
    padded to whole 128-row blocks: its temporary memory is that of
    `T + 128 G` rows of each operand in fp8.

    Offsets are read as grouped_mm reads them (int32 on the GPU, no host
    sync).  Autograd keeps mat_a, mat_b and offs (the inputs themselves, as
    grouped_mm does); each gradient comes back in its input's dtype,
    mat_b's with its strides (a weight passed as `w.transpose(1, 2)` gets a
    gradient with w's strides), mat_a's row-major whatever mat_a's strides
    (grouped_mm's follows a column-major mat_a).  A float32 input (master
    weights, say) is quantized from its float32 values and gets the float32
    product as its gradient, not rounded to 16 bits; the output is in
    mat_a's dtype.

    Args:
        mat_a: `[T, K]` bfloat16 or float32 on a CUDA device (activations).
        mat_b: `[G, K, N]` bfloat16 or float32 on a's device, any strides
            (the weights; typically `w.transpose(1, 2)` of a `[G, N, K]` w).
        offs: `[G]` int32 cumulative end offsets of the groups' rows.
        recipe: `"blockwise"` or `"rowwise"`, as above.

    Returns:
        `[T, N]` in mat_a's dtype; rows past `offs[-1]` are zero.

    Raises:
        TypeError: an argument of the wrong type or dtype, naming it.
        ValueError: an unknown recipe; shapes that do not fit; K or N not a
            multiple of 16; tensors on different devices; naming the argument.
        UnsupportedDeviceError: a GPU of another compute capability than 9.0.
    """
    _check(mat_a, mat_b, offs, recipe)
    if torch.is_grad_enabled() and (mat_a.requires_grad or mat_b.requires_grad):
        return _Fp8GroupedMm.apply(mat_a, mat_b, offs, recipe)
    return product(mat_a, mat_b.mT, recipe, offs, out_dtype=mat_a.dtype)
