"""4-bit (MXFP4, INT4) moe_experts at decode as fp8's split forward runs it
(aot/kernels/experts_decode_split.py): one launch whose programs take
tickets, the up projection's (slot, 128 columns of h, part of H), then the
down projection's (token, BN rows of H), no routing, no combine.  h is
stored in bfloat16 (the wheel's 4-bit forward stores it so).  Two kernels:

- `mma` (default): the wheel's w4_decode_split kernel
  (aot/kernels/w4_decode_split.py, Gluon: each product on mma.sync, the
  packed weights widened in its operand registers), JIT-compiled with any
  config, parts of H and down parts; configs BNxBKxWARPS;
- `--fma` (w4_split_kernel here, Triton): products on the CUDA cores (a slot
  is one token's row), the bytes widened without their scales (widen4.py's
  steps less the scale's), multiplied in float32, summed over each scale
  group and then scaled; configs BKxBNxPAIRSxWARPS.

Question: how far below the wheel's 4-bit decode (routing, two Gluon MMA
kernels, combine) and our fp8 decode does this bring the 4-bit forward at
T = 1-8 on the w4_experts section's shapes (bench/sections/w4_experts.py)?
No biases (the section has none).  JIT-compiled by the GPU host's Triton;
each forward replayed from a CUDA graph with the L2 flushed; each output
against the wheel's 4-bit forward.

    python lab/w4_decode_split_probe.py [--fma] [--tokens 1 8] [--splits 1,2,4,8]
        [--configs ...] [--programs 1,2] [--down-splits 1,2] [--filter NAME] [--all]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

import gg_runtime
from aot.axes import ACTIVATION
from aot.kernels.experts_decode import w13_rows
from aot.kernels.w4_decode_split import w4_decode_split_kernel
from aot.kernels.glu import CONCATENATED, INTERLEAVED, act
from aot.kernels.widen4 import _asm, _shifted
from bench.measure import graphed
from bench.sections.fp8_experts import routed_tokens
from bench.sections.w4_experts import MODELS, random_w4
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_ms
from gg_runtime.testing.w4 import widened

CHUNK = tl.constexpr(128)  # h's columns a unit
MXFP4_FORMAT, INT4_FORMAT = tl.constexpr(0), tl.constexpr(1)


def _int4_unscaled(out, scale, offset):
    """widen4._int4_step less the scale: q = u - 8 exactly."""
    return (_shifted("p", -offset)
            + f"lop3.b32 t, {'t' if offset else 'p'}, 0x000F000F, 0x43004300, 0xEA;\n"
            f"fma.rn.bf16x2 ${out}, t, one, less;\n")


def _e2m1_unscaled(out, scale, offset):
    """widen4._e2m1_step less the scale: the e2m1 value exactly."""
    sign = 12 - offset
    sign_bits = f"shl.b32 u, p, {sign};\nand.b32 u, u, 0x80008000;\n" if sign else \
        "and.b32 u, p, 0x80008000;\n"
    return (_shifted("p", 6 - offset) + sign_bits
            + "lop3.b32 t, t, 0x01C001C0, u, 0xEA;\n"
            f"fma.rn.bf16x2 ${out}, t, bias, nz;\n")


INT4_UNSCALED = _asm("one, less;\nmov.b32 one, 0x3F803F80;\nmov.b32 less, 0xC308C308;\n",
                     _int4_unscaled)
E2M1_UNSCALED = _asm("u, bias;\nmov.b32 bias, 0x7E807E80;\n", _e2m1_unscaled)


@triton.jit
def pairs(b, FORMAT: tl.constexpr):
    """Bytes as (their low nibbles' values, their high nibbles') bfloat16,
    unscaled."""
    if FORMAT == MXFP4_FORMAT:
        lo, hi = tl.inline_asm_elementwise(E2M1_UNSCALED, "=r,=r,=r,=r,r", [b],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True,
                                           pack=4)
    else:
        lo, hi = tl.inline_asm_elementwise(INT4_UNSCALED, "=r,=r,=r,=r,r", [b],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True,
                                           pack=4)
    return lo, hi


@triton.jit
def values2(b, R: tl.constexpr, C: tl.constexpr, FORMAT: tl.constexpr):
    """Bytes [R, C] as their values [R, 2C] float32 in K's order."""
    lo, hi = pairs(b, FORMAT)
    return tl.join(lo, hi).reshape(R, 2 * C).to(tl.float32)


@triton.jit
def values3(b, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, FORMAT: tl.constexpr):
    """Bytes [P, R, C] as their values [P, R, 2C] float32 in K's order."""
    lo, hi = pairs(b, FORMAT)
    return tl.join(lo, hi).reshape(P, R, 2 * C).to(tl.float32)


@triton.jit
def scales_f32(s, FORMAT: tl.constexpr):
    """Raw scales as float32: MXFP4's e8m0 2^(e - 127) (e = 0 the subnormal
    2^-127, 255 infinity), INT4's bfloat16."""
    if FORMAT == MXFP4_FORMAT:
        e = s.to(tl.int32)
        return tl.where(e == 0, 0x00400000, e << 23).to(tl.float32, bitcast=True)
    else:
        return s.to(tl.float32)


@triton.jit
def w4_split_kernel(x_ptr, ids_ptr, weights_ptr, k, w13_ptr, s13_ptr, w2_ptr, s2_ptr, gu_ptr,
                    h_ptr, counters_ptr, out_ptr, T, H, N, G, splits, w13_gs, ld13, s13_gs,
                    lds13, w2_gs, ld2, s2_gs, lds2, activation, FORMAT: tl.constexpr,
                    GLU: tl.constexpr, GROUP: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
                    PAIRS: tl.constexpr):
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK)
    units = T * k * chunks
    up_tickets = units * splits
    tickets = up_tickets + T * tl.cdiv(H, BN)
    ticket = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
    while ticket < tickets:
        if ticket < up_tickets:
            up_part(ticket, x_ptr, ids_ptr, k, w13_ptr, s13_ptr, gu_ptr, h_ptr, counters_ptr, H,
                    inter, G, splits, units, w13_gs, ld13, s13_gs, lds13, activation, FORMAT,
                    GLU, GROUP, BK)
        else:
            down_rows(ticket - up_tickets, ids_ptr, weights_ptr, k, w2_ptr, s2_ptr, h_ptr,
                      counters_ptr, out_ptr, H, inter, G, units, w2_gs, ld2, s2_gs, lds2,
                      FORMAT, GROUP, BN, PAIRS)
        ticket = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")


@triton.jit
def row_sums(w_ptr, s_ptr, rows, x_ptr, k_lo, k_hi, K, ld, lds, FORMAT: tl.constexpr,
             GROUP: tl.constexpr, BK: tl.constexpr):
    """[128] float32: the 4-bit rows `rows` (bytes ld apart, scales lds
    apart) times x over K's k_lo .. k_hi."""
    c = tl.arange(0, BK // 2)
    ks = tl.arange(0, BK)
    gs = tl.arange(0, BK // GROUP)
    acc = tl.zeros((CHUNK,), dtype=tl.float32)
    row_at = w_ptr + rows.to(tl.int64)[:, None] * ld
    s_at = s_ptr + rows.to(tl.int64)[:, None] * lds
    for k0 in range(k_lo, k_hi, BK):
        b = tl.load(row_at + (k0 // 2 + c)[None, :], mask=(k0 + 2 * c < K)[None, :], other=0)
        s = tl.load(s_at + (k0 // GROUP + gs)[None, :], mask=(k0 + gs * GROUP < K)[None, :],
                    other=0)
        x = tl.load(x_ptr + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
        w = values2(b, CHUNK, BK // 2, FORMAT)
        grouped = tl.sum((w * x[None, :]).reshape(CHUNK, BK // GROUP, GROUP), axis=2)
        acc += tl.sum(grouped * scales_f32(s, FORMAT), axis=1)
    return acc


@triton.jit
def up_part(ticket, x_ptr, ids_ptr, k, w13_ptr, s13_ptr, gu_ptr, h_ptr, counters_ptr, H, inter,
            G, splits, units, w13_gs, ld13, s13_gs, lds13, activation, FORMAT: tl.constexpr,
            GLU: tl.constexpr, GROUP: tl.constexpr, BK: tl.constexpr):
    chunks = tl.cdiv(inter, CHUNK)
    unit = ticket // splits
    split = ticket % splits
    slot = unit // chunks
    column = unit % chunks
    expert = tl.load(ids_ptr + slot)
    kept = (expert >= 0) & (expert < G)
    g = tl.where(kept, expert, 0).to(tl.int64)
    j = column * CHUNK + tl.arange(0, CHUNK)
    jc = tl.minimum(j, inter - 1)  # past I: computed, never used
    per_split = tl.cdiv(tl.cdiv(H, BK), splits) * BK
    k_lo = split * per_split
    k_hi = tl.minimum(k_lo + per_split, H)
    cols = tl.arange(0, CHUNK)
    part = gu_ptr + (split * units + unit).to(tl.int64) * 2 * CHUNK + cols
    if kept:
        x_row = x_ptr + (slot // k).to(tl.int64) * H
        gate = row_sums(w13_ptr + g * w13_gs, s13_ptr + g * s13_gs, w13_rows(jc, 0, inter, GLU),
                        x_row, k_lo, k_hi, H, ld13, lds13, FORMAT, GROUP, BK)
        up = row_sums(w13_ptr + g * w13_gs, s13_ptr + g * s13_gs, w13_rows(jc, 1, inter, GLU),
                      x_row, k_lo, k_hi, H, ld13, lds13, FORMAT, GROUP, BK)
        tl.store(part, gate)
        tl.store(part + CHUNK, up)
    tl.debug_barrier()
    arrived = tl.atomic_add(counters_ptr + 2 + unit, 1, sem="acq_rel", scope="gpu")
    if arrived == splits - 1:
        if kept:
            gate = tl.zeros((CHUNK,), dtype=tl.float32)
            up = tl.zeros((CHUNK,), dtype=tl.float32)
            first = gu_ptr + unit.to(tl.int64) * 2 * CHUNK + cols
            for s in range(0, splits):
                gate += tl.load(first + s.to(tl.int64) * units * 2 * CHUNK, cache_modifier=".cg")
                up += tl.load(first + s.to(tl.int64) * units * 2 * CHUNK + CHUNK,
                              cache_modifier=".cg")
            h = tl.where(j < inter, act(gate, up, activation), 0.0)
            tl.store(h_ptr + unit.to(tl.int64) * CHUNK + cols, h.to(tl.bfloat16))
        tl.debug_barrier()
        tl.atomic_add(counters_ptr + 1, 1, sem="release", scope="gpu")


@triton.jit
def down_rows(d, ids_ptr, weights_ptr, k, w2_ptr, s2_ptr, h_ptr, counters_ptr, out_ptr, H, inter,
              G, units, w2_gs, ld2, s2_gs, lds2, FORMAT: tl.constexpr, GROUP: tl.constexpr,
              BN: tl.constexpr, PAIRS: tl.constexpr):
    SG: tl.constexpr = CHUNK // GROUP if GROUP <= CHUNK else 1  # scale groups a chunk
    GW: tl.constexpr = CHUNK // SG  # values a group covers within a chunk
    chunks = tl.cdiv(inter, CHUNK)
    row_tiles = tl.cdiv(H, BN)
    token = d // row_tiles
    n = (d % row_tiles) * BN + tl.arange(0, BN)
    n_ok = n < H
    nc = tl.minimum(n, H - 1).to(tl.int64)
    c = tl.arange(0, CHUNK // 2)
    cols = tl.arange(0, CHUNK)
    gs = tl.arange(0, SG)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for first in range(0, k * chunks, PAIRS):
        pair = first + tl.arange(0, PAIRS)
        slot = token * k + pair // chunks
        column = pair % chunks
        expert = tl.load(ids_ptr + slot, mask=pair < k * chunks, other=-1)
        kept = (pair < k * chunks) & (expert >= 0) & (expert < G)
        g = tl.where(kept, expert, 0).to(tl.int64)
        byte = column[:, None] * (CHUNK // 2) + c[None, :]  # [PAIRS, 64]
        b = tl.load(w2_ptr + (g * w2_gs)[:, None, None] + (nc * ld2)[None, :, None]
                    + byte[:, None, :], mask=kept[:, None, None] & (2 * byte < inter)[:, None, :],
                    other=0)
        group = (column[:, None] * CHUNK + gs[None, :] * GW) // GROUP  # [PAIRS, SG]
        s = tl.load(s2_ptr + (g * s2_gs)[:, None, None] + (nc * lds2)[None, :, None]
                    + group[:, None, :],
                    mask=kept[:, None, None] & (group * GROUP < inter)[:, None, :], other=0)
        weight = tl.load(weights_ptr + slot, mask=kept, other=0.0)
        if first == 0:
            while tl.atomic_add(counters_ptr + 1, 0, sem="acquire", scope="gpu") < units:
                pass
            tl.debug_barrier()
        unit = slot * chunks + column
        h = tl.load(h_ptr + unit.to(tl.int64)[:, None] * CHUNK + cols[None, :],
                    mask=kept[:, None] & (column[:, None] * CHUNK + cols[None, :] < inter),
                    other=0.0, cache_modifier=".cg").to(tl.float32)
        w = values3(b, PAIRS, BN, CHUNK // 2, FORMAT)  # [PAIRS, BN, 128]
        grouped = tl.sum((w * h[:, None, :]).reshape(PAIRS, BN, SG, GW), axis=3)
        sums = tl.sum(grouped * scales_f32(s, FORMAT), axis=2)  # [PAIRS, BN]
        acc += tl.sum(sums * weight[:, None], axis=0)
    tl.store(out_ptr + token.to(tl.int64) * H + n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


def split_forward(x, ids, weights, w13, w2, gate_up, activation, splits, programs, config,
                  mma, down_splits=1):
    """The split forward (mma: the wheel's kernel, its down tickets' pairs in
    down_splits parts) as a closure over its buffers."""
    T, H = x.shape
    k = ids.shape[1]
    E, N, _ = w13.values.shape
    inter = N // 2
    group = H // w13.scales.shape[2]
    units = T * k * triton.cdiv(inter, 128)
    rows_a_ticket = config[0] if mma else config[1]
    row_tiles = triton.cdiv(H, rows_a_ticket)
    gu = torch.empty(splits, units, 256, device="cuda")
    h = torch.empty(units, 128, device="cuda", dtype=torch.bfloat16)
    dsum = torch.empty(down_splits, T, H, device="cuda")
    counters = torch.zeros(2 + units + T * row_tiles, dtype=torch.int32, device="cuda")
    out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
    wts = weights.reshape(-1).float()
    v13, s13, v2, s2 = (t.view(torch.uint8) for t in (w13.values, w13.scales, w2.values,
                                                       w2.scales))
    strides = (w13.values.stride(0), w13.values.stride(1), w13.scales.stride(0),
               w13.scales.stride(1), w2.values.stride(0), w2.values.stride(1),
               w2.scales.stride(0), w2.scales.stride(1))
    tickets = units * splits + T * row_tiles * down_splits
    grid = (min(tickets, programs),)
    act_code = ACTIVATION.code(activation)
    glu = INTERLEAVED if gate_up == "interleaved" else CONCATENATED
    if mma:
        BN, BK, warps = config
        w4_format = 0 if w13.format == "mxfp4" else (2 if group == 128 else 1)
        ids64 = ids.reshape(-1).contiguous()

        def run():
            counters.zero_()
            w4_decode_split_kernel[grid](
                x, ids64, wts, k, v13, s13, v2, s2, act_code, gu, h, dsum, counters, out, T, H,
                N, E, splits, down_splits, *strides, FORMAT=w4_format, GLU=glu, USE_TMA=False,
                BM=16, BN=BN, BK=BK, CHUNK=0, PRECISION=0, num_warps=warps)
            return out
        return run
    BK, BN, PAIRS, warps = config
    fmt = MXFP4_FORMAT if w13.format == "mxfp4" else INT4_FORMAT
    if w13.format != "mxfp4":
        s13, s2 = w13.scales, w2.scales
    ids32 = ids.reshape(-1).to(torch.int32)

    def run_fma():
        counters.zero_()
        w4_split_kernel[grid](x, ids32, wts, k, v13, s13, v2, s2, gu, h, counters, out, T, H, N,
                              E, splits, *strides, act_code, FORMAT=fmt, GLU=glu, GROUP=group,
                              BK=BK, BN=BN, PAIRS=PAIRS, num_warps=warps)
        return out
    return run_fma


def fp8_twin(w, experts: int):
    """w's widened weights in fp8, 128 x 128 blocks, an expert at a time."""
    qs = [gg_runtime.quantize_fp8(widened(w._replace(values=w.values[e:e + 1],
                                                     scales=w.scales[e:e + 1]))[0].bfloat16(),
                                  "128x128") for e in range(experts)]
    return gg_runtime.Quantized(torch.stack([q[0] for q in qs]), torch.stack([q[1] for q in qs]),
                                "128x128")


def probe_model(model: str, args, sms: int) -> None:
    H, inter, E, k, gate_up, activation, fmt = MODELS[model]
    torch.manual_seed(0)
    w13, w2 = random_w4(E, 2 * inter, H, fmt), random_w4(E, H, inter, fmt)
    w13_fp8, w2_fp8 = fp8_twin(w13, E), fp8_twin(w2, E)
    options = dict(gate_up=gate_up, activation=activation)
    for T in args.tokens:
        x, ids, weights = routed_tokens(T, H, E, k)
        ref = gg_runtime.moe_experts(x, ids, weights, w13, w2, **options).float()
        row = [f"{model} T={T}"]
        for name, fn in (("w4", lambda: gg_runtime.moe_experts(x, ids, weights, w13, w2,
                                                                **options)),
                         ("fp8", lambda: gg_runtime.moe_experts(x, ids, weights, w13_fp8, w2_fp8,
                                                                 **options))):
            row.append(f"{name} {1e3 * min(time_ms(graphed(fn)) for _ in range(3)):.1f}")
        best = None
        for config in args.configs.split(","):
            numbers = tuple(int(v) for v in config.split("x"))
            step = numbers[1] if not args.fma else numbers[0]  # K a step of the up tickets
            for splits in (int(s) for s in args.splits.split(",")):
                if splits > triton.cdiv(H, step):
                    continue
                for per_sm, down in itertools.product(
                        (int(p) for p in args.programs.split(",")),
                        [1] if args.fma else (int(d) for d in args.down_splits.split(","))):
                    fn = split_forward(x, ids, weights, w13, w2, gate_up, activation, splits,
                                       per_sm * sms, numbers, not args.fma, down)
                    err = rel_error(fn().float(), ref)
                    us = 1e3 * min(time_ms(graphed(fn)) for _ in range(3))
                    tag = f"{config}/s{splits}/p{per_sm}/d{down}"
                    if err > 2e-2:
                        row.append(f"{tag} BAD {err:.1e}")
                    if args.all:
                        row.append(f"{tag} {us:.1f}")
                    if best is None or us < best[0]:
                        best = (us, tag, err)
        row.append(f"best {best[1]} {best[0]:.1f} (err {best[2]:.1e})")
        print(" | ".join(row), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--splits", default="1,2,4,8")
    parser.add_argument("--fma", action="store_true", help="the CUDA-core kernel")
    parser.add_argument("--configs", help="mma: BNxBKxWARPS,... (default "
                        "64x256x4,32x256x4,64x128x4,64x256x8); fma: BKxBNxPAIRSxWARPS,... "
                        "(default 128x32x8x4,256x32x8x8,128x16x16x4)")
    parser.add_argument("--programs", default="1,2", help="programs an SM, a list")
    parser.add_argument("--down-splits", default="1", help="mma: the down tickets' parts, a list")
    parser.add_argument("--filter", default="")
    parser.add_argument("--all", action="store_true", help="every config's time, not the best")
    args = parser.parse_args()
    if args.configs is None:
        args.configs = ("128x32x8x4,256x32x8x8,128x16x16x4" if args.fma else
                        "64x256x4,32x256x4,64x128x4,64x256x8")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for model in MODELS:
        if args.filter in model:
            probe_model(model, args, sms)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
