"""W4A8 at decode: MXFP4 weights multiplied by fp8 tokens with mma.sync's fp8
MMA (m16n8k32), against the wheel's W4A16 decode kernel
(aot/kernels/w4_decode.py, the weights widened to bfloat16 by widen4.py's
PTX, about three instructions a value) on the same experts' bytes.

Why: ncu has the W4A16 decode kernels issuing on about 58% of the cycles
(docs/notes/2026-11-29-w4a8-decode-probe.md): widening is most of their
instructions.  An e2m1 value becomes an e4m3 byte by moving its bits (its
value times 2^-6, subnormals included), no arithmetic: with the nibbles of
a byte taken apart by shifts and masks, about one instruction a value.
The scales cannot ride in the e4m3 exponent (e2m1's 0.5 is subnormal
there), so each MMA covers one scale group: the weights are pre-arranged
(once, at load) so that byte i of each 64-value block holds value i of its
first group (low nibble) and of its second (high nibble); the low nibbles
are one MMA's operand, the high nibbles the next's, each against its group's
32 token columns, each partial sum scaled into the accumulator in float32
(exact: the products are exact in float32).

The weights are the MMA's first operand (rows of W its M, 16 a tile), the
tokens its second (N: 8, T <= 8), so each partial sum's float32 scaling
covers 16 values a thread.  One program: BN rows of one expert, all K.

    python lab/w4a8_decode_probe.py [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

import gg_runtime
from aot.kernels.w4 import MXFP4
from aot.kernels.w4_decode import w4_decode_down_kernel
from bench.measure import graphed
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import dequantize_mxfp4, random_mxfp4

# The low nibbles of four bytes ($2) to e4m3 ($0: sign to bit 7, the other
# three bits to 4..2), the high nibbles likewise ($1).  lop3 0xE4: c ? a : b.
E2M1_TO_E4M3 = gl.constexpr("{\n.reg .b32 t, u;\n"
                "shl.b32 t, $2, 4;\nshl.b32 u, $2, 2;\nand.b32 u, u, 0x1C1C1C1C;\n"
                "lop3.b32 $0, t, u, 0x80808080, 0xE4;\n"
                "shr.b32 t, $2, 2;\nand.b32 t, t, 0x1C1C1C1C;\n"
                "lop3.b32 $1, $2, t, 0x80808080, 0xE4;\n}")

# (name, experts, N, K): gpt-oss-20b's up (2I rows) and down over its k = 4
# experts, Kimi-K2 TP8's up and down over k = 8.
PRODUCTS = (("gpt_oss_up", 4, 5760, 2880), ("gpt_oss_down", 4, 2880, 2880),
            ("kimi_tp8_up", 8, 512, 7168), ("kimi_tp8_down", 8, 7168, 256))
# (BN, PAIRS: 64-value blocks a K step, warps)
CONFIGS = ((64, 4, 4), (64, 8, 4), (32, 8, 2), (64, 16, 4), (32, 16, 2), (128, 8, 8))
BASELINE = (64, 256, 4)  # the wheel's W4A16 decode config: BN, BK, warps (BM 16)


@gluon.jit
def e8m0_to_float(e):
    """e8m0 bytes as float32 2^(e - 127) (e = 0 the subnormal 2^-127, 255 infinity)."""
    e = e.to(gl.int32)
    return gl.where(e == 0, 0x00400000, e << 23).to(gl.float32, bitcast=True)


@gluon.jit
def w4a8_decode_kernel(w_ptr, s_ptr, x_ptr, xs_ptr, out_ptr, T, N, K, BN: gl.constexpr,
                       PAIRS: gl.constexpr):
    """out [G, T, N] bf16 = (x [T, K] e4m3 times xs [T]) @ W[g]^T for expert
    g = program_id(1), rows program_id(0) * BN ..: w [G, N, K / 2] the
    pre-arranged bytes, s [G, N, K / 32] e8m0.  T <= 8; K a multiple of 64."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0],
                                                  warps_per_cta=[gl.num_warps(), 1],
                                                  instr_shape=[16, 8])
    W_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 4)
    X_L: gl.constexpr = gl.DotOperandLayout(1, MMA, 4)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    g = gl.program_id(1).to(gl.int64)
    off_n = gl.program_id(0) * BN
    n_w = gl.minimum(off_n + gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(1, W_L)), 1), N - 1)
    kb = gl.expand_dims(gl.arange(0, 32, gl.SliceLayout(0, W_L)), 0)
    # Rows of whole 32-byte blocks (K a multiple of 64): a thread's 4-byte runs are one load.
    w_at = gl.multiple_of(w_ptr + g * N * (K // 2) + n_w.to(gl.int64) * (K // 2), [32, 32]) + kb
    kx = gl.expand_dims(gl.arange(0, 32, gl.SliceLayout(1, X_L)), 1)
    t = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, X_L)), 0)
    x_at = gl.multiple_of(x_ptr + t * K, [16, 16]) + kx
    x_ok = t < T
    n_s = gl.minimum(off_n + gl.arange(0, BN, ROWS), N - 1)
    s_at = s_ptr + g * N * (K // 32) + n_s.to(gl.int64) * (K // 32)
    acc = gl.zeros([BN, 8], gl.float32, MMA)
    zero = gl.zeros([BN, 8], gl.float32, MMA)
    for k0 in range(0, K, 64 * PAIRS):
        for p in gl.static_range(PAIRS):
            k = k0 + 64 * p
            ok = k < K
            packed = gl.load(w_at + k // 2, mask=ok, other=0)
            low, high = gl.inline_asm_elementwise(
                E2M1_TO_E4M3, "=r,=r,r", [packed], dtype=(gl.float8e4nv, gl.float8e4nv),
                is_pure=True, pack=4)
            xa = gl.load(x_at + k, mask=x_ok & ok, other=0.0)
            xb = gl.load(x_at + k + 32, mask=x_ok & ok, other=0.0)
            sa = e8m0_to_float(gl.load(s_at + k // 32, mask=ok, other=0))
            sb = e8m0_to_float(gl.load(s_at + k // 32 + 1, mask=ok, other=0))
            acc += mma_v2(low, xa, zero) * gl.expand_dims(sa, 1)
            acc += mma_v2(high, xb, zero) * gl.expand_dims(sb, 1)
    rows = off_n + gl.expand_dims(gl.arange(0, BN, ROWS), 1)
    cols = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, MMA)), 0)
    token_scale = gl.load(xs_ptr + cols, mask=cols < T, other=0.0) * 64.0  # e2m1 as e4m3: x 2^-6
    gl.store(out_ptr + g * T * N + cols * N + rows, (acc * token_scale).to(gl.bfloat16),
             mask=(rows < N) & (cols < T))


def pre_arranged(packed: torch.Tensor) -> torch.Tensor:
    """MXFP4 bytes [G, N, K / 2] (value 2c in byte c's low nibble) -> the
    kernel's: byte i of each 64-value block = value i of its first 32 (low
    nibble) | value i of its second 32 (high nibble)."""
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)  # [G, N, K]
    blocks = codes.unflatten(-1, (-1, 2, 32))
    return (blocks[..., 0, :] | (blocks[..., 1, :] << 4)).flatten(-2).contiguous()


def run_product(name, experts, n, k, tokens):
    w = random_mxfp4(experts, n, k, exponents=(115, 123))
    packed, scales = w.values.view(torch.uint8), w.scales.view(torch.uint8)
    exact = dequantize_mxfp4(packed, scales)  # [G, N, K] float64
    x = torch.randn(tokens, k, device="cuda")
    x_fp8, x_scale = gg_runtime.quantize_fp8(x, "rowwise")[:2]
    x_q = x_fp8.double() * x_scale.double()[:, None]
    want = torch.einsum("tk,gnk->gtn", x_q, exact)
    arranged = pre_arranged(packed)
    launches, errors = {}, {}
    for bn, pairs, warps in CONFIGS:
        out = torch.full((experts, tokens, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        label = f"w4a8_{bn}x{pairs}x{warps}"

        def launch(out=out, bn=bn, pairs=pairs, warps=warps):
            w4a8_decode_kernel[(triton.cdiv(n, bn), experts)](
                arranged, scales, x_fp8, x_scale, out, tokens, n, k, BN=bn, PAIRS=pairs,
                num_warps=warps)

        launch()
        errors[label] = rel_error(out.double(), want)
        launches[label] = graphed(launch)
    # The wheel's W4A16 decode kernel on the same bytes: each expert's rows the tokens (bf16).
    x16 = x.bfloat16().repeat(experts, 1)
    rows = experts * tokens
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * tokens
    out16 = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bn, bk, warps = BASELINE
    units = triton.cdiv(n, bn) * min(rows, experts)

    def baseline():
        w4_decode_down_kernel[(min(units, 3 * 132),)](
            x16, packed, out16, offs, scales, rows, n, k, experts, k, n * (k // 2), k // 2,
            n * (k // 32), k // 32, n, out16, 0, FORMAT=MXFP4, USE_TMA=False, BM=16, BN=bn,
            BK=bk, CHUNK=0, PRECISION=0, num_warps=warps)

    baseline()
    want16 = torch.einsum("tk,gnk->gtn", x.bfloat16().double(), exact)
    errors["w4a16_wheel"] = rel_error(out16.view(experts, tokens, n).double(), want16)
    launches["w4a16_wheel"] = graphed(baseline)
    for label, error in errors.items():
        assert error < 1e-2, f"{name} T={tokens} {label}: relative error {error:.2e}"
    times = time_in_turns(launches)
    weight_bytes = packed.numel() + scales.numel()
    return {"product": name, "experts": experts, "N": n, "K": k, "T": tokens, "errors": errors,
            "us": {label: ms * 1e3 for label, ms in times.items()},
            "TBps": {label: weight_bytes / ms / 1e9 for label, ms in times.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--tokens", default="1,8")
    args = parser.parse_args()
    rows = []
    for name, experts, n, k in PRODUCTS:
        for tokens in map(int, args.tokens.split(",")):
            row = run_product(name, experts, n, k, tokens)
            rows.append(row)
            base = row["us"]["w4a16_wheel"]
            print(f"{name} T={tokens}: " + " ".join(
                f"{label} {us:.1f} us ({base / us:.2f}x, {row['TBps'][label]:.2f} TB/s, "
                f"err {row['errors'][label]:.1e})" for label, us in row["us"].items()),
                flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
