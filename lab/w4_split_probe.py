"""4-bit moe_experts at decode with each routed product split along K: the
next step docs/notes/2026-11-29-w4-widening-in-ptx.md names for the 4-bit
decode rows, where each of the routed kernels' few programs (aot/kernels/
w4.py) walks all of K one dependent step after another.  Here a program
takes a tile and one of `splits` parts of K and writes its float32 partial
sum; a second kernel sums a tile's parts and runs w4.py's epilogue (the
activation, or the bias).  The routing and the combine are gg_runtime.moe's
stages.  Each forward replayed from a CUDA graph with the L2 flushed, against
the wheel's 4-bit forward and its fp8 forward on the same weights, each
output against the float64 reference.  JIT-compiled by the GPU host's
Triton; w4.py's tile (w4_tile: the widening, the gather, the MMA) is used as
it is, on pointers offset to the part's first K.

    python lab/w4_split_probe.py [--filter NAME] [--tokens 1,8,64] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

import gg_runtime
from bench.measure import graphed
from aot.kernels.glu import CONCATENATED, NO_GLU, glu_epilogue
from aot.kernels.ragged import add_bias
from aot.kernels.tiles import first_step_past, locate_tile, tile_store, walk_groups
from aot.kernels.w4 import INT4_G32, INT4_G128, MXFP4, w4_tile
from gg_runtime.testing import rel_error, time_in_turns
from gg_runtime.testing.w4 import moe_experts_w4_ref
from lab.w4_decode_probe import fp8_twin, make_case

# (H, I, E, k, format, group) of issue 82's served shapes, as
# lab/w4_decode_probe.py's make_case takes them (concatenated gate/up, SwiGLU).
SHAPES = {"gpt_oss_20b": (2880, 2880, 32, 4, "mxfp4", 32),
          "kimi_k2_tp8": (7168, 256, 384, 8, "int4", 32),
          "qwen3_30b_a3b": (2048, 768, 128, 8, "int4", 128)}
CODES = {("mxfp4", 32): MXFP4, ("int4", 32): INT4_G32, ("int4", 128): INT4_G128}
SPLITS = (1, 2, 4, 8)
BM, BN, BK, WARPS, STAGES = 16, 64, 128, 4, 4  # w4_glu's decode config
PROGRAMS = 132 * 8
CHUNK = 64


@triton.jit
def split_kernel(a_ptr, b_ptr, c_ptr, parts_ptr, offs_ptr, b_scale_ptr, T, N, K, G, lda,
                 b_group_stride, ldb, b_scale_group_stride, lds, ldc, bias_ptr, has_bias,
                 rows_ptr, rows_div, splits, k_part, SUM: tl.constexpr, GLU: tl.constexpr,
                 FORMAT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 CHUNK: tl.constexpr):
    """w4.py's w4_program in two passes.  SUM 0: tile t's part s (K from
    s * k_part, k_part a multiple of BK) into parts [splits, T, N] float32.
    SUM 1: each tile's parts summed, then w4_program's epilogue into c (GLU
    gated: act(gate, up) [T, N / 2]; else the product plus bias [T, N])."""
    GROUP: tl.constexpr = 128 if FORMAT == INT4_G128 else 32
    if FORMAT != MXFP4:
        b_scale_ptr = b_scale_ptr.to(tl.pointer_type(tl.bfloat16))
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    n_tiles = tl.cdiv(N, BN)
    lane = tl.arange(0, CHUNK)
    rows_in_tile = tl.arange(0, BM)
    cols_in_tile = tl.arange(0, BN)
    tiles_before = 0
    rows_before = 0
    for chunk in range(0, G + 1, CHUNK):
        starts, ends, group_tiles, tiles_end = walk_groups(offs_ptr, chunk + lane, G, T,
                                                           rows_before, tiles_before, n_tiles, BM)
        chunk_end = tiles_before + tl.sum(group_tiles)
        per_tile = splits if SUM == 0 else 1
        for u in range(first_step_past(pid, tiles_before * per_tile, num_programs),
                       chunk_end * per_tile, num_programs):
            t = u // per_tile
            s = u % per_tile
            g, start, end, off_m, off_n = locate_tile(t, chunk, starts, ends, group_tiles,
                                                      tiles_end, BM, BN, CHUNK)
            rows = off_m + rows_in_tile
            cols = off_n + cols_in_tile
            if SUM == 0:
                group = tl.minimum(g, G - 1).to(tl.int64)
                k0 = s * k_part
                k_len = tl.where(g < G, tl.minimum(tl.maximum(K - k0, 0), k_part), 0)
                weights = (b_ptr + group * b_group_stride + k0 // 2, ldb,
                           b_scale_ptr + group * b_scale_group_stride + k0 // GROUP, lds)
                acc = w4_tile((a_ptr + k0, lda, rows_ptr, rows_div), weights, off_m, off_n,
                              k_len, end, N, GLU, FORMAT, BM, BN, BK)
                at = parts_ptr + (s * T + rows.to(tl.int64))[:, None] * N + cols[None, :]
                tl.store(at, acc, mask=(rows < end)[:, None] & (cols < N)[None, :])
            else:
                acc = tl.zeros((BM, BN), dtype=tl.float32)
                for part in range(0, splits):
                    at = parts_ptr + (part * T + rows.to(tl.int64))[:, None] * N + cols[None, :]
                    acc += tl.load(at, mask=(rows < end)[:, None] & (cols < N)[None, :],
                                   other=0.0)
                if GLU == NO_GLU:
                    acc = add_bias(acc, (bias_ptr, has_bias), g, G, off_n, N, BN)
                    tile_store(c_ptr, acc, off_m, off_n, end, N, ldc, False, BM, BN)
                else:
                    h = glu_epilogue(acc, g, G, off_m, end, off_n, N, (bias_ptr, has_bias),
                                     (None, 0, 0), GLU, BM, BN)
                    tile_store(c_ptr, h, off_m, off_n // 2, end, N // 2, ldc, False, BM,
                               BN // 2)
        tiles_before = chunk_end
        rows_before = tl.max(ends)


def split_forward(case, fmt, group, splits):
    """The 4-bit forward with both products split `splits` ways along K, as
    a closure over its buffers."""
    x, ids, weights = case["x"], case["topk_ids"], case["topk_weights"]
    (w13, s13, _), (w2, s2, _) = case["w13"], case["w2"]
    w13, w2 = w13.view(torch.uint8), w2.view(torch.uint8)
    if fmt == "mxfp4":
        s13, s2 = s13.view(torch.uint8), s2.view(torch.uint8)
    T, H = x.shape
    E, N, _ = w13.shape
    k = ids.shape[1]
    S = T * k
    h = torch.empty(S, N // 2, device="cuda", dtype=torch.bfloat16)
    ys = torch.empty(S, H, device="cuda", dtype=torch.bfloat16)
    up_parts = torch.empty(splits, S, N, device="cuda")
    down_parts = torch.empty(splits, S, H, device="cuda")
    common = dict(FORMAT=CODES[fmt, group], BM=BM, BN=BN, BK=BK, CHUNK=CHUNK, num_warps=WARPS,
                  num_stages=STAGES)

    def k_part(K):
        return triton.cdiv(triton.cdiv(K, splits), BK) * BK

    def grid(n, per_tile):
        return (min((triton.cdiv(S, BM) + E + 1) * triton.cdiv(n, BN) * per_tile, PROGRAMS),)

    def run():
        routing = gg_runtime.moe.route(ids, E)
        for SUM in (0, 1):
            split_kernel[grid(N, splits if SUM == 0 else 1)](
                x, w13, h, up_parts, routing.offs, s13, S, N, H, E, x.stride(0), w13.stride(0),
                w13.stride(1), s13.stride(0), s13.stride(1), N // 2, x, 0, routing.order, k,
                splits, k_part(H), SUM=SUM, GLU=CONCATENATED, **common)
        for SUM in (0, 1):
            split_kernel[grid(H, splits if SUM == 0 else 1)](
                h, w2, ys, down_parts, routing.offs, s2, S, H, N // 2, E, h.stride(0),
                w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), H, x, 0, routing.offs,
                0, splits, k_part(N // 2), SUM=SUM, GLU=NO_GLU, **common)
        return gg_runtime.moe.combine(ys, routing, weights)
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", default="1,8,64")
    args = parser.parse_args()
    rows = []
    for name, (H, inter, E, k, fmt, group) in SHAPES.items():
        if args.filter not in name:
            continue
        for T in map(int, args.tokens.split(",")):
            torch.manual_seed(T)
            case = make_case(H, inter, E, k, fmt, group, T)
            reference = moe_experts_w4_ref(**case)
            fp8_case = fp8_twin(case)
            fns = {"wheel": graphed(lambda: gg_runtime.moe_experts(**case)),
                   "fp8": graphed(lambda: gg_runtime.moe_experts(**fp8_case))}
            errors = {"wheel": rel_error(gg_runtime.moe_experts(**case), reference)}
            for splits in SPLITS:
                fn = split_forward(case, fmt, group, splits)
                errors[f"split {splits}"] = rel_error(fn(), reference)
                fns[f"split {splits}"] = graphed(fn)
            times = {n: 1e3 * v for n, v in time_in_turns(fns, turns=3).items()}
            rows.append({"shape": name, "T": T, "us": times, "errors": errors})
            print(f"{name:14s} T={T:3d} " + " ".join(
                f"{n} {v:6.1f}" + (f"({errors[n]:.0e})" if n in errors else "")
                for n, v in times.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
