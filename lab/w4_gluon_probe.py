"""4-bit (MXFP4, INT4) routed products at decode in Gluon, the widened
weights never in shared memory, against the routed Triton kernels
(aot/kernels/w4.py, JIT at their decode config) on the same routing: each
kernel alone, replayed from a CUDA graph, its output checked against
Triton's, and the packed weight bytes it reads per second.

Why: at T = 1 w4.py's kernels stream the weights far below the H200's
bandwidth, and splitting K over more programs did not help, so the limit
is each K step's latency: Triton widens the bytes in a blocked layout, then
takes the bfloat16 tile to mma.sync's operand layout through shared memory
(st.shared, ldmatrix) every step.  Here the packed weights are loaded
straight into mma.sync's operand layout (m16n8k16: Gluon's mma_v2), widened
there by widen4.py's PTX and multiplied from registers.

How: a sum over K is the same in any order of K, both operands taking the
same order.  The weights are loaded as int32 words (K 8w .. 8w + 7 of a
row) in the MMA's operand-B layout, a word being one K of eight products:
product j multiplies the weights at K 8w + j (nibble j of each word; one PTX
instance widens two words) by the tokens' columns 8w + j, which the tokens'
row block, loaded whole in 16-byte vectors, gives by reshape and split
within each thread (no shared memory, no shuffles).  SPLIT of the warps
each take a part of every K step (the MMA's batch dimension, summed once a
tile), the others split N.  The next step's words and scales are loaded
before this step is widened (a register double buffer).  Grid (cdiv(N, BN),
min(S, E)): program (n, i) takes the i-th expert that has rows (from the
routing's offs, no host sync), its rows BM at a time.  The up projection's
BN columns of h come from the gate rows n and the up rows I + n (two
accumulators), then SwiGLU (glu_ws.activate); both projections store rows
in the routing's order.

SPLITK (a config's fifth field): at T = 1 the grid above is too few
programs each walking all of K (Kimi-K2 TP8's up projection: 64 on 132
SMs, 7168 deep).  SPLITK > 1 adds a third grid dimension, each program
summing its part of K's steps into float32 part sums [SPLITK, S, N] (the
up projection's gate and up sums both: [SPLITK, S, 2I]), and
w4_splitk_reduce_kernel sums the parts, then applies the same epilogue
(SwiGLU or none) into bfloat16; a config's time is both kernels' (one
graph).  BN = 16 is a config too where SPLIT >= 2 (the warps along N then
span 16 columns).

    python lab/w4_gluon_probe.py [--filter NAME] [--tokens 1,8,64] [--json OUT]
        [--configs BNxBKxKWxSPLIT[xSPLITK],...]
    python lab/w4_gluon_probe.py --check [--sass FILE]  # compile for sm90, no GPU
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from aot.kernels.glu_ws import activate
from aot.kernels.w4_decode import halves
from aot.kernels.widen4 import E2M1_WORDS_ASM, INT4_WORDS_ASM
from aot.kernels.ws import plus, vector_layout

# (H, I, E, k, format, group), as lab/w4_decode_probe.py's make_case takes them.
SHAPES = {"gpt_oss_20b": (2880, 2880, 32, 4, "mxfp4", 32),
          "kimi_k2_tp8": (7168, 256, 384, 8, "int4", 32),
          "qwen3_30b_a3b": (2048, 768, 128, 8, "int4", 128)}
MXFP4, INT4 = gl.constexpr(0), gl.constexpr(1)
BM, WARPS = 16, 4
# (BN, BK, KW, SPLIT, SPLITK): BN output columns a program (the up
# projection's are h's: 2 * BN rows of w13), BK values of K a step, KW the
# operands' k_width, SPLIT warps along K.  A thread's run of a row is KW words
# (8 or 16 bytes) and the operand layout spans 8 * KW words: BK / SPLIT >=
# 64 * KW.  The warps not along K span N 8 columns each: BN >= 8 * WARPS /
# SPLIT (BN = 16: SPLIT >= 2).  SPLITK > 1: a third grid dimension of SPLITK
# parts of K's steps, each writing float32 part sums, then
# w4_splitk_reduce_kernel (both timed); measured only where every part has a
# step (SPLITK <= cdiv(K, BK)).  Labels drop a SPLITK of 1.
CONFIGS = ((32, 256, 2, 2, 1), (32, 512, 4, 2, 1), (64, 256, 4, 1, 1), (128, 128, 2, 1, 1),
           (16, 512, 4, 2, 1), (32, 512, 4, 2, 2), (32, 512, 4, 2, 4), (32, 512, 4, 2, 8),
           (64, 256, 4, 1, 4), (16, 512, 4, 2, 4))
REDUCE_BLOCK, REDUCE_WARPS = 512, 4
TRITON_CONFIG = (16, 64, 128, 4, 4)  # w4_glu's decode config (BM, BN, BK, warps, stages)


def config_label(config):
    """BNxBKxKWxSPLIT, then xSPLITK where it is not 1."""
    return "x".join(map(str, config if config[4] != 1 else config[:4]))


def parse_configs(text):
    """BNxBKxKWxSPLIT[xSPLITK],...: 5-tuples (SPLITK 1 where left out)."""
    configs = [tuple(map(int, c.split("x"))) for c in text.split(",")]
    if any(len(c) not in (4, 5) for c in configs):
        raise argparse.ArgumentTypeError("a config is BNxBKxKWxSPLIT[xSPLITK]")
    return [c + (1,) * (5 - len(c)) for c in configs]


@gluon.constexpr_function
def mma_layout(split, warps):
    """mma.sync's accumulator [SPLIT, BM, BN]: `split` warps along the batch
    dimension (parts of K), the others along N."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[split, 1, warps // split],
                                     instr_shape=[1, 16, 8])


@gluon.constexpr_function
def eightfold(words):
    """The tokens' layout [SPLIT, BM, 8W]: a thread holds columns 8w .. 8w + 7
    where `words` ([SPLIT, BM, W], linear) holds w, those 8 its first
    registers, so that its columns are runs in memory."""
    s, m, w = words.shape
    wide = [[[b[0], b[1], 8 * b[2]] for b in bases]
            for bases in (words.reg_bases, words.lane_bases, words.warp_bases)]
    return gl.DistributedLinearLayout([[0, 0, 1], [0, 0, 2], [0, 0, 4]] + wide[0], wide[1],
                                      wide[2], [], [s, m, 8 * w])


@gluon.constexpr_function
def grouped(words, groups):
    """`words` ([SPLIT, W, BN], linear) seen as [SPLIT, groups, W / groups, BN]."""
    s, w, n = words.shape
    split = [[[b[0], b[1] // (w // groups), b[1] % (w // groups), b[2]] for b in bases]
             for bases in (words.reg_bases, words.lane_bases, words.warp_bases)]
    return gl.DistributedLinearLayout(*split, [], [s, groups, w // groups, n])


@gluon.jit
def along(n: gl.constexpr, dim: gl.constexpr, layout: gl.constexpr):
    """arange(n) along dimension `dim` of a rank-3 layout, shaped to broadcast."""
    if dim == 0:
        i = gl.arange(0, n, gl.SliceLayout(1, gl.SliceLayout(2, layout)))
        return gl.expand_dims(gl.expand_dims(i, 1), 2)
    elif dim == 1:
        i = gl.arange(0, n, gl.SliceLayout(0, gl.SliceLayout(2, layout)))
        return gl.expand_dims(gl.expand_dims(i, 0), 2)
    else:
        i = gl.arange(0, n, gl.SliceLayout(0, gl.SliceLayout(1, layout)))
        return gl.expand_dims(gl.expand_dims(i, 0), 1)


@gluon.jit
def busy_expert(offs_ptr, E, E_P: gl.constexpr):
    """(g, start, end): the rows of the program_id(1)-th expert that has rows
    (offs [E]: each expert's end; E_P a power of two >= E), or an empty
    range: the grid spans the experts in use, not all E."""
    e = gl.arange(0, E_P, vector_layout(E_P, gl.num_warps()))
    ends = gl.load(offs_ptr + e, mask=e < E, other=0)
    starts = gl.load(offs_ptr + e - 1, mask=(e > 0) & (e < E), other=0)
    busy = (ends > starts).to(gl.int32)
    mine = (busy == 1) & (gl.associative_scan(busy, 0, plus) == gl.program_id(1) + 1)
    return (gl.sum(gl.where(mine, e, 0), 0), gl.sum(gl.where(mine, starts, 0), 0),
            gl.sum(gl.where(mine, ends, 0), 0))


@gluon.jit
def load_step(at, word, s_at, group, k0, K, GROUP: gl.constexpr, EVEN_K: gl.constexpr):
    """Step k0's words (at + k0 / 8, word: each one's index in a step) and
    raw scales (s_at + k0 / GROUP, group: each one's in a step), none past K."""
    if EVEN_K:  # a step is whole or wholly past K: one predicate
        b = gl.load(at + k0 // 8, mask=k0 < K, other=0)
        s = gl.load(s_at + k0 // GROUP, mask=k0 < K, other=0)
    else:  # K is whole groups of 32 values (host-checked): 4 words agree
        b = gl.load(at + k0 // 8, mask=gl.max_constancy(k0 // 8 + word < K // 8, [1, 4, 1]),
                    other=0)
        s = gl.load(s_at + k0 // GROUP, mask=k0 // GROUP + group < K // GROUP, other=0)
    return b, s


@gluon.jit
def widen(b, s, FORMAT: gl.constexpr):
    """The words' weights as eight bf16 tensors of b's shape and layout, the
    j-th the values at K 8w + j, each times its group's scale (s)."""
    if FORMAT == MXFP4:  # widen4.e8m0_scales: 2^(e - 127), e = 0 the subnormal 2^-127
        s = gl.where(s == 0, 0x40, s.to(gl.uint16) << 7).to(gl.uint16).to(gl.bfloat16,
                                                                          bitcast=True)
    s = gl.expand_dims(s, 2)  # [SPLIT, groups, 1, BN]: each group's scale to its words
    s = gl.broadcast(s, gl.full([s.shape[0], s.shape[1], b.shape[1] // s.shape[1], s.shape[3]],
                                0, gl.bfloat16, s.type.layout))[0]
    s = gl.convert_layout(gl.reshape(s, [b.shape[0], b.shape[1], b.shape[2]]), b.type.layout)
    asm: gl.constexpr = E2M1_WORDS_ASM if FORMAT == MXFP4 else INT4_WORDS_ASM
    return gl.inline_asm_elementwise(asm, "=r," * 8 + "r,r,r", [b, s],
                                     dtype=(gl.bfloat16,) * 8, is_pure=True, pack=2)


@gluon.jit
def load_tokens(at, mask, A_L: gl.constexpr):
    """The step's token block (at: pointers [SPLIT, BM, 8W]) as eight
    [SPLIT, BM, W] bf16 in A_L, the j-th its columns 8w + j."""
    x = gl.load(at, mask=mask, other=0.0)
    x = gl.reshape(x, [x.shape[0], x.shape[1], x.shape[2] // 8, 2, 2, 2])  # j's bits 2, 1, 0
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
    for j in gl.static_range(8):
        acc = mma_v2(xs[j], ws[j], acc)
    return acc


@gluon.jit(do_not_specialize=["S"])  # S: the JIT's one compile for every T
def w4_gluon_kernel(x_ptr, w_ptr, s_ptr, out_ptr, order_ptr, offs_ptr, N, K, E, k, w_stride,
                    s_stride, S, GATED: gl.constexpr, FORMAT: gl.constexpr, GROUP: gl.constexpr,
                    EVEN_K: gl.constexpr, E_P: gl.constexpr, BM: gl.constexpr,
                    BN: gl.constexpr, BK: gl.constexpr, KW: gl.constexpr, SPLIT: gl.constexpr,
                    SPLITK: gl.constexpr):
    """out [S, N] bf16 (rows in the routing's order) of expert g's rows
    (busy_expert).  GATED: x [*, K] gathered as order[r] // k, w [E, 2N, K/8]
    int32 words of packed bytes (gate rows, then up), out = act(gate, up);
    else x [S, K] in the routing's order, w [E, N, K/8], out = x @ w[g]^T.
    s [E, rows, K / GROUP]: the scales (MXFP4's e8m0 bytes, INT4's bf16);
    w_stride, s_stride: an expert's words, scales.  EVEN_K: BK divides K.
    Split s of step k0 takes K from k0 + s * BK / SPLIT.
    SPLITK > 1: program_id(2) = p takes the steps [p * steps // SPLITK,
    (p + 1) * steps // SPLITK) of the cdiv(K, BK) (none where SPLITK > steps:
    its sums 0) and out is float32 [SPLITK, S, N] of part sums (GATED:
    [SPLITK, S, 2N], the gate's sums then the up's), which
    w4_splitk_reduce_kernel sums, then activates."""
    MMA: gl.constexpr = mma_layout(SPLIT, gl.num_warps())
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, KW)
    B_L: gl.constexpr = gl.DotOperandLayout(1, MMA, KW)
    W: gl.constexpr = BK // 8 // SPLIT  # a row's words in a split's step
    X_L: gl.constexpr = eightfold(gl.to_linear_layout(A_L, [SPLIT, BM, W]))
    G: gl.constexpr = max(8 * W // GROUP, 1)  # scale groups in a split's step
    S_L: gl.constexpr = gl.SliceLayout(2, grouped(gl.to_linear_layout(B_L, [SPLIT, W, BN]), G))
    g, start, end = busy_expert(offs_ptr, E, E_P)
    g = g.to(gl.int64)
    # Columns past N read column N - 1: computed, never stored, so loads need no mask.
    n = gl.minimum(gl.program_id(0) * BN + along(BN, 2, B_L), N - 1).to(gl.int64)
    word = along(SPLIT, 0, B_L) * W + along(W, 1, B_L)
    # Rows of whole 16-byte vectors (host-checked): a thread's KW words are one.
    at = gl.multiple_of(w_ptr + g * w_stride + n * (K // 8), [16, 16, 16]) + word
    n = gl.minimum(gl.program_id(0) * BN + along(BN, 2, S_L), N - 1).to(gl.int64)
    group = (along(SPLIT, 0, S_L) * 8 * W + along(G, 1, S_L) * (8 * W // G)) // GROUP
    s_at = s_ptr + g * s_stride + n * (K // GROUP) + group
    up_w = N.to(gl.int64) * (K // 8)  # GATED: the up rows' offset from the gate rows'
    up_s = N.to(gl.int64) * (K // GROUP)
    if SPLITK == 1:
        k_lo = 0
        k_hi = K
    else:  # whole steps; k_hi <= k_lo an empty part.  A bound of loads: a step's or K
        steps = gl.cdiv(K, BK)
        k_lo = gl.multiple_of((gl.program_id(2) * steps // SPLITK) * BK, BK)
        k_hi = gl.minimum(((gl.program_id(2) + 1) * steps // SPLITK) * BK, K)
    for m0 in range(start, end, BM):
        b, s = load_step(at, word, s_at, group, k_lo, k_hi, GROUP, EVEN_K)
        if GATED:
            b_up, s_up = load_step(at + up_w, word, s_at + up_s, group, k_lo, k_hi, GROUP,
                                   EVEN_K)
        rows = m0 + along(BM, 1, X_L)
        row_ok = rows < end
        if GATED:
            src = gl.load(order_ptr + rows, mask=row_ok, other=0) // k
        else:
            src = rows.to(gl.int64)
        cols = along(SPLIT, 0, X_L) * (8 * W) + along(8 * W, 2, X_L)
        x_at = gl.multiple_of(x_ptr + src * K, [16, 16, 16]) + cols
        acc = gl.zeros([SPLIT, BM, BN], gl.float32, MMA)
        acc_up = gl.zeros([SPLIT, BM, BN], gl.float32, MMA)
        for k0 in range(k_lo, k_hi, BK):
            # the next step's loads first: in flight while this step widens and multiplies
            b_next, s_next = load_step(at, word, s_at, group, k0 + BK, k_hi, GROUP, EVEN_K)
            if GATED:
                b_up_next, s_up_next = load_step(at + up_w, word, s_at + up_s, group, k0 + BK,
                                                 k_hi, GROUP, EVEN_K)
            if EVEN_K:
                x_ok = row_ok
            else:
                x_ok = row_ok & gl.max_constancy(k0 + cols < k_hi, [1, 1, 8])
            xs = load_tokens(x_at + k0, x_ok, A_L)
            acc = multiply(xs, widen(b, s, FORMAT), acc)
            if GATED:
                acc_up = multiply(xs, widen(b_up, s_up, FORMAT), acc_up)
                b_up, s_up = b_up_next, s_up_next
            b, s = b_next, s_next
        out = gl.sum(acc, 0)  # the splits' parts of K (once a tile: shared memory if SPLIT > 1)
        if GATED:
            out_up = gl.sum(acc_up, 0)
            if SPLITK == 1:
                out = activate(out, out_up, 0)
        OUT_L: gl.constexpr = out.type.layout
        rows = m0 + gl.expand_dims(gl.arange(0, BM, gl.SliceLayout(1, OUT_L)), 1)
        cols = gl.program_id(0) * BN + gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(0, OUT_L)),
                                                      0)
        if SPLITK == 1:
            gl.store(out_ptr + rows.to(gl.int64) * N + cols, out.to(gl.bfloat16),
                     mask=(rows < end) & (cols < N))
        else:  # float32 part sums [SPLITK, S, N or 2N]
            if GATED:
                width = 2 * N
            else:
                width = N
            part_at = out_ptr + (gl.program_id(2) * S + rows).to(gl.int64) * width + cols
            gl.store(part_at, out, mask=(rows < end) & (cols < N))
            if GATED:
                gl.store(part_at + N, out_up, mask=(rows < end) & (cols < N))


@gluon.jit(do_not_specialize=["S"])
def w4_splitk_reduce_kernel(part_ptr, out_ptr, S, N, GATED: gl.constexpr, SPLITK: gl.constexpr,
                            BLOCK: gl.constexpr):
    """out [S, N] bf16 = the sum of w4_gluon_kernel's SPLITK part sums
    (part [SPLITK, S, N]), or (GATED, part [SPLITK, S, 2N]) activate(the
    gate's sum, the up's), as its SPLITK = 1 epilogue.  Grid (S, cdiv(N, BLOCK))."""
    L: gl.constexpr = gl.BlockedLayout([BLOCK // 32 // gl.num_warps()], [32], [gl.num_warps()],
                                       [0])
    row = gl.program_id(0).to(gl.int64)
    cols = gl.program_id(1) * BLOCK + gl.arange(0, BLOCK, L)
    ok = cols < N
    if GATED:
        width = 2 * N
    else:
        width = N
    at = part_ptr + row * width + cols
    part = S.to(gl.int64) * width
    acc = gl.load(at, mask=ok, other=0.0)
    if GATED:
        acc_up = gl.load(at + N, mask=ok, other=0.0)
    for p in gl.static_range(1, SPLITK):
        acc += gl.load(at + p * part, mask=ok, other=0.0)
        if GATED:
            acc_up += gl.load(at + p * part + N, mask=ok, other=0.0)
    if GATED:
        acc = activate(acc, acc_up, 0)
    gl.store(out_ptr + row * N + cols, acc.to(gl.bfloat16), mask=ok)


def variants(configs):
    """{(GATED, FORMAT, GROUP, EVEN_K, config): label}: each shape's two
    projections at each of `configs` whose step fits K."""
    found = {}
    for H, inter, _, _, fmt, group in SHAPES.values():
        for gated, K in ((True, H), (False, inter)):
            for config in (c for c in configs if c[1] <= K):
                key = (gated, MXFP4 if fmt == "mxfp4" else INT4, group, K % config[1] == 0, config)
                found[key] = (f"{'up' if gated else 'down'} {fmt} g{group} "
                              f"{'even' if key[3] else 'tail'} " + config_label(config))
    return found


def compile_sm90(gated, fmt, group, even_k, config):
    """triton.compile for sm90 without a GPU, as aot/compile.py does; the
    arguments the JIT would see as multiples of 16 marked so."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    BN, BK, KW, SPLIT, SPLITK = config
    signature = dict(x_ptr="*bf16", w_ptr="*i32", s_ptr="*u8" if fmt == MXFP4 else "*bf16",
                     out_ptr="*bf16" if SPLITK == 1 else "*fp32", order_ptr="*i64",
                     offs_ptr="*i32", N="i32", K="i32", E="i32", k="i32", w_stride="i32",
                     s_stride="i32", S="i32")
    aligned = [i for i, name in enumerate(signature) if name not in ("E", "k", "S")]
    constexprs = dict(GATED=gated, FORMAT=fmt, GROUP=group, EVEN_K=even_k, E_P=512, BM=BM,
                      BN=BN, BK=BK, KW=KW, SPLIT=SPLIT, SPLITK=SPLITK)
    signature.update({name: "constexpr" for name in constexprs})
    source = GluonASTSource(fn=w4_gluon_kernel, signature=signature, constexprs=constexprs,
                            attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=WARPS, num_stages=1, enable_fp_fusion=True))


def compile_reduce_sm90(gated, splitk):
    """w4_splitk_reduce_kernel compiled for sm90 as compile_sm90 compiles."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    signature = dict(part_ptr="*fp32", out_ptr="*bf16", S="i32", N="i32")
    constexprs = dict(GATED=gated, SPLITK=splitk, BLOCK=REDUCE_BLOCK)
    signature.update({name: "constexpr" for name in constexprs})
    source = GluonASTSource(fn=w4_splitk_reduce_kernel, signature=signature,
                            constexprs=constexprs,
                            attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1, 3)})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=REDUCE_WARPS, num_stages=1,
                                       enable_fp_fusion=True))


def sass_of(compiled):
    """(SASS, "REG:r STACK:s SHARED:bytes"): cuobjdump's registers and stack,
    Triton's (dynamic) shared memory."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass, usage = (subprocess.run([triton.knobs.nvidia.cuobjdump.path, flag, f.name],
                                      check=True, capture_output=True, text=True).stdout
                       for flag in ("-sass", "--dump-resource-usage"))
    return sass, f"{re.search(r'REG:[0-9]+ STACK:[0-9]+', usage).group(0)} " \
                 f"SHARED:{compiled.metadata.shared}"


def k_loop(sass):
    """The opcodes of the K loop: the shortest backward branch's body that
    holds every HMMA."""
    code = [(int(at, 16), text) for at, text in
            re.findall(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass)]
    ops = [(at, text.split()[1 if text.startswith("@") else 0]) for at, text in code]
    mma = [at for at, op in ops if op.startswith("HMMA")]
    loops = [(int(m.group(1), 16), at) for at, text in code
             if (m := re.search(r"BRA\W+0x([0-9a-f]+)", text)) and int(m.group(1), 16) < at]
    lo, hi = min(((lo, hi) for lo, hi in loops if lo <= mma[0] and mma[-1] <= hi),
                 key=lambda span: span[1] - span[0])
    return [op for at, op in ops if lo <= at <= hi]


def check(args):
    """Compile every variant for sm90; count in its K loop the loads by width,
    shared memory's instructions and the MMAs.  Returns the failures."""
    failed, found = 0, variants(args.configs)
    for key, label in found.items():
        try:
            sass, usage = sass_of(compile_sm90(*key))
        except Exception as error:  # noqa: BLE001 (report every variant)
            failed += 1
            print(f"{label:36s} FAILED: {str(error).strip().splitlines()[-1][:300]}")
            continue
        ops = k_loop(sass)
        kinds = ("LDG.E.U8", "LDG.E.U16", "LDG.E", "LDG.E.64", "LDG.E.128", "STS", "LDS",
                 "LDSM", "SHFL", "BAR", "HMMA.16816.F32.BF16")
        counts = " ".join(f"{kind}:{n}" for kind in kinds if (n := ops.count(kind)))
        print(f"{label:36s} {usage} K loop {len(ops)} ops: {counts}", flush=True)
        if label == args.sass_variant and args.sass:
            with open(args.sass, "w") as f:
                f.write(sass)
    reduces = sorted({(key[0], key[4][4]) for key in found if key[4][4] > 1}, reverse=True)
    for gated, splitk in reduces:
        label = f"reduce {'up' if gated else 'down'} splitk {splitk}"
        try:
            sass, usage = sass_of(compile_reduce_sm90(gated, splitk))
        except Exception as error:  # noqa: BLE001 (report every variant)
            failed += 1
            print(f"{label:36s} FAILED: {str(error).strip().splitlines()[-1][:300]}")
            continue
        ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@\S+\s+)?([A-Z0-9.]+)",
                                               sass)]
        counts = " ".join(f"{kind}:{n}" for kind in ("LDG.E", "LDG.E.64", "LDG.E.128",
                                                     "STG.E.U16", "STG.E", "STG.E.64")
                          if (n := ops.count(kind)))
        print(f"{label:36s} {usage} {len(ops)} ops: {counts}", flush=True)
    print(f"triton {triton.__version__}: {failed} of {len(found) + len(reduces)} variants "
          f"failed ({len(found)} products, {len(reduces)} reductions)")
    return failed


def operands(case, fmt):
    """(x, w13 and w2 as bytes, their scales: MXFP4's as bytes) of a
    make_case case (its weights Quantized)."""
    import torch
    (w13, s13, _), (w2, s2, _) = case["w13"], case["w2"]
    if fmt == "mxfp4":
        s13, s2 = s13.view(torch.uint8), s2.view(torch.uint8)
    return case["x"], w13.view(torch.uint8), w2.view(torch.uint8), s13, s2


def triton_products(case, fmt, group, routing):
    """(up, down, h, ys): w4.py's kernels at TRITON_CONFIG, JIT, launched as
    lab/w4_decode_probe.py's routed_kernels launches them, into h and ys."""
    import torch
    from aot.kernels.w4 import INT4_G32, INT4_G128, w4_glu_kernel, w4_ragged_m_kernel
    from aot.kernels.w4 import MXFP4 as W4_MXFP4
    bm, bn, bk, warps, stages = TRITON_CONFIG
    x, w13, w2, s13, s2 = operands(case, fmt)
    H, (E, N), S, k = x.shape[1], w13.shape[:2], routing.order.numel(), case["topk_ids"].shape[1]
    h = torch.empty(S, N // 2, device="cuda", dtype=torch.bfloat16)
    ys = torch.empty(S, H, device="cuda", dtype=torch.bfloat16)
    common = dict(FORMAT=W4_MXFP4 if fmt == "mxfp4" else INT4_G128 if group == 128 else INT4_G32,
                  USE_TMA=False, BM=bm, BN=bn, BK=bk, CHUNK=64, PRECISION=0, num_warps=warps,
                  num_stages=stages)

    def up():
        grid = (min((triton.cdiv(S, bm) + E + 1) * triton.cdiv(N, bn), 132 * 16),)
        w4_glu_kernel[grid](x, w13, h, routing.offs, s13, S, N, H, E, x.stride(0), w13.stride(0),
                            w13.stride(1), s13.stride(0), s13.stride(1), N // 2, x, 0, 0,
                            routing.order, k, GLU=2, **common)

    def down():
        grid = (min((triton.cdiv(S, bm) + E + 1) * triton.cdiv(H, bn), 132 * 16),)
        w4_ragged_m_kernel[grid](h, w2, ys, routing.offs, s2, S, H, N // 2, E, h.stride(0),
                                 w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), H, x, 0,
                                 **common)
    return up, down, h, ys


def gluon_product(case, fmt, group, routing, config, gated, h, out):
    """w4_gluon_kernel at config as a closure: the up projection of x into
    out (gated), or the down projection of h into out; SPLITK > 1 into
    float32 part sums (made here, held by the closure), then
    w4_splitk_reduce_kernel's sum into out."""
    import torch
    BN, BK, KW, SPLIT, SPLITK = config
    x, w13, w2, s13, s2 = operands(case, fmt)
    w, s = (w13, s13) if gated else (w2, s2)
    assert w.is_contiguous() and w.shape[2] % 16 == 0  # rows of whole 16-byte vectors
    words, K, N, E = w.view(torch.int32), 2 * w.shape[2], out.shape[1], w.shape[0]
    S = routing.order.numel()
    parts = out if SPLITK == 1 else torch.empty(SPLITK, S, (1 + gated) * N, device=out.device,
                                                dtype=torch.float32)

    def run():
        w4_gluon_kernel[(triton.cdiv(N, BN), min(S, E), SPLITK)](
            x if gated else h, words, s, parts, routing.order, routing.offs, N, K, E,
            case["topk_ids"].shape[1], words.stride(0), s.stride(0), S, GATED=gated,
            FORMAT=MXFP4 if fmt == "mxfp4" else INT4, GROUP=group, EVEN_K=K % BK == 0,
            E_P=max(triton.next_power_of_2(E), 128), BM=BM, BN=BN, BK=BK, KW=KW, SPLIT=SPLIT,
            SPLITK=SPLITK, num_warps=WARPS, num_stages=1)
        if SPLITK > 1:
            w4_splitk_reduce_kernel[(S, triton.cdiv(N, REDUCE_BLOCK))](
                parts, out, S, N, GATED=gated, SPLITK=SPLITK, BLOCK=REDUCE_BLOCK,
                num_warps=REDUCE_WARPS, num_stages=1)
    return run


def measure(args):
    """Each shape and T: the up, then the down, projection of Triton and of
    each config (the down ones all reading Triton's h)."""
    import torch

    import gg_runtime
    from bench.measure import graphed
    from gg_runtime.testing import rel_error, time_in_turns
    from lab.w4_decode_probe import make_case
    rows = []
    for name, (H, inter, E, k, fmt, group) in SHAPES.items():
        if args.filter not in name:
            continue
        for T in map(int, args.tokens.split(",")):
            torch.manual_seed(T)
            case = make_case(H, inter, E, k, fmt, group, T)
            routing = gg_runtime.moe.route(case["topk_ids"], E)
            t_up, t_down, h, ys = triton_products(case, fmt, group, routing)
            t_up()
            t_down()
            touched = int(torch.unique(case["topk_ids"]).numel())
            _, w13, w2, s13, s2 = operands(case, fmt)
            for proj, ref, triton_fn, K, weights in (("up", h, t_up, H, (w13, s13)),
                                                     ("down", ys, t_down, inter, (w2, s2))):
                nbytes = touched * sum(t[0].numel() * t.element_size() for t in weights)
                fns, errors = {"triton": graphed(triton_fn) or triton_fn}, {}
                for config in (c for c in args.configs
                               if c[1] <= K and c[4] <= triton.cdiv(K, c[1])):
                    label, out = config_label(config), torch.empty_like(ref)
                    run = gluon_product(case, fmt, group, routing, config, proj == "up", h, out)
                    try:
                        out.fill_(float("nan"))
                        run()
                        errors[label] = rel_error(out, ref.float())
                        fns[label] = graphed(run) or run
                    except Exception as error:  # noqa: BLE001 (report, go on)
                        print(f"  {label}: {type(error).__name__}: {str(error)[:300]}")
                us = {n: 1e3 * v for n, v in time_in_turns(fns, turns=3).items()}
                tbps = {n: nbytes / v / 1e6 for n, v in us.items()}
                rows.append({"shape": name, "T": T, "proj": proj, "touched": touched,
                             "weight_bytes": nbytes, "us": us, "tbps": tbps, "errors": errors})
                print(f"{name:14s} T={T:3d} {proj:4s} " + " | ".join(
                    f"{n} {us[n]:6.1f}us {tbps[n]:4.2f}TB/s"
                    + (f" err {errors[n]:.0e}" if n in errors else "") for n in us), flush=True)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", default="1,8,64")
    parser.add_argument("--configs", type=parse_configs, default=CONFIGS,
                        help="BNxBKxKWxSPLIT[xSPLITK],... (default: CONFIGS)")
    parser.add_argument("--check", action="store_true",
                        help="only compile every variant for sm90 (no GPU); count its K loop")
    parser.add_argument("--sass", help="with --check: write --sass-variant's SASS there")
    parser.add_argument("--sass-variant", default="up mxfp4 g32 tail 32x256x2x2")
    args = parser.parse_args()
    if args.check:
        raise SystemExit(1 if check(args) else 0)
    measure(args)


if __name__ == "__main__":
    main()
