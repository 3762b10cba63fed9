"""The public GEMM functions.  Each docstring is its function's reference
(docs/reference/, built by `make docs`): shapes first, then layouts, dtypes,
edges, autograd, errors.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from . import autograd  # noqa: F401  (registers grouped_mm's gradients)
from ._native import OPS, call, call_untracked_if_possible, check_types, tf32_allowed
from .formats import Quantized


def grouped_gemm(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor], *,
                 trans_b: bool = False) -> list[torch.Tensor]:
    """Independent products of any sizes in one launch: `C_i = As[i] @ Bs[i]`.

    The API of Triton's grouped GEMM tutorial: each pair has its own M, N and
    K, zero included.  The groups' metadata reaches the GPU in one copy from
    pinned memory on the current stream, so the call cannot be captured in a
    CUDA graph (`grouped_mm` can).  Not differentiable.

    Args:
        As: a list (or tuple) of `[M_i, K_i]` tensors, float16 or bfloat16, all
            of one dtype and on one CUDA device; any row stride, unit stride
            along the last dimension.
        Bs: as many `[K_i, N_i]` tensors (`[N_i, K_i]`, the nn.Linear weight
            layout, with `trans_b=True`), of As' dtype and device, under the
            same stride rules.
        trans_b: whether each `Bs[i]` is given as `[N_i, K_i]`.

    Returns:
        The `C_i`, `[M_i, N_i]` in the inputs' dtype (accumulated in float32),
        each contiguous: views into one new allocation, back to back (row
        slices of one `[sum M_i, N]` tensor when every `N_i` is equal).  Two
        empty lists give `[]`.

    Raises:
        TypeError: a non-tensor or a tensor of another dtype, naming it.
        ValueError: lengths, shapes, devices or strides that do not match,
            naming the group; a call while the stream is captured in a CUDA
            graph.
        UnsupportedDeviceError: a GPU this wheel has no kernels for.
        CudaError: a driver or launch failure.
    """
    if isinstance(As, (list, tuple)) and isinstance(Bs, (list, tuple)) and not As and not Bs:
        return []  # nothing to dispatch on
    return call(OPS.grouped_gemm.default, As, Bs, trans_b)


def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
               bias: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Grouped matrix product, a drop-in for `torch._grouped_mm` and `F.grouped_mm`.

    Their semantics, argument names and positions (`a` and `b` below are
    `mat_a` and `mat_b`).  `offs` holds cumulative END offsets along the
    ragged dimension T: group g spans `offs[g-1]:offs[g]` (from 0 for g = 0).

    - `a [T, K]`, `b [G, K, N]`, `offs [G]` -> `[T, N]` (ragged M: the MoE
      forward, dA): group g is rows `offs[g-1]:offs[g]` of a, times `b[g]`.
    - `a [M, T]`, `b [T, N]`, `offs [G]` -> `[G, M, N]` (ragged K: the weight
      gradient): `out[g] = a[:, rows] @ b[rows]`; a group with no rows gives
      zeros.
    - `a [G, M, K]`, `b [K, T]`, `offs [G]` -> `[M, T]` (ragged N): columns
      `offs[g-1]:offs[g]` are `a[g] @ b[:, columns]`.
    - `a [G, M, K]`, `b [G, K, N]`, `offs` None -> `[G, M, N]` (batched):
      `a[g] @ b[g]`.

    Layouts: any operand may be row- or column-major (a transposed view, such
    as `w.transpose(1, 2)` of nn.Linear-style weights `w [G, N, K]`) and
    strided.  A ragged operand whose groups lie along its contiguous dimension
    (3-D x 2-D with a row-major `b [K, T]`; ragged K with a row-major
    `a [M, T]`) is read in place on compute capability 9.0 where T times the
    element size is a multiple of 16 bytes, elsewhere copied once to the
    layout the kernels read.

    Precision: float32 accumulation.  float32 inputs follow torch's matmul
    setting: with TF32 allowed (`torch.backends.cuda.matmul.fp32_precision =
    "tf32"`, or the older `allow_tf32 = True`) one TF32 product per product,
    otherwise (torch's default) three (tf32x3), which keeps the error at
    float32's level.

    Edges, defined rather than undefined:

    - Rows of a ragged-M output past `offs[-1]` belong to no group and are
      zero (no bias either).
    - Offsets are read as `e_g = clamp(max(offs[0..g]), 0, T)`: out-of-range
      values clamp to the T rows (columns) that exist and a decreasing offset
      makes its group empty.  No offset makes a kernel read or write out of
      bounds.

    Autograd: differentiable in a, b and bias, twice too (the gradients are
    grouped_mm calls themselves).  The backward runs the same kernels on
    transposed views, without copies, and each gradient comes back with its
    input's strides, so a weight passed as `w.transpose(1, 2)` gets a gradient
    that AccumulateGrad keeps without a copy.  One formula serves every route
    (eager, functorch transforms, `torch.compile`, compiled autograd): the
    autograd formula registered for the operator
    `torch.ops.gg_runtime.grouped_mm(mat_a, mat_b, offs, bias, out_dtype,
    tf32)`, whose `tf32` says whether float32 may use TF32 (torch's setting,
    which the stable ABI cannot read: this function passes it).

    CUDA graphs and compilation: `offs` is read on the GPU only and nothing
    waits for the host, so the call can be captured in a CUDA graph and
    replayed with new offsets.  Traceable by `torch.compile`; the operator's
    Meta kernel reads concrete sizes, so a graph compiled with `dynamic=True`
    is specialised to the shapes it saw.  Meta tensors give the output's
    shape, dtype and strides on any machine (the operator's own C++ with
    nothing launched).

    Args:
        mat_a: float16, bfloat16 or float32 on a CUDA device; 2-D or 3-D as
            above.
        mat_b: of mat_a's dtype and device; 2-D or 3-D as above.
        offs: `[G]` int32 on mat_a's device, or None (batched).
        bias: None, or `[G, N]` in the output's dtype where b is 3-D (ragged M,
            batched; torch refuses a bias): `bias[g]` is added to every row of
            group g in the float32 accumulator, before the one rounding to the
            output's dtype.  Its gradient is each group's sum of
            output-gradient rows (rows past `offs[-1]` count for no group).
        out_dtype: None (the inputs' dtype), the inputs' dtype, or
            `torch.float32` for 16-bit inputs: the float32 accumulator written
            without rounding (torch refuses this), in eager and compiled mode
            alike.  The backward of such a call rounds the float32 output
            gradient to the inputs' dtype.

    Returns:
        The output, shaped as above, row-major, in `out_dtype`.

    Raises:
        TypeError: a non-tensor argument or a dtype that does not fit, naming
            the argument.
        ValueError: shapes, devices, strides or offsets that fit none of the
            four cases, a bias where b is 2-D, CPU tensors (there are no CPU
            kernels).  Raised before anything launches, naming the argument,
            the group, the expected and the actual value.
        UnsupportedDeviceError: a GPU this wheel has no kernels for (compute
            capability below 8.0).
        CudaError: a driver or launch failure (the kernel's key and the CUDA
            error's name).
    """
    check_types(tensors=(("mat_a", mat_a), ("mat_b", mat_b)),
                optional=(("offs", offs), ("bias", bias)), dtypes=(("out_dtype", out_dtype),))
    tf32 = mat_a.dtype is torch.float32 and tf32_allowed()
    return call_untracked_if_possible(OPS.grouped_mm.default, mat_a, mat_b, offs, bias, out_dtype,
                                      tf32)


def gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor,
        trans_b: bool = False) -> torch.Tensor:
    """megablocks' / grouped_gemm's `gmm(a, b, batch_sizes, trans_b)`.

    grouped_mm's ragged-M case with group sizes instead of offsets:
    `a [T, K]` times `b [G, K, N]` (`[G, N, K]` with `trans_b`), group g being
    the next `batch_sizes[g]` rows of a.  Differentiable in a and b, as
    grouped_mm (which it calls).

    Args:
        a: `[T, K]`, float16, bfloat16 or float32 on a CUDA device.
        b: `[G, K, N]`, or `[G, N, K]` with `trans_b`, of a's dtype and device.
        batch_sizes: the groups' row counts, 1-D with G entries, int32 or
            int64, on the CPU (megablocks' convention) or on a's device.  CPU
            counts are checked (none negative, their sum T) and copied to the
            GPU: that copy synchronises the host with the device, so the call
            cannot be captured in a CUDA graph.  Counts on the GPU are neither
            checked nor waited for: their running sums are read as grouped_mm
            reads `offs`.
        trans_b: whether b is given as `[G, N, K]` (nn.Linear's layout).

    Returns:
        `[T, N]` in a's dtype.

    Raises:
        TypeError: a, b or batch_sizes not a tensor; batch_sizes not a 1-D
            int32 or int64 tensor; trans_b not a bool.
        ValueError: batch_sizes' length is not b's number of groups; CPU
            counts negative or not summing to T; otherwise as grouped_mm.
    """
    check_types(tensors=(("a", a), ("b", b), ("batch_sizes", batch_sizes)),
                flags=(("trans_b", trans_b),))
    if batch_sizes.dtype not in (torch.int32, torch.int64) or batch_sizes.dim() != 1:
        raise TypeError(f"batch_sizes must be a 1-D int32 or int64 tensor, got "
                        f"{batch_sizes.dtype} of shape {tuple(batch_sizes.shape)}")
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
    """fp8 grouped matrix product with float32 scales, on compute capability 9.0.

    `torch._scaled_grouped_mm`'s argument names and order (`a` and `b` below
    are `mat_a` and `mat_b`), on H100 and H200:

    - ragged M: `a [T, K]`, `b [G, K, N]`, `offs [G]` -> `[T, N]`, as
      grouped_mm;
    - batched: `a [G, M, K]`, `b [G, K, N]`, `offs` None -> `[G, M, N]`.

    a and b are `torch.float8_e4m3fn`, a row-major, b K-major (a transposed
    view of the `[G, N, K]` weight, as torch requires); K and N multiples of
    16.  Groups are not padded.  The scales undo the quantisation
    (`x ~ q * scale`, as `quantize_fp8` makes them) and their shapes pick the
    granularity:

    - rowwise (torch's): `scale_a [T]` (`[G, M]` batched), `scale_b [G, N]`;
      `out = (a @ b[g]) * scale_a[row] * scale_b[g, col]`.
    - blockwise (DeepSeek-V3): `scale_a [T, ceil(K/128)]`
      (`[G, M, ceil(K/128)]` batched), one per token and 128-wide K block;
      `scale_b [G, ceil(N/128), ceil(K/128)]`, one per 128 x 128 weight
      block.  Each K block's product is multiplied by its token and weight
      block scales and the products are summed in float32.
    - blockwise activations, per-channel weights: `scale_a` blockwise,
      `scale_b [G, N]`; each K block's product is multiplied by its token's
      block scale, and the sum by `scale_b[g, col]` (as moe_experts runs
      per-channel fp8 weights: its down projection's input is quantized per
      1x128 block).

    Accumulation, `use_fast_accum` honoured as torch's is: False (torch's
    default) adds each 128-deep K step's product to the float32 accumulator on
    the CUDA cores (blockwise: each block's product is made from zero, scaled
    and added so), and its bf16 output's error is torch's with
    `use_fast_accum=False`.  True lets the tensor cores accumulate all of K in
    their own precision, as torch's True does (the same errors, growing with
    K), and runs faster (twice as wide tiles).

    Blockwise scale_a with `use_fast_accum=True` (the kernel for groups of
    more than 32 rows) keeps one accumulator in units of the current block's
    scale, rescaled between blocks: a block whose scale product (with
    per-channel scale_b: its scale_a) is below 2^-100, or below 2^-60 of the
    largest one of its row and column block so far (zero included), counts
    at that bound.  That keeps the accumulator finite for any finite scales
    and adds at most the bound times that block's product (per-channel
    scale_b: times scale_b too): far below float32's rounding of the blocks
    that set it.

    Offsets are read as grouped_mm reads them (int32, on the GPU, no host
    sync: CUDA-graph capturable).  Traceable by `torch.compile` (the operator
    `torch.ops.gg_runtime.scaled_grouped_mm`).  Not differentiable: fp8
    training is out of scope, and the weight-gradient case (2-D x 2-D) and
    ragged N are not offered in fp8.

    Args:
        mat_a: `[T, K]` or `[G, M, K]`, float8_e4m3fn, row-major, on a CUDA
            device.
        mat_b: `[G, K, N]`, float8_e4m3fn, K-major, on a's device.
        scale_a: float32, rowwise or blockwise as above.
        scale_b: float32, of scale_a's granularity, or per channel with a
            blockwise scale_a.
        offs: `[G]` int32 cumulative end offsets (ragged M), or None (batched).
        bias: None, or `[G, N]` in out_dtype (torch refuses one), added to group
            g's rows after the scales, before the rounding.
        scale_result: None, or a one-element float32 tensor on a's device that
            multiplies the output (applied as a factor of scale_a).
        out_dtype: `torch.bfloat16` (None means it too) or `torch.float32`.
        use_fast_accum: a bool, as above.

    Returns:
        `[T, N]` or `[G, M, N]` in out_dtype.

    Raises:
        TypeError: use_fast_accum not a bool; an argument of the wrong type or
            dtype, naming it.
        ValueError: shapes, layouts or scales that fit neither granularity;
            data pointers not 16-byte aligned or row strides not multiples of
            16; naming the argument.
        RuntimeError: an input requires grad while grad mode is on (run the
            call under `torch.no_grad()` or detach the inputs).
        UnsupportedDeviceError: a GPU of another compute capability than 9.0.
        CudaError: a driver or launch failure.
    """
    check_types(tensors=(("mat_a", mat_a), ("mat_b", mat_b), ("scale_a", scale_a),
                         ("scale_b", scale_b)),
                optional=(("offs", offs), ("bias", bias), ("scale_result", scale_result)),
                flags=(("use_fast_accum", use_fast_accum),),  # the schema would take None
                dtypes=(("out_dtype", out_dtype),))
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in
                                       (mat_a, mat_b, scale_a, scale_b, bias, scale_result)):
        raise RuntimeError("scaled_grouped_mm is not differentiable: fp8 training is not "
                           "supported (run it under torch.no_grad() or detach the inputs)")
    return call(OPS.scaled_grouped_mm.default, mat_a, mat_b, scale_a, scale_b, offs, bias,
                scale_result, out_dtype, use_fast_accum)


def quantize_fp8(x: torch.Tensor, granularity: str = "rowwise") -> Quantized:
    """float8_e4m3fn quantisation, `x ~ q * scale`, in torch._scaled_grouped_mm's convention.

    `scale = max(amax(|x|) over the elements it covers, 1e-12) / 448` and
    `q = x / scale` clamped to `[-448, 448]` (saturating), rounded to the
    nearest even float8_e4m3fn; an all-zero block gives `q = 0`.  Exactly what
    float32 torch computes by these formulas on CUDA, but that the amax skips
    NaNs (a NaN stays NaN in `q`, its block's scale that of the rest) and an
    inf's block is all NaN (torch: zeros but the inf's NaN).  One launch, no host
    sync (CUDA-graph capturable); not differentiable.  Compute capability 9.0
    (H100, H200) only, as the fp8 products it feeds (`scaled_grouped_mm`).

    Args:
        x: `[T, K]` (activations) or `[G, N, K]` (weights, quantised group by
            group), float16, bfloat16 or float32 on a CUDA device, any strides:
            read in place where its last dimension or (a transposed view such
            as `w.transpose(1, 2)`) its second-to-last has unit stride, else
            copied first.
        granularity: what one scale covers, which gives its shape:
            `"rowwise"`, a row: `[T]` or `[G, N]`;
            `"1x128"`, 128 columns of a row: `[T, ceil(K/128)]` or
            `[G, N, ceil(K/128)]`;
            `"128x128"`, a 128 x 128 block, none spanning two groups:
            `[ceil(T/128), ceil(K/128)]` or `[G, ceil(N/128), ceil(K/128)]`.

    Returns:
        A `Quantized` `(values, scales, format)`: values float8_e4m3fn,
        contiguous, of x's shape; scales float32; format the granularity.
        Weights so quantized (`"128x128"` or `"rowwise"`) are what
        `moe_experts` takes as fp8 weights, and tokens (`"1x128"` or
        `"rowwise"`) as tokens given quantized; `scaled_grouped_mm` takes the
        values and scales apart, in torch's convention.

    Raises:
        TypeError: x not a tensor, or of another dtype.
        ValueError: an unknown granularity; x not 2-D or 3-D, or not on a CUDA
            device.
        UnsupportedDeviceError: a GPU of another compute capability than 9.0.
    """
    check_types(tensors=(("x", x),))
    return Quantized(*call(OPS.quantize_fp8.default, x, granularity), granularity)
