"""moe_experts' up projection (the ragged_glu family): ragged_m's tile of
gu = x[token] @ w13[g]^T (+ b13[g]), the tokens' rows read through the
routing's gather index (no permuted copy of x), turned into h = act(gate, up)
before it is stored, so that gu never makes a round trip through memory
(written only where save_gu asks, for the backward).

GLU says how w13's 2I output columns hold the gate and up halves, and how an
output tile's BN accumulator columns map to them (BN / 2 columns of h from
j0 = off_n / 2, off_n being the tile's column origin in 2I):
  CONCATENATED: gate columns 0..I, up columns I..2I.  The accumulator holds the
                gate columns j0 .. j0 + BN/2, then the up columns I + j0 .. (the
                warp-specialised kernel reads B's block by TMA as two half
                blocks of w13 seen as [G, 2, I, K]; the Triton kernel's loads
                go through w13_columns).
  INTERLEAVED:  gate at even columns, up at odd.  The accumulator holds
                columns off_n .. off_n + BN, pairs (gate, up) side by side.
act: kernels/swiglu.py's, plain SwiGLU or (activation == GPT_OSS_CODE,
     ACTIVATION's code) gpt-oss's clamped form.
UNGATED: no activation: the gathered rows' product (plus bias) is stored as it
is, [T, N] (moe_experts' backward: the gradient of h from the gathered
gradient rows).

The ragged-M programs' epilogue also branches on GLU: below CONCATENATED
(NO_GLU, their default, which ragged_m and scaled_ragged_m keep, and UNGATED)
the product is stored as it is; a gate layout takes the gated epilogue.
Whether A's rows are gathered is not GLU's to say but the programs' `gather`
argument's (ragged_glu's kernels always pass one).
"""
import triton
import triton.language as tl

from .quantize import quantize_blocks
from .swiglu import GPT_OSS_CODE, activate

NO_GLU = tl.constexpr(0)
UNGATED = tl.constexpr(1)
CONCATENATED = tl.constexpr(2)
INTERLEAVED = tl.constexpr(3)


@triton.jit
def w13_columns(off_n, N, GLU: tl.constexpr, BN: tl.constexpr):
    """(w13's column of each of the tile's BN accumulator columns, whether it exists)."""
    c = tl.arange(0, BN)
    if GLU == CONCATENATED:
        j = off_n // 2 + c % (BN // 2)
        return j + (c // (BN // 2)) * (N // 2), j < N // 2
    else:
        return off_n + c, off_n + c < N


@triton.jit
def gate_and_up(acc, GLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The accumulator's gate and up columns, [BM, BN / 2] each."""
    if GLU == CONCATENATED:
        return tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
    else:
        return tl.split(tl.reshape(acc, (BM, BN // 2, 2)))


@triton.jit
def glu_tile(gather, weights, off_m, off_n, k_end, end, N, ldb, B_T: tl.constexpr,
             GLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             PRECISION: tl.constexpr, ALIGNED: tl.constexpr = False, b_blocks=None):
    """The tile's product [BM, BN] (float32, w13_columns' order) through masked
    pointer loads, gather = (a_ptr, lda, rows_ptr, rows_div): the tile's row
    r is a[rows[off_m + r] // rows_div] (a's rows lda apart), or a[off_m + r]
    where rows_div is 0 (zeros from end on); `weights` is b[g] ([K, N]:
    element (k, n) at n * ldb + k where B_T, else k * ldb + n).
    ALIGNED: the TMA flavour's rules hold (csrc/run.cc: 16-byte aligned
    bases and strides, K a row_length of whole 16 bytes), so each row of a,
    and each column of a K-major b, starts on 16 bytes and a 16-byte vector
    along K is wholly in or out: the loads are 16-byte vectors the compiler
    pipelines (without the hints they are one element each).  b_blocks:
    None, or (b_desc, g): b's [BK, BN] blocks come by TMA through b_desc
    ([G, K, N]) at group g; CONCATENATED's as two [BK, BN / 2] blocks, from
    columns off_n / 2 (gate) and N / 2 + off_n / 2 (up), each multiplied into
    an accumulator of its own (the gate block's columns past N / 2 are up
    columns, which only reach accumulator columns that the epilogue drops)."""
    a_ptr, lda, rows_ptr, rows_div = gather
    if b_blocks is not None:
        b_desc, g = b_blocks
    rm = off_m + tl.arange(0, BM)
    row_ok = rm < end
    gathered = rows_div != 0
    src = tl.load(rows_ptr + rm, mask=row_ok & gathered, other=0) // tl.maximum(rows_div, 1)
    src = tl.where(gathered, src, rm)
    a_rows = a_ptr + src.to(tl.int64) * lda
    if ALIGNED:
        a_rows = tl.multiple_of(a_rows, 16)
    cols, col_ok = w13_columns(off_n, N, GLU, BN)
    if B_T:  # each column's first element
        b_cols = weights + cols.to(tl.int64) * ldb
        if ALIGNED:
            b_cols = tl.multiple_of(b_cols, 16)
    VECTOR: tl.constexpr = 128 // a_ptr.dtype.element_ty.primitive_bitwidth  # 16 bytes
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    HALVES: tl.constexpr = b_blocks is not None and GLU == CONCATENATED
    if HALVES:
        acc_gate = tl.zeros((BM, BN // 2), dtype=tl.float32)
        acc_up = tl.zeros((BM, BN // 2), dtype=tl.float32)
    for k0 in range(0, k_end, BK):
        kk = k0 + rk
        in_k = kk < k_end
        if ALIGNED:
            in_k = tl.max_constancy(in_k, VECTOR)
        a = tl.load(a_rows[:, None] + kk[None, :], mask=row_ok[:, None] & in_k[None, :],
                    other=0.0)
        if HALVES:
            gate = b_desc.load([g, k0, off_n // 2]).reshape(BK, BN // 2)
            up = b_desc.load([g, k0, N // 2 + off_n // 2]).reshape(BK, BN // 2)
            acc_gate = tl.dot(a, gate, acc_gate, input_precision=PRECISION)
            acc_up = tl.dot(a, up, acc_up, input_precision=PRECISION)
        else:
            if b_blocks is not None:
                b = b_desc.load([g, k0, off_n]).reshape(BK, BN)
            else:
                if B_T:
                    b_at = b_cols[None, :] + kk[:, None]
                else:
                    b_at = weights + kk.to(tl.int64)[:, None] * ldb + cols[None, :]
                b = tl.load(b_at, mask=in_k[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HALVES:  # w13_columns' order: the gate's columns, then the up's
        acc = tl.reshape(tl.permute(tl.join(acc_gate, acc_up), (0, 2, 1)), (BM, BN))
    return acc


@triton.jit
def act(gate, up, activation):
    if activation == GPT_OSS_CODE:
        h = activate(gate, up, True)[0]
    else:
        h = activate(gate, up, False)[0]
    return h


@triton.jit
def glu_epilogue(acc, g, G, off_m, end, off_n, N, bias, glu, GLU: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr):
    """h's [BM, BN / 2] tile (float32) from the accumulator of rows off_m ..
    (those below end are the group's); bias = (bias_ptr [G, N], has_bias) is
    added first (where has_bias); glu = (gu_ptr, save_gu, activation): gu ([T,
    N] row-major) written where save_gu is 1 (gu_ptr None: never), act's activation."""
    bias_ptr, has_bias = bias
    gu_ptr, save_gu, activation = glu
    cols, col_ok = w13_columns(off_n, N, GLU, BN)
    if has_bias != 0:
        group_bias = tl.load(bias_ptr + g.to(tl.int64) * N + cols, mask=col_ok & (g < G), other=0.0)
        acc = acc + group_bias.to(tl.float32)[None, :]
    if gu_ptr is not None:  # noqa: SIM102 (a constexpr, then a runtime test)
        if save_gu != 0:
            rows = off_m + tl.arange(0, BM)
            at = rows.to(tl.int64)[:, None] * N + cols[None, :]
            tl.store(gu_ptr + at, acc.to(gu_ptr.dtype.element_ty),
                     mask=(rows < end)[:, None] & col_ok[None, :])
    gate, up = gate_and_up(acc, GLU, BM, BN)
    return act(gate, up, activation)


@triton.jit
def quantized_h(h, out_scales, N, off_m, end, off_n, BM: tl.constexpr, BN: tl.constexpr):
    """glu_epilogue's h tile [BM rows from off_m, BN / 2 = 128 columns from
    off_n / 2] in e4m3, each row's columns one 1x128 block whose scale goes
    to out_scales [T, cdiv(N / 2, 128)] (rows below end); columns past N / 2
    count as 0."""
    tl.static_assert(BN // 2 == 128, "a tile's h columns are one scale block")
    cols = off_n // 2 + tl.arange(0, BN // 2)
    h = tl.where((cols < N // 2)[None, :], h, 0.0)
    rows = off_m + tl.arange(0, BM)
    return quantize_blocks(h, out_scales, rows, rows < end, off_n // BN, tl.cdiv(N // 2, BN // 2))
