"""The 4-bit decode kernels (aot/kernels/w4_decode.py) alone, JIT-compiled by
the GPU host's Triton, at several tile widths, K steps and warps, on the
programs the wheel would launch (the resident wave: programs an SM by the
compiled kernel's registers, times the SMs, at most the units); each
replayed from a CUDA graph with the L2 flushed, all of a shape's in turns,
each output against the float64 product of the widened weights.  `--module
FILE`: a copy of the kernels' module to time instead (an A/B's other side).

    python lab/w4_decode_configs_probe.py [--filter NAME] [--json OUT] [--module FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import json

import torch
import triton

import gg_runtime
from aot.kernels import w4_decode
from aot.kernels.glu import CONCATENATED
from aot.kernels.w4 import INT4_G32, INT4_G128, MXFP4
from bench.measure import graphed
from gg_runtime.formats import Quantized
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import random_int4, random_mxfp4, widened
from lab.w4_decode_probe import SHAPES

TOKENS = (1, 4, 8)
# (BN, BK, warps): BN is w13 rows (up) or output columns (down); each
# first is the wheel's config where none of its conditions holds
# (aot/families/w4_decode_glu.py, w4_decode_down.py).
UP_CONFIGS = ((128, 256, 4), (64, 256, 4), (32, 256, 4), (64, 512, 4), (64, 128, 4),
              (128, 256, 8), (256, 256, 8), (64, 256, 2), (32, 256, 2), (128, 128, 4))
DOWN_CONFIGS = ((64, 256, 4), (32, 256, 4), (16, 256, 4), (32, 512, 4), (64, 128, 4),
                (128, 256, 8), (32, 256, 2), (16, 256, 2), (64, 512, 4))
SMS = 132
MAX_REGISTERS = 65536


def weights(fmt, group, E, n, k):
    w = random_mxfp4(E, n, k) if fmt == "mxfp4" else random_int4(E, n, k, group)
    scales = w.scales.view(torch.uint8) if fmt == "mxfp4" else w.scales
    return w, w.values.view(torch.uint8), scales


def touched_widened(w, experts):
    def take(t):  # torch indexes no float4 / e8m0 tensors: their bytes
        return t.view(torch.uint8)[experts].view(t.dtype) if t.element_size() == 1 else t[experts]
    return widened(Quantized(take(w.values), take(w.scales), w.format))


def code(fmt, group):
    return MXFP4 if fmt == "mxfp4" else INT4_G128 if group == 128 else INT4_G32


def launcher(kernel, units, args, constexprs, warps):
    """(a closure launching kernel on the wheel's programs, the compiled
    kernel's registers a thread and spilled bytes): the resident wave by its
    registers (run.cc's wave), at most the units."""
    options = dict(**constexprs, num_warps=warps, num_stages=1)
    compiled = kernel[(1,)](*args, **options)
    per_sm = max(MAX_REGISTERS // (compiled.n_regs * 32 * warps), 1)
    programs = min(units, per_sm * SMS)

    def run():
        kernel[(programs,)](*args, **options)
    return run, compiled.n_regs, compiled.n_spills


def case(name, T):
    H, inter, E, k, fmt, group = SHAPES[name]
    torch.manual_seed(T)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E, device="cuda")[:k] for _ in range(T)]).int()
    routing = gg_runtime.moe.route(ids, E)
    w13, v13, s13 = weights(fmt, group, E, 2 * inter, H)
    w2, v2, s2 = weights(fmt, group, E, H, inter)
    experts = ids.unique().long()
    return dict(H=H, inter=inter, E=E, k=k, fmt=fmt, group=group, x=x, ids=ids,
                routing=routing, w13=(w13, v13, s13), w2=(w2, v2, s2), experts=experts)


def references(c):
    """(h's reference [S, I] float64 (plain SwiGLU, w13 concatenated), the
    down projection's input [S, I] bf16 and its reference [S, H])."""
    routing, k, x = c["routing"], c["k"], c["x"]
    S = routing.order.numel()
    row_expert = torch.searchsorted(routing.offs.long(), torch.arange(S, device="cuda"),
                                    right=True)
    w13 = touched_widened(c["w13"][0], c["experts"])
    w2 = touched_widened(c["w2"][0], c["experts"])
    local = torch.searchsorted(c["experts"], row_expert)
    tokens = x[routing.order // k].double()
    gu = torch.einsum("sk,snk->sn", tokens, w13[local])
    gate, up = gu.chunk(2, dim=-1)
    h_ref = gate * torch.sigmoid(gate) * up
    h_in = torch.randn(S, c["inter"], device="cuda", dtype=torch.bfloat16)
    ys_ref = torch.einsum("si,shi->sh", h_in.double(), w2[local])
    return h_ref, h_in, ys_ref


def add(runs, name, make, out):
    """runs[name] = (make()'s closure, registers, spills, out), unless the
    JIT refuses the config (said, and left out)."""
    try:
        runs[name] = (*make(), out)
    except Exception as error:  # noqa: BLE001 (a config this Triton cannot compile)
        print(f"    {name}: not compiled: {type(error).__name__}: {str(error)[:160]}")


def up_runs(c, module, configs):
    x, routing, k = c["x"], c["routing"], c["k"]
    _, v13, s13 = c["w13"]
    S, N, H, E = routing.order.numel(), v13.shape[1], c["H"], c["E"]
    h = torch.empty(S, N // 2, device="cuda", dtype=torch.bfloat16)
    runs = {}
    for BN, BK, warps in configs:
        args = (x, v13, h, routing.offs, s13, S, N, H, E, x.stride(0), v13.stride(0),
                v13.stride(1), s13.stride(0), s13.stride(1), N // 2, x, 0, 0, routing.order, k)
        constexprs = dict(GLU=CONCATENATED, FORMAT=code(c["fmt"], c["group"]), USE_TMA=False,
                          BM=16, BN=BN, BK=BK, CHUNK=0, PRECISION=0)
        add(runs, f"{BN}x{BK}_w{warps}", lambda: launcher(
            module.w4_decode_glu_kernel, triton.cdiv(N, BN) * min(S, E), args, constexprs, warps),
            h)
    return runs


def down_runs(c, h_in, module, configs):
    routing = c["routing"]
    _, v2, s2 = c["w2"]
    S, H, inter, E = routing.order.numel(), c["H"], c["inter"], c["E"]
    ys = torch.empty(S, H, device="cuda", dtype=torch.bfloat16)
    runs = {}
    for BN, BK, warps in configs:
        args = (h_in, v2, ys, routing.offs, s2, S, H, inter, E, h_in.stride(0), v2.stride(0),
                v2.stride(1), s2.stride(0), s2.stride(1), H, h_in, 0)
        constexprs = dict(FORMAT=code(c["fmt"], c["group"]), USE_TMA=False, BM=16, BN=BN, BK=BK,
                          CHUNK=0, PRECISION=0)
        add(runs, f"{BN}x{BK}_w{warps}", lambda: launcher(
            module.w4_decode_down_kernel, triton.cdiv(H, BN) * min(S, E), args, constexprs, warps),
            ys)
    return runs


def measure(runs, reference, nbytes):
    """{name: {us, tbps, rel_error, registers, spills}} of runs, each checked
    then timed in turns."""
    rows, graphs = {}, {}
    for name, (run, registers, spills, out) in runs.items():
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        rows[name] = {"rel_error": rel_error(out[:reference.shape[0]].double(), reference),
                      "registers": registers, "spills": spills}
        graphs[name] = graphed(run) or run
    for name, ms in time_in_turns(graphs).items():
        rows[name].update(us=ms * 1e3, tbps=nbytes / (ms * 1e-3) / 1e12)
    return rows


def load_module(path):
    spec = importlib.util.spec_from_file_location("aot.kernels.w4_decode_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--filter", default="")
    parser.add_argument("--module", help="a copy of aot/kernels/w4_decode.py to time instead")
    args = parser.parse_args()
    module = load_module(args.module) if args.module else w4_decode
    results = []
    for name in SHAPES:
        if args.filter not in name:
            continue
        for T in TOKENS:
            c = case(name, T)
            h_ref, h_in, ys_ref = references(c)
            touched = c["experts"].numel()
            for projection, weight, runs, reference in (
                    ("up", "w13", up_runs(c, module, UP_CONFIGS), h_ref),
                    ("down", "w2", down_runs(c, h_in, module, DOWN_CONFIGS), ys_ref)):
                _, values, scales = c[weight]
                nbytes = touched * (values[0].numel() + scales[0].numel() * scales.element_size())
                rows = measure(runs, reference, nbytes)
                print(f"{name} T={T} {projection}:", flush=True)
                for n, r in sorted(rows.items(), key=lambda item: item[1]["us"]):
                    print(f"    {n:14s} {r['us']:8.1f} us {r['tbps']:5.2f} TB/s "
                          f"err {r['rel_error']:.1e} regs {r['registers']} spills {r['spills']}")
                results.append({"shape": name, "T": T, "projection": projection, "rows": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
