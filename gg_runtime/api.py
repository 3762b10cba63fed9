"""The public functions.  Shapes first, then what happens at the edges."""
from __future__ import annotations

import torch

from . import gemm_list, ragged, scaled
from .cases import classify
from .library import grouped_mm_op, grouped_mm_with_autograd
from .quantize import quantize_fp8  # noqa: F401  (public; documented in quantize.py)


def grouped_gemm(As, Bs, *, trans_b: bool = False) -> list:
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
    return gemm_list.grouped_gemm(As, Bs, trans_b)


def grouped_mm(a, b, offs=None, *, out_dtype=None) -> torch.Tensor:
    """Grouped matrix product with the semantics of torch._grouped_mm.

    - a [T, K], b [G, K, N], offs [G] -> [T, N]  (ragged M: MoE forward, dA)
      Group g is rows offs[g-1]:offs[g] of a (offs[-1] taken as 0), times b[g].
      b may be a transposed view of a [G, N, K] tensor (nn.Linear weights).
    - a [M, T], b [T, N], offs [G] -> [G, M, N]  (ragged K: weight gradient)
      out[g] = a[:, offs[g-1]:offs[g]] @ b[offs[g-1]:offs[g]]; a group with no
      rows gives zeros.
    - a [G, M, K], b [K, T], offs [G] -> [M, T]  (ragged N)
      Columns offs[g-1]:offs[g] are a[g] @ b[:, those columns]; returned as a
      transposed view of a [T, M] tensor.
    - a [G, M, K], b [G, K, N], offs None -> [G, M, N]  (batched)

    offs is an int32 CUDA tensor of cumulative END offsets.  It is read on the
    GPU only: nothing waits for the host, so the call can be captured in a CUDA
    graph and replayed with new offsets.

    Edges, defined rather than undefined:
    - Rows of a ragged-M output past offs[-1] belong to no group and are zero.
    - Offsets are read as e_g = clamp(max(offs[0..g]), 0, T): out-of-range
      values are clamped to the T rows (columns) that exist and a decreasing
      offset makes its group empty.  No offset makes a kernel read or write out
      of bounds.

    float16, bfloat16 or float32 (TF32 where torch allows it for matmuls,
    otherwise tf32x3), any operand row- or column-major and strided, one CUDA
    device, fp32 accumulation.  out_dtype: None (the inputs' dtype), the
    inputs' dtype, or torch.float32 (the accumulator unrounded).  Differentiable
    in a and b (eager: an autograd.Function); traceable by torch.compile (the
    custom op torch.ops.gg_runtime.grouped_mm).
    """
    if torch.compiler.is_compiling() or type(a) is not torch.Tensor or type(b) is not torch.Tensor:
        return grouped_mm_op(a, b, offs, out_dtype)  # traced, or a tensor subclass
    case = classify(a, b, offs, out_dtype)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return grouped_mm_with_autograd(case, a, b, offs, out_dtype)
    return ragged.run(case, a, b, offs, out_dtype)


def scaled_grouped_mm(a, b, scale_a, scale_b, offs=None, out_dtype=torch.bfloat16):
    """fp8 grouped matrix product with float32 scales, in torch._scaled_grouped_mm's
    argument order; Hopper (compute capability 9.0) only.

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

    quantize_fp8 makes both kinds of inputs.  out_dtype: torch.bfloat16 (None
    means it too) or torch.float32.  Traceable by torch.compile (the custom op
    torch.ops.gg_runtime.scaled_grouped_mm).  offs as in grouped_mm (int32, on the GPU, graph
    capturable); groups are not padded.  Not differentiable (fp8 training is
    not supported): inputs that require grad are refused.
    """
    if torch.compiler.is_compiling():
        return scaled.scaled_grouped_mm_op(a, b, scale_a, scale_b, offs, out_dtype)
    return scaled.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype)
