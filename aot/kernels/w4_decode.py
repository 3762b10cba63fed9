"""4-bit (MXFP4, INT4) routed products at decode in Gluon: w4_decode_glu_kernel
(the up projection, h = act(gate, up)) and w4_decode_down_kernel (the down
projection), with the parameters, their order and meaning of kernels/w4.py's
w4_glu_kernel and w4_ragged_m_kernel, so that a family may take either.

Why: at decode the products stream the weights, and what limits w4.py's
kernels is each K step's latency: Triton widens the bytes in a blocked
layout, then takes the bfloat16 tile to mma.sync's operand layout through
shared memory (st.shared, ldmatrix) every step.  Here the packed weights
never touch shared memory: they are loaded straight into mma.sync's operand
layout (m16n8k16, Gluon's mma_v2), widened there by widen4.py's PTX and
multiplied from registers (docs/notes/2026-11-29-w4-decode-weights-in-mma-registers.md
measures this design, lab/w4_gluon_probe.py, against w4.py's kernels).

How: a sum over K is the same in any order of K, both operands taking the
same order.  The weights are loaded as int32 words (K 8w .. 8w + 7 of a row)
in the MMA's operand-B layout, a word being one K of eight products: product
j multiplies the weights at K 8w + j (nibble j of each word; one PTX instance
widens two words) by the tokens' columns 8w + j, which the tokens' row block,
loaded whole in 16-byte vectors, gives by reshape and split within each
thread (no shared memory, no shuffles).  The next step's words and scales are
loaded before this step is widened (a register double buffer).

Programs: a persistent 1-D grid over units, cdiv(N, BN) * min(T, G) of them
(an upper bound: unit u is the n tile u % n_tiles of the (u // n_tiles)-th
expert that has rows, found from offs without a host sync; units past the
busy experts find no rows).  A unit walks its expert's rows BM at a time.
BN counts the kernel's own output: W13 rows for the up projection (BN / 2 gate
rows and their BN / 2 up rows, two accumulators, BN / 2 columns of h), output
columns for the down projection.  BK is K a step; the operands' k_width is
BK / 64 (a thread's run of a row: BK / 64 words, 16 bytes at BK = 256).

Pointer loads throughout: 16-byte vectors, the host having checked what makes
them whole (csrc/ops/expert_products_w4.cc: 16-byte aligned rows and expert
strides, K a multiple of the scale group); sm80 and sm90 compile the same
code."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .glu import CONCATENATED
from .glu_ws import activate
from .w4 import INT4_G128, MXFP4
from .widen4 import E2M1_WORDS_ASM, INT4_WORDS_ASM
from .ws import plus, vector_layout

CHUNK_E = gl.constexpr(128)  # experts a step of the busy-expert search (G is any)
ZERO_N = gl.constexpr(256)  # columns a store of the down projection's rows past the last expert


@gluon.constexpr_function
def mma_layout(warps):
    """mma.sync's accumulator [BM, BN]: the warps along N (BM is one MMA's 16)."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, warps],
                                     instr_shape=[16, 8])


@gluon.constexpr_function
def eightfold(words):
    """The tokens' layout [BM, 8W]: a thread holds columns 8w .. 8w + 7 where
    `words` ([BM, W], linear) holds w, those 8 its first registers, so that
    its columns are runs in memory (16-byte loads)."""
    m, w = words.shape
    wide = [[[b[0], 8 * b[1]] for b in bases]
            for bases in (words.reg_bases, words.lane_bases, words.warp_bases)]
    return gl.DistributedLinearLayout([[0, 1], [0, 2], [0, 4]] + wide[0], wide[1], wide[2], [],
                                      [m, 8 * w])


@gluon.constexpr_function
def grouped(words, groups):
    """`words` ([W, BN], linear) seen as [groups, W / groups, BN]: the scale
    groups' layout, each group's scale then broadcast to its words in place."""
    w, n = words.shape
    split = [[[b[0] // (w // groups), b[0] % (w // groups), b[1]] for b in bases]
             for bases in (words.reg_bases, words.lane_bases, words.warp_bases)]
    return gl.DistributedLinearLayout(*split, [], [groups, w // groups, n])


@gluon.jit
def along(n: gl.constexpr, dim: gl.constexpr, layout: gl.constexpr):
    """arange(n) along dimension `dim` of a rank-2 layout, shaped to broadcast."""
    if dim == 0:
        return gl.expand_dims(gl.arange(0, n, gl.SliceLayout(1, layout)), 1)
    else:
        return gl.expand_dims(gl.arange(0, n, gl.SliceLayout(0, layout)), 0)


@gluon.jit
def busy_expert(offs_ptr, G, i):
    """(g, start, end): the rows of the i-th expert that has rows (offs [G]:
    each expert's end), or (0, 0, 0) where fewer have rows.  G is any: offs
    is scanned CHUNK_E experts at a time, a running count of the busy ones
    carried over; exactly one expert (or none) matches, so sums pick it."""
    lane = gl.arange(0, CHUNK_E, vector_layout(CHUNK_E, gl.num_warps()))
    g = 0
    start = 0
    end = 0
    seen = 0  # busy experts in the chunks before
    for chunk in range(0, G, CHUNK_E):
        e = chunk + lane
        ends = gl.load(offs_ptr + e, mask=e < G, other=0)
        starts = gl.load(offs_ptr + e - 1, mask=(e > 0) & (e < G), other=0)
        busy = (ends > starts).to(gl.int32)
        mine = (busy == 1) & (seen + gl.associative_scan(busy, 0, plus) == i + 1)
        g += gl.sum(gl.where(mine, e, 0), 0)
        start += gl.sum(gl.where(mine, starts, 0), 0)
        end += gl.sum(gl.where(mine, ends, 0), 0)
        seen += gl.sum(busy, 0)
    return g, start, end


@gluon.jit
def load_step(at, word, s_at, group, k0, K, GROUP: gl.constexpr):
    """Step k0's words (at + k0 / 8, word: each one's index in a step) and
    raw scales (s_at + k0 / GROUP, group: each one's in a step), none past K
    (a step past K loads nothing: the last step's double buffer)."""
    # K is whole groups of 32 values (host-checked): runs of 4 words agree.
    b = gl.load(at + k0 // 8, mask=gl.max_constancy(k0 // 8 + word < K // 8, [4, 1]), other=0)
    s = gl.load(s_at + k0 // GROUP, mask=k0 // GROUP + group < K // GROUP, other=0)
    return b, s


@gluon.jit
def widen(b, s, FORMAT: gl.constexpr):
    """The words' weights as eight bf16 tensors of b's shape and layout, the
    j-th the values at K 8w + j, each times its group's scale (s)."""
    if FORMAT == MXFP4:  # widen4.e8m0_scales: 2^(e - 127), e = 0 the subnormal 2^-127
        s = gl.where(s == 0, 0x40, s.to(gl.uint16) << 7).to(gl.uint16).to(gl.bfloat16,
                                                                          bitcast=True)
    s = gl.expand_dims(s, 1)  # [groups, 1, BN]: each group's scale to its words
    s = gl.broadcast(s, gl.full([s.shape[0], b.shape[0] // s.shape[0], s.shape[2]], 0,
                                gl.bfloat16, s.type.layout))[0]
    s = gl.convert_layout(gl.reshape(s, [b.shape[0], b.shape[1]]), b.type.layout)
    asm: gl.constexpr = E2M1_WORDS_ASM if FORMAT == MXFP4 else INT4_WORDS_ASM
    return gl.inline_asm_elementwise(asm, "=r," * 8 + "r,r,r", [b, s],
                                     dtype=(gl.bfloat16,) * 8, is_pure=True, pack=2)


@gluon.jit
def halves(x):
    """gl.split(x), the halves' layout made linear: Triton 3.6 cannot split
    again a tensor whose layout is a split's (a slice)."""
    a, b = gl.split(x)
    layout: gl.constexpr = gl.to_linear_layout(a.type.layout, a.shape)
    return gl.convert_layout(a, layout), gl.convert_layout(b, layout)


@gluon.jit
def load_tokens(at, mask, A_L: gl.constexpr):
    """The step's token block (at: pointers [BM, 8W]) as eight [BM, W] bf16
    in A_L, the j-th its columns 8w + j."""
    x = gl.load(at, mask=mask, other=0.0)
    x = gl.reshape(x, [x.shape[0], x.shape[1] // 8, 2, 2, 2])  # j's bits 2, 1, 0
    j0, j1 = halves(x)  # a split takes the last dimension: j's bit 0, then 1, then 2
    j00, j10 = halves(j0)
    j01, j11 = halves(j1)
    j000, j100 = halves(j00)
    j001, j101 = halves(j01)
    j010, j110 = halves(j10)
    j011, j111 = halves(j11)
    return (gl.convert_layout(j000, A_L), gl.convert_layout(j001, A_L),
            gl.convert_layout(j010, A_L), gl.convert_layout(j011, A_L),
            gl.convert_layout(j100, A_L), gl.convert_layout(j101, A_L),
            gl.convert_layout(j110, A_L), gl.convert_layout(j111, A_L))


@gluon.jit
def multiply(xs, ws, acc):
    """acc + the sum of the eight products xs[j] @ ws[j]."""
    for j in gl.static_range(8):
        acc = mma_v2(xs[j], ws[j], acc)
    return acc


@gluon.jit
def first_sums(bias, g, N, off_n, width, GATED: gl.constexpr, GLU: gl.constexpr,
               BM: gl.constexpr, BN: gl.constexpr, MMA: gl.constexpr):
    """(acc, acc_up): the sums' starting values [BM, BN] float32, the bias of
    each one's W13 row (bias = (bias_ptr [G, N] bf16, has_bias)), else 0.
    The bias starts the sums rather than ending them: nothing of it stays
    live across the K loop (w4.py adds it last; the float32 sums round a
    little differently)."""
    bias_ptr, has_bias = bias
    acc = gl.zeros([BM, BN], gl.float32, MMA)
    acc_up = gl.zeros([BM, BN], gl.float32, MMA)
    if has_bias != 0:
        n = gl.minimum(off_n + along(BN, 1, MMA), width - 1)  # past the output: never stored
        if GATED and GLU != CONCATENATED:  # INTERLEAVED: gate row 2j, up row 2j + 1
            n = 2 * n
        at = bias_ptr + g.to(gl.int64) * N + n
        acc += gl.load(at).to(gl.float32)
        if GATED:
            if GLU == CONCATENATED:
                acc_up += gl.load(at + width).to(gl.float32)
            else:
                acc_up += gl.load(at + 1).to(gl.float32)
    return acc, acc_up


@gluon.jit
def w4_unit(a_ptr, b_ptr, c_ptr, b_scale_ptr, N, K, lda, ldc, weights, rows, bias, g, start,
            end, off_n, activation, GATED: gl.constexpr, GLU: gl.constexpr, FORMAT: gl.constexpr,
            BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    """Expert g's rows start .. end, the output columns off_n .. off_n + BN
    (GATED: of h, from two accumulators, the gate rows' and the up rows'; BN
    is here the MMA tile's width).  weights = (b_group_stride, ldb,
    b_scale_group_stride, lds); rows = (rows_ptr, rows_div): GATED gathers
    a's rows as rows[r] // rows_div, else reads a's row r; bias = (bias_ptr,
    has_bias)."""
    GROUP: gl.constexpr = 128 if FORMAT == INT4_G128 else 32  # values along K a scale covers
    KW: gl.constexpr = BK // 64  # a thread's run of a row, in words (the operand layout's span)
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, KW)
    B_L: gl.constexpr = gl.DotOperandLayout(1, MMA, KW)
    W: gl.constexpr = BK // 8  # a row's words in a step
    X_L: gl.constexpr = eightfold(gl.to_linear_layout(A_L, [BM, W]))
    GROUPS: gl.constexpr = max(BK // GROUP, 1)  # scale groups in a step
    S_L: gl.constexpr = gl.SliceLayout(1, grouped(gl.to_linear_layout(B_L, [W, BN]), GROUPS))
    b_group_stride, ldb, b_scale_group_stride, lds = weights
    rows_ptr, rows_div = rows
    if GATED:
        width = N // 2  # h's columns
    else:
        width = N
    words = b_ptr.to(gl.pointer_type(gl.int32))  # strides are whole 16 bytes (host-checked)
    ldw = ldb // 4
    if FORMAT != MXFP4:  # INT4's scales are bfloat16: strides count them, not bytes
        scales = b_scale_ptr.to(gl.pointer_type(gl.bfloat16))
    else:
        scales = b_scale_ptr
    # W13's row of each column (GATED: the gate's; the up's are up_rows below).
    # Columns past the output's read its last: computed, never stored, so loads
    # need no mask.
    n_b = gl.minimum(off_n + along(BN, 1, B_L), width - 1).to(gl.int64)
    n_s = gl.minimum(off_n + along(BN, 1, S_L), width - 1).to(gl.int64)
    if GATED:
        if GLU == CONCATENATED:
            up_rows = width.to(gl.int64)  # up row I + j
        else:  # INTERLEAVED: gate row 2j, up row 2j + 1
            n_b = 2 * n_b
            n_s = 2 * n_s
            up_rows = 1
    word = along(W, 0, B_L)
    expert = words + g.to(gl.int64) * (b_group_stride // 4)
    # Rows of whole 16-byte vectors: a thread's KW words are one load.
    at = gl.multiple_of(expert + n_b * ldw, [16, 16]) + word
    group = along(GROUPS, 0, S_L) * (8 * W // GROUPS) // GROUP
    s_at = scales + g.to(gl.int64) * b_scale_group_stride + n_s * lds + group
    if GATED:  # the up rows', their alignment stated anew (ldb's is unknown to the compiler)
        at_up = gl.multiple_of(expert + (n_b + up_rows) * ldw, [16, 16]) + word
        s_at_up = s_at + up_rows * lds
    cols = along(8 * W, 1, X_L)
    for m0 in range(start, end, BM):
        b, s = load_step(at, word, s_at, group, 0, K, GROUP)
        if GATED:
            b_up, s_up = load_step(at_up, word, s_at_up, group, 0, K, GROUP)
        r = m0 + along(BM, 0, X_L)
        row_ok = r < end
        if GATED:
            src = gl.load(rows_ptr + r, mask=row_ok, other=0) // rows_div
        else:
            src = r.to(gl.int64)
        x_at = gl.multiple_of(a_ptr + src * lda, [16, 16]) + cols
        acc, acc_up = first_sums(bias, g, N, off_n, width, GATED, GLU, BM, BN, MMA)
        for k0 in range(0, K, BK):
            # the next step's loads first: in flight while this step widens and multiplies
            b_next, s_next = load_step(at, word, s_at, group, k0 + BK, K, GROUP)
            if GATED:
                b_up_next, s_up_next = load_step(at_up, word, s_at_up, group, k0 + BK, K,
                                                 GROUP)
            # K is whole groups of 32 (host-checked), not always whole steps: a mask
            x_ok = row_ok & gl.max_constancy(k0 + cols < K, [1, 8])
            xs = load_tokens(x_at + k0, x_ok, A_L)
            acc = multiply(xs, widen(b, s, FORMAT), acc)
            if GATED:
                acc_up = multiply(xs, widen(b_up, s_up, FORMAT), acc_up)
                b_up, s_up = b_up_next, s_up_next
            b, s = b_next, s_next
        if GATED:
            acc = activate(acc, acc_up, activation)
        out_r = m0 + along(BM, 0, MMA)
        out_c = off_n + along(BN, 1, MMA)
        gl.store(c_ptr + out_r.to(gl.int64) * ldc + out_c, acc.to(gl.bfloat16),
                 mask=(out_r < end) & (out_c < width))


@gluon.jit
def w4_program(a_ptr, b_ptr, c_ptr, offs_ptr, b_scale_ptr, T, N, K, G, lda, ldc, weights, rows,
               bias, activation, GATED: gl.constexpr, GLU: gl.constexpr, FORMAT: gl.constexpr,
               BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    """One persistent program: units pid, pid + P, ... of cdiv(N, BN) *
    min(T, G) (BN: W13 rows where GATED, a unit's columns of h being BN / 2)."""
    TILE_N: gl.constexpr = BN // 2 if GATED else BN  # the MMA tile's width
    n_tiles = gl.cdiv(N, BN)
    for u in range(gl.program_id(0), n_tiles * gl.minimum(T, G), gl.num_programs(0)):
        g, start, end = busy_expert(offs_ptr, G, u // n_tiles)
        w4_unit(a_ptr, b_ptr, c_ptr, b_scale_ptr, N, K, lda, ldc, weights, rows, bias, g, start,
                end, (u % n_tiles) * TILE_N, activation, GATED, GLU, FORMAT, BM, TILE_N, BK)


@gluon.jit
def zero_rows_past(c_ptr, offs_ptr, T, N, G, ldc, BM: gl.constexpr):
    """c's rows past the last expert (offs[G - 1] .. T, the dropped slots)
    written zero, BM rows a program's turn: a later kernel reads them times
    a zero weight, and uninitialised memory could be NaN."""
    Z_L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
    r = gl.expand_dims(gl.arange(0, BM, gl.SliceLayout(1, Z_L)), 1)
    c = gl.expand_dims(gl.arange(0, ZERO_N, gl.SliceLayout(0, Z_L)), 0)
    zeros = gl.zeros([BM, ZERO_N], gl.bfloat16, Z_L)
    done = gl.load(offs_ptr + G - 1)
    for m0 in range(done + gl.program_id(0) * BM, T, gl.num_programs(0) * BM):
        for n0 in range(0, N, ZERO_N):
            gl.store(c_ptr + (m0 + r).to(gl.int64) * ldc + n0 + c, zeros,
                     mask=(m0 + r < T) & (n0 + c < N))


@gluon.jit
def w4_decode_glu_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, b_scale_ptr, T, N, K, G, lda,
                         b_group_stride, ldb, b_scale_group_stride, lds, ldc, bias_ptr, has_bias,
                         activation, rows_ptr, rows_div, GLU: gl.constexpr, FORMAT: gl.constexpr,
                         USE_TMA: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                         BK: gl.constexpr, CHUNK: gl.constexpr, PRECISION: gl.constexpr):
    """w4.w4_glu_kernel's up projection: a [*, K] bf16 tokens (rows lda
    apart) gathered as rows[r] // rows_div, b [G, N, K / 2] packed as FORMAT
    says (rows ldb bytes apart) with its scales b_scale [G, N, K / group]
    (rows lds apart), bias [G, N]; c [T, N / 2] = act(gate, up) (GLU's gate
    and up rows), rows ldc apart.  BN: W13 rows a unit.  USE_TMA, CHUNK and
    PRECISION are unused."""
    w4_program(a_ptr, b_ptr, c_ptr, offs_ptr, b_scale_ptr, T, N, K, G, lda, ldc,
               (b_group_stride, ldb, b_scale_group_stride, lds), (rows_ptr, rows_div),
               (bias_ptr, has_bias), activation, True, GLU, FORMAT, BM, BN, BK)


@gluon.jit
def w4_decode_down_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, b_scale_ptr, T, N, K, G, lda,
                          b_group_stride, ldb, b_scale_group_stride, lds, ldc, bias_ptr, has_bias,
                          FORMAT: gl.constexpr, USE_TMA: gl.constexpr, BM: gl.constexpr,
                          BN: gl.constexpr, BK: gl.constexpr, CHUNK: gl.constexpr,
                          PRECISION: gl.constexpr):
    """w4.w4_ragged_m_kernel's down projection: a [T, K] bf16 (rows lda
    apart, the routing's order), b and b_scale as w4_decode_glu_kernel's;
    c [T, N] (rows ldc apart) = a @ b[g]^T (+ bias[g]), the rows past the
    last expert zero.  USE_TMA, CHUNK and PRECISION are unused."""
    w4_program(a_ptr, b_ptr, c_ptr, offs_ptr, b_scale_ptr, T, N, K, G, lda, ldc,
               (b_group_stride, ldb, b_scale_group_stride, lds), (offs_ptr, 0),
               (bias_ptr, has_bias), 0, False, CONCATENATED, FORMAT, BM, BN, BK)
    zero_rows_past(c_ptr, offs_ptr, T, N, G, ldc, BM)
