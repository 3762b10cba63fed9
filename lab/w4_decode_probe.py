"""4-bit moe_experts at decode in one kernel, the fp8 decode forward's units
(aot/kernels/experts_decode.py: a tile of an expert's slots and 128 columns
of h, both projections a unit, the parts summed by combine_parts) with
4-bit weights (MXFP4 or INT4) widened to bfloat16 and bfloat16 tokens
(W4A16), JIT-compiled by the GPU host's Triton; against the wheel's 4-bit
forward (the routed w4_glu / w4_ragged_m path) and its fp8 forward on the
same weights, each replayed from a CUDA graph with the L2 flushed.

Variants: the weights widened by Triton's integer and float ops
(`generic`) or as aot/kernels/w4.py widens them (`asm`: widen4.py's inline
PTX); the weights
as the MMA's first operand (an expert's 128 rows its M, as fp8 decode has
them) or second.  `--sweep`: the routed kernels (aot/kernels/w4.py) alone
at several configs; `--wheel`: the installed wheel's 4-bit and fp8
forwards (run it under two wheels for an A/B), with `--force` also each
decode kernel variant forced.  Measured in
docs/notes/2026-11-29-w4-widening-in-ptx.md.

    python lab/w4_decode_probe.py [--filter NAME] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

import gg_runtime
from bench.measure import graphed
from aot.kernels.combine import combine_parts_kernel
from aot.kernels.experts_decode import CHUNK_COLUMNS, locate_unit, slot_groups
from aot.kernels.glu import act
from aot.kernels.w4 import widened as kernel_widened
from aot.kernels.widen4 import e8m0_scales
from gg_runtime.testing import forced, rel_error, time_in_turns
from gg_runtime.testing.moe_fp8 import fp8_experts
from gg_runtime.testing.timing import time_ms
from gg_runtime.testing.w4 import moe_experts_w4_ref, random_int4, random_mxfp4, widened

MXFP4 = tl.constexpr(0)
INT4 = tl.constexpr(1)

# (H, I, E, k, format, group) of issue 82's served shapes.
SHAPES = {"gpt_oss_20b": (2880, 2880, 32, 4, "mxfp4", 32),
          "gpt_oss_120b": (2880, 2880, 128, 4, "mxfp4", 32),
          "kimi_k2_tp8": (7168, 256, 384, 8, "int4", 32),
          "kimi_k2_tp8_mxfp4": (7168, 256, 384, 8, "mxfp4", 32),
          "qwen3_30b_a3b_int4": (2048, 768, 128, 8, "int4", 128)}
TOKENS = (1, 2, 4, 8)
PROGRAMS = 132 * 4


@triton.jit
def widen(b, scale_ptrs, scale_ok, R: tl.constexpr, BK: tl.constexpr, FORMAT: tl.constexpr,
          GROUP: tl.constexpr, ASM: tl.constexpr):
    """b [R, BK / 2] packed bytes; scale_ptrs [R, GROUPS] the step's scales
    (MXFP4's bytes, INT4's bfloat16) -> the weights [R, BK] bfloat16."""
    GROUPS: tl.constexpr = max(BK // GROUP, 1)
    raw = tl.load(scale_ptrs, mask=scale_ok, other=0)
    scale = e8m0_scales(raw) if FORMAT == MXFP4 else raw
    if ASM:
        return kernel_widened(b, raw, FORMAT, R, BK, GROUPS)
    v = tl.join(b & 15, b >> 4).reshape(R, BK)
    if FORMAT == MXFP4:
        v16 = v.to(tl.uint16)
        bits = ((v16 & 8) << 12) | ((v16 & 7) << 6)
        w = bits.to(tl.bfloat16, bitcast=True).to(tl.float32) * 2.0 ** 126
    else:
        w = (v.to(tl.int32) - 8).to(tl.float32)
    w = w.reshape(R, GROUPS, BK // GROUPS) * scale.to(tl.float32)[:, :, None]
    return w.reshape(R, BK).to(tl.bfloat16)


@triton.jit
def w4_decode_kernel(x_ptr, ids_ptr, k, w13_ptr, w13_scale_ptr, w2_ptr, w2_scale_ptr, parts_ptr,
                     S, H, N, G, FORMAT: tl.constexpr, GROUP: tl.constexpr, ASM: tl.constexpr,
                     FIRST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """x [*, H] bf16; ids [S]; w13 [G, 2I, H/2] bytes (concatenated gate,
    up) with scales [G, 2I, H/GROUP]; w2 [G, H, I/2] with [G, H, I/GROUP];
    parts [S, C, H] float32."""
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    if FORMAT == INT4:
        w13_scale_ptr = w13_scale_ptr.to(tl.pointer_type(tl.bfloat16))
        w2_scale_ptr = w2_scale_ptr.to(tl.pointer_type(tl.bfloat16))
    w13_desc = tl.make_tensor_descriptor(w13_ptr, shape=[G, 2, inter, H // 2],
                                         strides=[N * (H // 2), inter * (H // 2), H // 2, 1],
                                         block_shape=[1, 1, CHUNK_COLUMNS, BK // 2])
    w2_desc = tl.make_tensor_descriptor(w2_ptr, shape=[G, H, inter // 2],
                                        strides=[H * (inter // 2), inter // 2, 1],
                                        block_shape=[1, BN, CHUNK_COLUMNS // 2])
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    units = tl.sum(groups[2])
    GROUPS: tl.constexpr = max(BK // GROUP, 1)
    for t in range(tl.program_id(0), units, tl.num_programs(0)):
        g, slots, row_ok, column = locate_unit(t, groups, chunks, BM)
        g64 = g.to(tl.int64)
        x_rows = x_ptr + (slots // k).to(tl.int64) * H
        first = column * CHUNK_COLUMNS
        j = first + tl.arange(0, CHUNK_COLUMNS)
        j_ok = j < inter
        ks = tl.arange(0, BK)
        gs = tl.arange(0, GROUPS)
        gate = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
        up = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
        scale_rows = w13_scale_ptr + (g64 * N + j) * tl.cdiv(H, GROUP)
        for k0 in range(0, H, BK):
            xs = tl.load(x_rows[:, None] + k0 + ks[None, :],
                         mask=row_ok[:, None] & (k0 + ks[None, :] < H), other=0.0)
            s_ok = j_ok[:, None] & ((k0 // GROUP + gs[None, :]) * GROUP < H)
            wg = widen(w13_desc.load([g, 0, first, k0 // 2]).reshape(CHUNK_COLUMNS, BK // 2),
                       scale_rows[:, None] + k0 // GROUP + gs[None, :], s_ok, CHUNK_COLUMNS, BK,
                       FORMAT, GROUP, ASM)
            wu = widen(w13_desc.load([g, 1, first, k0 // 2]).reshape(CHUNK_COLUMNS, BK // 2),
                       scale_rows[:, None] + inter * tl.cdiv(H, GROUP) + k0 // GROUP
                       + gs[None, :], s_ok, CHUNK_COLUMNS, BK, FORMAT, GROUP, ASM)
            if FIRST:
                gate = tl.dot(wg, xs.T, gate)
                up = tl.dot(wu, xs.T, up)
            else:
                gate += tl.dot(xs, wg.T).T
                up += tl.dot(xs, wu.T).T
        h = tl.where(j_ok[None, :], act(gate.T, up.T, 0), 0.0).to(tl.bfloat16)  # [BM, 128]
        parts = parts_ptr + (slots.to(tl.int64) * chunks + column) * H
        CG: tl.constexpr = max(CHUNK_COLUMNS // GROUP, 1)
        cgs = tl.arange(0, CG)
        for n0 in range(0, H, BN):
            ns = n0 + tl.arange(0, BN)
            n_ok = ns < H
            s_ok = n_ok[:, None] & ((first // GROUP + cgs[None, :]) * GROUP < inter)
            w = widen(w2_desc.load([g, n0, first // 2]).reshape(BN, CHUNK_COLUMNS // 2),
                      w2_scale_ptr + (g64 * H + ns)[:, None] * tl.cdiv(inter, GROUP)
                      + first // GROUP + cgs[None, :], s_ok, BN, CHUNK_COLUMNS, FORMAT, GROUP,
                      ASM)
            if FIRST:
                part = tl.dot(w, h.T)
            else:
                part = tl.dot(h, w.T).T
            tl.store(parts[None, :] + ns[:, None], part, mask=row_ok[None, :] & n_ok[:, None])


def fp8_twin(case):
    """case with its 4-bit weights widened, then quantized to fp8 in 128 x
    128 blocks: the fp8 forward on the same weights."""
    w13, w2 = fp8_experts(widened(case["w13"]).bfloat16(), widened(case["w2"]).bfloat16(),
                          "128x128")
    return dict(case, w13=w13, w2=w2)


def make_case(H, inter, E, k, fmt, group, T):
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, device="cuda")[:k] for _ in range(T)])
    weights = torch.rand(T, k, device="cuda")
    if fmt == "mxfp4":
        w13, w2 = random_mxfp4(E, 2 * inter, H), random_mxfp4(E, H, inter)
    else:
        w13, w2 = random_int4(E, 2 * inter, H, group), random_int4(E, H, inter, group)
    return dict(x=x, topk_ids=ids, topk_weights=weights, w13=w13, w2=w2)


def probe_forward(case, fmt, group, asm, first, bn=128, bk=128, warps=4, stages=3):
    x, ids, weights = case["x"], case["topk_ids"].reshape(-1), case["topk_weights"]
    (w13, s13, _), (w2, s2, _) = ((t.view(torch.uint8) for t in case[n]) for n in ("w13", "w2"))
    T, H = x.shape
    E, N, _ = w13.shape
    k = case["topk_ids"].shape[1]
    S = T * k
    chunks = triton.cdiv(N // 2, 128)
    parts = torch.empty(S, chunks, H, device="cuda")
    out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
    grid = (min((triton.cdiv(S, 16) + min(S, E)) * chunks, PROGRAMS),)
    fmt_code = 0 if fmt == "mxfp4" else 1

    def run():
        w4_decode_kernel[grid](x, ids, k, w13, s13, w2, s2, parts, S, H, N, E, FORMAT=fmt_code,
                               GROUP=group, ASM=asm, FIRST=first, BM=16, BN=bn, BK=bk,
                               num_warps=warps, num_stages=stages)
        combine_parts_kernel[(min(T * triton.cdiv(H, 32), PROGRAMS),)](
            parts, ids, weights, out, T, H, k, E, chunks, USE_TMA=False, BM=1, BN=32, BK=256,
            CHUNK=0, PRECISION=0, num_warps=8, num_stages=1)
        return out
    return run



def weight_bytes(case, touched):
    E = case["w13"].shape[0]
    per_expert = sum(t.view(torch.uint8).numel() for n in ("w13", "w2") for t in case[n][:2]) / E
    return per_expert * touched


# (BM, BN, BK, warps, stages) of the routed kernels (aot/kernels/w4.py).
SWEEP_CONFIGS = ((16, 64, 128, 4, 4), (16, 32, 128, 4, 4), (16, 64, 256, 4, 3),
                 (16, 128, 128, 4, 4), (16, 64, 128, 2, 4), (16, 32, 256, 2, 4),
                 (16, 128, 256, 8, 3), (16, 64, 128, 4, 6), (16, 64, 128, 4, 8),
                 (16, 128, 128, 8, 4), (16, 64, 256, 4, 4), (16, 32, 256, 4, 6),
                 (32, 64, 128, 4, 4), (64, 128, 64, 4, 4))


def routed_kernels(case, fmt, group, config):
    """The wheel's routed 4-bit forward's two products (w4_glu_kernel,
    w4_ragged_m_kernel of this tree, JIT) at `config`, as two closures."""
    from aot.kernels.w4 import INT4_G32, INT4_G128, MXFP4 as W4_MXFP4
    from aot.kernels.w4 import w4_glu_kernel, w4_ragged_m_kernel
    BM, BN, BK, warps, stages = config
    x, ids = case["x"], case["topk_ids"]
    (w13, s13, _), (w2, s2, _) = case["w13"], case["w2"]
    w13, w2 = w13.view(torch.uint8), w2.view(torch.uint8)
    if fmt == "mxfp4":
        s13, s2, code = s13.view(torch.uint8), s2.view(torch.uint8), W4_MXFP4
    else:
        code = INT4_G128 if group == 128 else INT4_G32
    T, H = x.shape
    E, N, _ = w13.shape
    k = ids.shape[1]
    S = T * k
    routing = gg_runtime.moe.route(ids, E)
    h = torch.empty(S, N // 2, device="cuda", dtype=torch.bfloat16)
    ys = torch.empty(S, H, device="cuda", dtype=torch.bfloat16)
    common = dict(FORMAT=code, USE_TMA=False, BM=BM, BN=BN, BK=BK, CHUNK=64, PRECISION=0,
                  num_warps=warps, num_stages=stages)

    def up():
        grid = (min((triton.cdiv(S, BM) + E + 1) * triton.cdiv(N, BN), 132 * 16),)
        w4_glu_kernel[grid](x, w13, h, routing.offs, s13, S, N, H, E, x.stride(0), w13.stride(0),
                            w13.stride(1), s13.stride(0), s13.stride(1), N // 2, x, 0, 0,
                            routing.order, k, GLU=2, **common)

    def down():
        grid = (min((triton.cdiv(S, BM) + E + 1) * triton.cdiv(H, BN), 132 * 16),)
        w4_ragged_m_kernel[grid](h, w2, ys, routing.offs, s2, S, H, N // 2, E, h.stride(0),
                                 w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), H, x, 0,
                                 **common)
    return up, down


def sweep(args):
    """Each routed product alone at each of SWEEP_CONFIGS."""
    rows = []
    for name, (H, inter, E, k, fmt, group) in SHAPES.items():
        if args.filter not in name:
            continue
        for T in map(int, args.tokens.split(",")):
            torch.manual_seed(T)
            case = make_case(H, inter, E, k, fmt, group, T)
            fns = {}
            for config in SWEEP_CONFIGS:
                label = "x".join(map(str, config))
                try:
                    up, down = routed_kernels(case, fmt, group, config)
                    up()
                    down()
                    fns[label + " up"] = graphed(up)
                    fns[label + " down"] = graphed(down)
                except Exception as error:
                    print(f"  {config}: {type(error).__name__}: {str(error)[:200]}")
            times = {n: 1e3 * v for n, v in time_in_turns(fns, turns=2).items()}
            rows.append({"shape": name, "T": T, "us": times})
            print(f"{name} T={T}: " + "; ".join(f"{n} {v:.1f}" for n, v in times.items()),
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def forced_decode_variants(w4) -> dict:
    """{key: the 4-bit forward replayed from a CUDA graph with that variant of
    w4_decode_glu or w4_decode_down forced}, for each of this GPU's variants
    that can run the call (the others, refused, left out)."""
    arch = 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]
    fns = {}
    for variant in gg_runtime._C.variants():
        if variant["family"] not in ("w4_decode_glu", "w4_decode_down") \
                or variant["arch"] != arch:
            continue
        try:
            with forced(variant=variant["key"]):
                fn = graphed(w4)
        except ValueError:
            continue
        fns[variant["key"].split(".", 3)[3]] = fn
    return fns


def wheel_only(args):
    """The wheel's 4-bit forward and its fp8 forward on the same weights, at
    args.tokens, each replayed from a CUDA graph where T <= 256."""
    rows = []
    for name, (H, inter, E, k, fmt, group) in SHAPES.items():
        if args.filter not in name:
            continue
        for T in map(int, args.tokens.split(",")):
            torch.manual_seed(T)
            case = make_case(H, inter, E, k, fmt, group, T)
            fp8_case = fp8_twin(case)
            w4 = lambda: gg_runtime.moe_experts(**case)  # noqa: E731
            fp8 = lambda: gg_runtime.moe_experts(**fp8_case)  # noqa: E731
            error = rel_error(w4(), moe_experts_w4_ref(**case)) if T <= 256 else None
            fns = ({"w4": graphed(w4), "fp8": graphed(fp8)} if T <= 256
                   else {"w4": w4, "fp8": fp8})
            if args.force and T <= 256:
                fns.update(forced_decode_variants(w4))
            times = {n: 1e3 * v for n, v in time_in_turns(fns, turns=3).items()}
            rows.append({"shape": name, "T": T, "us": times, "error": error})
            print(f"{name:20s} T={T:5d} w4 {times['w4']:8.1f} fp8 {times['fp8']:8.1f} "
                  f"x fp8 {times['fp8'] / times['w4']:.2f} error {error}", flush=True)
            for key in sorted(set(times) - {"w4", "fp8"}):
                print(f"    forced {key}: {times[key]:8.1f}", flush=True)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", default="1,2,4,8")
    parser.add_argument("--wheel", action="store_true",
                        help="only the wheel's 4-bit and fp8 forwards (an A/B of two wheels, "
                             "each in processes of its own)")
    parser.add_argument("--force", action="store_true",
                        help="with --wheel: also each decode kernel variant that can run a row, "
                             "forced")
    parser.add_argument("--sweep", action="store_true",
                        help="the routed kernels alone at each of SWEEP_CONFIGS")
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    if args.wheel:
        return wheel_only(args)
    if args.sweep:
        return sweep(args)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    src = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src))
    bandwidth = 2 * src.numel() / copy_ms / 1e9  # TB/s
    print(f"copy bandwidth {bandwidth:.2f} TB/s", flush=True)
    rows = []
    for name, (H, inter, E, k, fmt, group) in SHAPES.items():
        if args.filter not in name:
            continue
        for T in map(int, args.tokens.split(",")):
            if T * k > min(E, 64):
                continue
            torch.manual_seed(T)
            case = make_case(H, inter, E, k, fmt, group, T)
            reference = moe_experts_w4_ref(**case)
            fp8_case = fp8_twin(case)
            fns = {"w4_wheel": graphed(lambda: gg_runtime.moe_experts(**case)),
                   "fp8_wheel": graphed(lambda: gg_runtime.moe_experts(**fp8_case))}
            errors = {"w4_wheel": rel_error(gg_runtime.moe_experts(**case), reference)}
            for asm in (False, True):
                for first in (True, False):
                    label = f"{'asm' if asm else 'generic'}_{'first' if first else 'second'}"
                    fn = probe_forward(case, fmt, group, asm, first)
                    try:
                        errors[label] = rel_error(fn(), reference)
                        fns[label] = graphed(fn)
                    except Exception as error:  # a variant Triton cannot compile
                        print(f"  {label}: {type(error).__name__}: {str(error)[:300]}")
            times = {n: 1e3 * v for n, v in time_in_turns(fns, turns=3).items()}
            touched = int(torch.unique(case["topk_ids"]).numel())
            bound_us = weight_bytes(case, touched) / bandwidth / 1e6
            row = {"shape": name, "T": T, "touched": touched, "bound_us": bound_us,
                   "us": times, "errors": errors}
            rows.append(row)
            print(f"{name:20s} T={T} bound {bound_us:5.1f} | " + " ".join(
                f"{n} {v:6.1f}" + (f"({errors[n]:.0e})" if n in errors else "")
                for n, v in times.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
