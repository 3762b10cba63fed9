"""The public functions.  Shapes first, then what happens at the edges."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from . import autograd  # noqa: F401  (registers grouped_mm's gradients)
from ._native import OPS, call, call_untracked_if_possible, tf32_allowed


def grouped_gemm(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor], *,
                 trans_b: bool = False) -> list[torch.Tensor]:
    """[M_i, K_i] @ [K_i, N_i] -> [M_i, N_i] for every i, in one launch.

    As[i] is [M_i, K_i]; Bs[i] is [K_i, N_i], or [N_i, K_i] with trans_b=True
    (the nn.Linear weight layout).  Any sizes (zero included) and any row
    stride; the last dimension must have unit stride; one dtype (float16 or
    bfloat16) and one CUDA device for all.  Returns C_i, contiguous, in the
    inputs' dtype (accumulated in float32): views into one new allocation,
    back to back (row slices of one tensor when every N_i is equal).
    Metadata reaches the GPU in one copy on the current stream; for that
    reason this call cannot be captured in a CUDA graph (grouped_mm can).
    Not differentiable.
    """
    if isinstance(As, (list, tuple)) and isinstance(Bs, (list, tuple)) and not As and not Bs:
        return []  # nothing to dispatch on
    return call(OPS.grouped_gemm.default, As, Bs, trans_b)


def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
               bias: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Grouped matrix product with the semantics, argument names and positions
    of torch._grouped_mm and F.grouped_mm (a and b below are mat_a and mat_b).

    - a [T, K], b [G, K, N], offs [G] -> [T, N]  (ragged M: MoE forward, dA)
      Group g is rows offs[g-1]:offs[g] of a (offs[-1] taken as 0), times b[g].
      b may be a transposed view of a [G, N, K] tensor (nn.Linear weights).
    - a [M, T], b [T, N], offs [G] -> [G, M, N]  (ragged K: weight gradient)
      out[g] = a[:, offs[g-1]:offs[g]] @ b[offs[g-1]:offs[g]]; a group with no
      rows gives zeros.
    - a [G, M, K], b [K, T], offs [G] -> [M, T]  (ragged N)
      Columns offs[g-1]:offs[g] are a[g] @ b[:, those columns] (row-major).
    - a [G, M, K], b [G, K, N], offs None -> [G, M, N]  (batched)

    offs is an int32 CUDA tensor of cumulative END offsets.  It is read on the
    GPU only: nothing waits for the host, so the call can be captured in a CUDA
    graph and replayed with new offsets.

    bias (torch refuses one): None, or [G, N] in the output's dtype where b is
    3-D (ragged M, batched): bias[g] is added to every row of group g in the
    float32 accumulator, before the one rounding to the output's dtype.
    Differentiable: its gradient is each group's sum of output-gradient rows.

    Edges, defined rather than undefined:
    - Rows of a ragged-M output past offs[-1] belong to no group and are zero
      (no bias either).
    - Offsets are read as e_g = clamp(max(offs[0..g]), 0, T): out-of-range
      values are clamped to the T rows (columns) that exist and a decreasing
      offset makes its group empty.  No offset makes a kernel read or write out
      of bounds.

    float16, bfloat16 or float32 (TF32 where torch allows it for matmuls,
    otherwise tf32x3), any operand row- or column-major and strided, one CUDA
    device, fp32 accumulation.  out_dtype: None (the inputs' dtype), the
    inputs' dtype, or torch.float32 (the accumulator unrounded).  Meta tensors
    give the output's shape, dtype and strides; CPU tensors are refused
    (ValueError: no CPU kernels).  Differentiable in a, b and bias, traceable
    by torch.compile: it is the operator torch.ops.gg_runtime.grouped_mm(mat_a,
    mat_b, offs, bias, out_dtype, tf32) with its gradients registered
    (gg_runtime/autograd.py).
    """
    tf32 = getattr(mat_a, "dtype", None) is torch.float32 and tf32_allowed()
    return call_untracked_if_possible(OPS.grouped_mm.default, mat_a, mat_b, offs, bias, out_dtype,
                                      tf32)


def gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor,
        trans_b: bool = False) -> torch.Tensor:
    """megablocks' / grouped_gemm's `gmm(a, b, batch_sizes, trans_b)`: grouped_mm
    of a [T, K] with b [G, K, N] ([G, N, K] with trans_b), group g being the
    next batch_sizes[g] rows of a.  Differentiable in a and b, as grouped_mm.

    batch_sizes: per-group row counts, int32 or int64, 1-D with G entries, on
    the CPU (megablocks' convention) or on a's device.  CPU counts are checked
    (no negative count, their sum equal to T) and copied to the GPU: that copy
    synchronises the host with the device (not capturable in a CUDA graph).
    Counts on the GPU are not checked (no host sync): their running sums are
    read as grouped_mm reads offs.
    """
    for x, name in ((a, "a"), (b, "b")):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(batch_sizes, torch.Tensor):
        raise TypeError(f"batch_sizes must be a torch.Tensor, got {type(batch_sizes).__name__}")
    if batch_sizes.dtype not in (torch.int32, torch.int64) or batch_sizes.dim() != 1:
        raise TypeError(f"batch_sizes must be a 1-D int32 or int64 tensor, got "
                        f"{batch_sizes.dtype} of shape {tuple(batch_sizes.shape)}")
    if not isinstance(trans_b, bool):
        raise TypeError(f"trans_b must be a bool, got {type(trans_b).__name__}")
    if batch_sizes.shape[0] != b.shape[0]:
        raise ValueError(f"batch_sizes has {batch_sizes.shape[0]} entries but b has "
                         f"{b.shape[0]} groups")
    if batch_sizes.device.type == "cpu":
        if bool((batch_sizes < 0).any()) or int(batch_sizes.sum()) != a.shape[0]:
            raise ValueError(f"batch_sizes must be counts >= 0 summing to a's {a.shape[0]} "
                             f"rows, got {batch_sizes.tolist()}")
        batch_sizes = batch_sizes.to(a.device)
    offs = torch.cumsum(batch_sizes, 0, dtype=torch.int32)
    return grouped_mm(a, b.transpose(-2, -1) if trans_b else b, offs)


def scaled_grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, scale_a: torch.Tensor,
                      scale_b: torch.Tensor, offs: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None, scale_result: torch.Tensor | None = None,
                      out_dtype: torch.dtype | None = torch.bfloat16,
                      use_fast_accum: bool = False) -> torch.Tensor:
    """fp8 grouped matrix product with float32 scales, in torch._scaled_grouped_mm's
    argument names and order; Hopper (compute capability 9.0) only.  a and b
    below are mat_a and mat_b.

    - a [T, K], b [G, K, N], offs [G] -> [T, N]  (ragged M, as grouped_mm)
    - a [G, M, K], b [G, K, N], offs None -> [G, M, N]  (batched)

    a and b are torch.float8_e4m3fn; a row-major, b K-major (a transposed view
    of the [G, N, K] weight, as torch requires); K and N multiples of 16.
    The scales undo the quantisation (x ~ q * scale) and pick the granularity:

    - rowwise (torch's): scale_a [T] (or [G, M]), scale_b [G, N];
      out = (a @ b[g]) * scale_a[row] * scale_b[g, col].
    - blockwise (DeepSeek-V3): scale_a [T, ceil(K/128)] (or [G, M, ceil(K/128)]),
      one per token and 128-wide K block; scale_b [G, ceil(N/128), ceil(K/128)],
      one per 128x128 weight block; each 128-wide K block's product is scaled
      in float32 before it is accumulated (a block whose scale product is
      below 2^-100, or below 2^-60 of the largest so far of its row and column
      block, may count at that bound: README, "fp8 on Hopper").

    bias (torch refuses one): None or [G, N] in out_dtype, added to group g's
    rows after the scales, before the rounding.  scale_result: None or a
    one-element float32 tensor on a's device that multiplies the output
    (applied as a factor of scale_a).  use_fast_accum, as torch's: False
    (torch's default) adds each 128-deep K step's product to the float32
    accumulator on the CUDA cores; True lets the tensor cores accumulate all
    of K in their own precision, which loses bits as K grows and runs faster
    (twice as wide tiles).  quantize_fp8 makes both kinds of
    inputs.  out_dtype: torch.bfloat16 (None means it too) or torch.float32.
    Traceable by torch.compile (the custom op
    torch.ops.gg_runtime.scaled_grouped_mm).  offs as in grouped_mm (int32, on
    the GPU, graph capturable); groups are not padded.  Not differentiable (fp8
    training is not supported): inputs that require grad are refused.
    """
    if not isinstance(use_fast_accum, bool):  # the operator's schema would take None
        raise TypeError(f"use_fast_accum must be a bool, got {type(use_fast_accum).__name__}")
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in
                                       (mat_a, mat_b, scale_a, scale_b, bias, scale_result)):
        raise RuntimeError("scaled_grouped_mm is not differentiable: fp8 training is not "
                           "supported (run it under torch.no_grad() or detach the inputs)")
    return call(OPS.scaled_grouped_mm.default, mat_a, mat_b, scale_a, scale_b, offs, bias,
                scale_result, out_dtype, use_fast_accum)


def quantize_fp8(x: torch.Tensor,
                 granularity: str = "rowwise") -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with x ~ q * scale, torch._scaled_grouped_mm's convention:
    scale = max(amax(|x|) over the elements it covers, 1e-12) / 448 and
    q = x / scale clamped to [-448, 448] (saturating), rounded to nearest even
    float8_e4m3fn; an all-zero block gives q = 0.  Exactly what float32 torch
    computes by these formulas on CUDA.

    x is [T, K] (activations) or [G, N, K] (weights, group by group): float16,
    bfloat16 or float32 on a CUDA device, any strides (a last dimension without
    unit stride is copied first).  granularity and the scale it gives:
    - "rowwise": [T] or [G, N], one per row;
    - "1x128": [T, ceil(K/128)] or [G, N, ceil(K/128)], per row and 128 columns;
    - "128x128": [ceil(T/128), ceil(K/128)] or [G, ceil(N/128), ceil(K/128)],
      per 128 x 128 block, no block spanning two groups.
    q is contiguous, of x's shape.  One launch, no host sync; not
    differentiable.  sm90 (H100, H200) only, as the fp8 GEMMs.
    """
    return call(OPS.quantize_fp8.default, x, granularity)
