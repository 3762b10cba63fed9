"""float32 and float64 references of the grouped products, the relative error
they are compared by, and the tolerances the tests and benchmarks allow."""
from __future__ import annotations

import contextlib

import torch

TOLERANCE = {torch.float16: 3e-3, torch.bfloat16: 1.5e-2, torch.float32: 1e-5}
TF32_TOLERANCE = 5e-3  # float32 inputs with TF32 products
FLOAT32_OUTPUT_TOLERANCE = 1e-4  # 16-bit inputs, float32 output: only the summation order differs


def tolerance(dtype, out_dtype=None, tf32=False) -> float:
    """Relative error allowed against a float32 reference of the same inputs."""
    if tf32:
        return TF32_TOLERANCE
    if out_dtype is torch.float32 and dtype is not torch.float32:
        return FLOAT32_OUTPUT_TOLERANCE
    return TOLERANCE[dtype]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; NaN anywhere in out fails any tolerance."""
    out = out.float()
    if torch.isnan(out).any():
        return float("inf")
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


@contextlib.contextmanager
def tf32_allowed(allowed: bool):
    """Within the block torch allows TF32 for float32 matmuls, or not (the
    setting gg_runtime follows); the previous setting is restored."""
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    value = ("tf32" if allowed else "ieee") if name == "fp32_precision" else allowed
    before = getattr(matmul, name)
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, before)


def ref_list(As, Bs, trans_b=False):
    return [a.float() @ (b.float().t() if trans_b else b.float()) for a, b in zip(As, Bs)]


def effective_ends(offs: torch.Tensor, total: int) -> list:
    """e_g = clamp(max(offs[0..g]), 0, total), the documented reading of offsets."""
    ends, running = [], 0
    for value in offs.tolist():
        running = max(running, value)
        ends.append(min(max(running, 0), total))
    return ends


def group_slices(a, b, offs=None):
    """(group, index of its part of grouped_mm's output, its a, its b) for each
    group, the case told by the operands' dims and offsets read as
    effective_ends; for ragged M and N then ("past the groups", index of the
    part no group covers, None, None)."""
    if a.dim() == 3 and b.dim() == 3:  # batched
        for g in range(a.shape[0]):
            yield g, g, a[g], b[g]
        return
    ragged = b.shape[1] if a.dim() == 3 else a.shape[0] if b.dim() == 3 else a.shape[1]
    start = 0
    for g, end in enumerate(effective_ends(offs, ragged)):
        if a.dim() == 3:  # ragged N: columns of the output
            yield g, (slice(None), slice(start, end)), a[g], b[:, start:end]
        elif b.dim() == 3:  # ragged M: rows
            yield g, slice(start, end), a[start:end], b[g]
        else:  # ragged K: one output per group
            yield g, g, a[:, start:end], b[start:end]
        start = end
    if a.dim() == 3:
        yield "past the groups", (slice(None), slice(start, None)), None, None
    elif b.dim() == 3:
        yield "past the groups", slice(start, None), None, None


def ref_grouped_mm(a, b, offs=None, bias=None):
    """grouped_mm in float32, group by group (bias[g] added to group g's rows)."""
    a32, b32 = a.float(), b.float()
    shape = {(3, 3): lambda: (a.shape[0], a.shape[1], b.shape[2]),
             (3, 2): lambda: (a.shape[1], b.shape[1]),
             (2, 3): lambda: (a.shape[0], b.shape[2]),
             (2, 2): lambda: (offs.shape[0], a.shape[0], b.shape[1])}[(a.dim(), b.dim())]()
    out = torch.zeros(shape, device=a.device)
    for g, index, x, y in group_slices(a32, b32, offs):
        if x is not None:
            out[index] = x @ y if bias is None else x @ y + bias[g].float()
    return out


def ref_grouped_mm_grads(a, b, offs, grad, bias=None):
    """(grad_a, grad_b) of ref_grouped_mm(a, b, offs), and grad_bias where bias
    is given, for the output gradient grad, in float32."""
    inputs = [x.detach().float().requires_grad_() for x in (a, b) + (() if bias is None
                                                                      else (bias,))]
    out = ref_grouped_mm(*inputs[:2], offs, *inputs[2:])
    return torch.autograd.grad(out, inputs, grad.float())


def group_parts(a, b, offs, out):
    """(group, its part of grouped_mm's out, that part computed in float64)
    group by group (a wrong small group cannot hide in a large one's norm);
    for ragged M and N then the part past the last group, which must be zero."""
    for g, index, x, y in group_slices(a, b, offs):
        part = out[index]
        if x is None:
            yield g, part, torch.zeros_like(part, dtype=torch.float64)
        else:
            yield g, part, x.double() @ y.double()
