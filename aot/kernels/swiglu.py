"""SwiGLU between an MoE layer's two grouped products, row by row, in one
pass each way; float32 arithmetic, one rounding per output.

gu [R, 2C] (row-major, row stride 2C) holds each row's gate and up halves:
concatenated (gate columns 0..C, up columns C..2C) or INTERLEAVED (gate at even
columns, up at odd).

forward:   h[r]   = act(gate[r], up[r])                           -> h [R, C]
           activation "swiglu":  act(g, u) = silu(g) * u
           activation "gpt_oss": gpt-oss's clamped form, g' = min(g, LIMIT),
                      u' = clamp(u, -LIMIT, LIMIT), act(g, u) = (u' + 1) * g' * sigmoid(ALPHA * g')
backward:  with dh = grad[r] * scale[r] (grad [R, C] the gradient of h before
           the routing weight scale [R] float32 is applied):
           dgu[r] = (dh * d act / d gate, dh * d act / d up), zero where a clamp
                    is active (as torch.clamp's gradient), in gu's layout -> dgu [R, 2C]
           hs[r]  = h[r] * scale[r]   (the down projection's input, scaled:
                    its weight gradient is grad^T hs)             -> h [R, C]
           dot[r] = sum_i grad[r, i] * h[r, i]   (h rounded as the forward
                    rounded it: the routing weight's gradient)    -> dot [R] float32
Outputs are contiguous.  Each program takes BM rows and walks their columns
BN at a time (the row sum needs the whole row); memory-bound.
"""
import triton
import triton.language as tl

from ..axes import ACTIVATION

# The code of gpt-oss's form that a kernel's `activation` parameter carries.
GPT_OSS_CODE = tl.constexpr(ACTIVATION.code("gpt_oss"))
# gpt-oss's activation constants (its experts' alpha and limit).
GPT_OSS_ALPHA = tl.constexpr(1.702)
GPT_OSS_LIMIT = tl.constexpr(7.0)


@triton.jit
def gate_and_up(gu_ptr, rows, c0, row_ok, C, INTERLEAVED: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr):
    """The gate and up halves of rows x columns c0 .. c0 + BN, as float32 [BM, BN] each."""
    cols = c0 + tl.arange(0, BN)
    col_ok = cols < C
    base = gu_ptr + rows.to(tl.int64)[:, None] * (2 * C)
    mask = row_ok[:, None] & col_ok[None, :]
    if INTERLEAVED:
        pairs = 2 * c0 + tl.arange(0, 2 * BN)
        both = tl.load(base + pairs[None, :], mask=row_ok[:, None] & (pairs < 2 * C)[None, :],
                       other=0.0)
        gate, up = tl.split(tl.reshape(both, (BM, BN, 2)))
    else:
        gate = tl.load(base + cols[None, :], mask=mask, other=0.0)
        up = tl.load(base + C + cols[None, :], mask=mask, other=0.0)
    return gate.to(tl.float32), up.to(tl.float32)


@triton.jit
def activate(gate, up, GPT_OSS: tl.constexpr):
    """(act(gate, up), d act / d gate, d act / d up), float32."""
    if GPT_OSS:
        # NaN-propagating, as torch.clamp: a NaN stays NaN, not the limit.
        gate_c = tl.minimum(gate, GPT_OSS_LIMIT, propagate_nan=tl.PropagateNan.ALL)
        up_c = tl.clamp(up, -GPT_OSS_LIMIT, GPT_OSS_LIMIT, propagate_nan=tl.PropagateNan.ALL)
        sig = tl.sigmoid(GPT_OSS_ALPHA * gate_c)
        glu = gate_c * sig
        d_glu = sig * (1.0 + GPT_OSS_ALPHA * gate_c * (1.0 - sig))
        d_gate = tl.where(gate <= GPT_OSS_LIMIT, (up_c + 1.0) * d_glu, 0.0)
        d_up = tl.where((up >= -GPT_OSS_LIMIT) & (up <= GPT_OSS_LIMIT), glu, 0.0)
        return (up_c + 1.0) * glu, d_gate, d_up
    else:
        sig = tl.sigmoid(gate)
        return gate * sig * up, up * sig * (1.0 + gate * (1.0 - sig)), gate * sig


@triton.jit
def store_gate_and_up(dgu_ptr, d_gate, d_up, rows, c0, row_ok, C, INTERLEAVED: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr):
    cols = c0 + tl.arange(0, BN)
    col_ok = cols < C
    base = dgu_ptr + rows.to(tl.int64)[:, None] * (2 * C)
    d_gate = d_gate.to(dgu_ptr.dtype.element_ty)
    d_up = d_up.to(dgu_ptr.dtype.element_ty)
    if INTERLEAVED:
        pairs = 2 * c0 + tl.arange(0, 2 * BN)
        both = tl.reshape(tl.join(d_gate, d_up), (BM, 2 * BN))
        tl.store(base + pairs[None, :], both, mask=row_ok[:, None] & (pairs < 2 * C)[None, :])
    else:
        mask = row_ok[:, None] & col_ok[None, :]
        tl.store(base + cols[None, :], d_gate, mask=mask)
        tl.store(base + C + cols[None, :], d_up, mask=mask)


@triton.jit
def swiglu_kernel(gu_ptr, grad_ptr, scale_ptr, h_ptr, dgu_ptr, dot_ptr, R, C, activation,
                  BACKWARD: tl.constexpr, INTERLEAVED: tl.constexpr, USE_TMA: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                  PRECISION: tl.constexpr):
    """Persistent: program p takes row tiles p, p + P, ... (the runtime
    launches min(`tiles`, one wave) programs).  In the forward (BACKWARD=0)
    grad_ptr, scale_ptr, dgu_ptr and dot_ptr are not read or written.  USE_TMA,
    BK, CHUNK and PRECISION (GEMM constexprs every variant receives) are unused.
    Where the activation's form is chosen is what measured fastest each way
    (docs/notes/2026-11-29-activation-chosen-at-run-time.md): the backward
    once, each form's loop compiled alone; the forward at each column step,
    whose loads then issue together."""
    if not BACKWARD:
        swiglu_tiles(gu_ptr, grad_ptr, scale_ptr, h_ptr, dgu_ptr, dot_ptr, R, C, activation,
                     BACKWARD, INTERLEAVED, None, BM, BN)
    elif activation == GPT_OSS_CODE:
        swiglu_tiles(gu_ptr, grad_ptr, scale_ptr, h_ptr, dgu_ptr, dot_ptr, R, C, activation,
                     BACKWARD, INTERLEAVED, True, BM, BN)
    else:
        swiglu_tiles(gu_ptr, grad_ptr, scale_ptr, h_ptr, dgu_ptr, dot_ptr, R, C, activation,
                     BACKWARD, INTERLEAVED, False, BM, BN)


@triton.jit
def swiglu_tiles(gu_ptr, grad_ptr, scale_ptr, h_ptr, dgu_ptr, dot_ptr, R, C, activation,
                 BACKWARD: tl.constexpr, INTERLEAVED: tl.constexpr, FORM: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr):
    """FORM: gpt-oss's form (True), plain SwiGLU (False), or (None) the one
    `activation` names, chosen at each step."""
    for tile in range(tl.program_id(0), tl.cdiv(R, BM), tl.num_programs(0)):
        swiglu_rows(gu_ptr, grad_ptr, scale_ptr, h_ptr, dgu_ptr, dot_ptr, tile * BM, R, C,
                    activation, BACKWARD, INTERLEAVED, FORM, BM, BN)


@triton.jit
def swiglu_rows(gu_ptr, grad_ptr, scale_ptr, h_ptr, dgu_ptr, dot_ptr, row0, R, C, activation,
                BACKWARD: tl.constexpr, INTERLEAVED: tl.constexpr, FORM: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    """Rows row0 .. row0 + BM, BN columns at a time."""
    rows = row0 + tl.arange(0, BM)
    row_ok = rows < R
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * C
    if BACKWARD:
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)[:, None]
        grad_rows = grad_ptr + rows.to(tl.int64)[:, None] * C
        dot = tl.zeros((BM,), dtype=tl.float32)
    for c0 in range(0, C, BN):
        cols = c0 + tl.arange(0, BN)
        col_ok = cols < C
        mask = row_ok[:, None] & col_ok[None, :]
        gate, up = gate_and_up(gu_ptr, rows, c0, row_ok, C, INTERLEAVED, BM, BN)
        if FORM is not None:
            h, d_gate, d_up = activate(gate, up, FORM)
        elif activation == GPT_OSS_CODE:
            h, d_gate, d_up = activate(gate, up, True)
        else:
            h, d_gate, d_up = activate(gate, up, False)
        h = h.to(h_ptr.dtype.element_ty).to(tl.float32)
        if BACKWARD:
            grad = tl.load(grad_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dot += tl.sum(grad * h, axis=1)
            dh = grad * scale
            store_gate_and_up(dgu_ptr, dh * d_gate, dh * d_up, rows, c0, row_ok, C, INTERLEAVED,
                              BM, BN)
            h = h * scale
        tl.store(h_rows + cols[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)
    if BACKWARD:
        tl.store(dot_ptr + rows, dot, mask=row_ok)
