"""W4A8 over an MoE layer's experts (docs/notes/2026-11-29-w4a8-prefill-probe.md):
lab/w4a8_probe.py's warp-specialised kernel (GROUPED, REPLICATED) over ragged
groups, w4a8_ragged_kernel, against gg_runtime's fp8 grouped product on the
same groups, per channel on the same operands and in 128 x 128 blocks
(moe_experts' fp8 serving format).  One expert's product widens each weight
block once per token tile; here a tile holds one expert's rows only, so the
smaller an expert's share of the tokens, the more often its weights are
widened: this probe measures what that costs at prefill.

The rows are random top-k routing's, grouped by expert (one product of a
layer: the up projection's N = 2I or the down projection's N = H); the
tokens fp8 per token.  Outputs are poisoned before a run and checked
against a float32 reference on the same fp8 operands (the blockwise
product's against the unquantized ones) before anything is timed.

At decode token counts (--tokens 8,64,256 --configs 16x4x2,...) each tile is
one expert's few rows: `bound_us` is the touched experts' packed weights and
shifts read once at 4.26 TB/s (an H200's measured copy bandwidth).

    python lab/w4a8_experts_probe.py [--json OUT] [--tokens 4096,16384]
        [--configs 128x4x2,256x4x2] [--ring-configs 16x6x2x2,...] [--step-configs ...]
        [--products gpt_oss_120b_up,...]
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton

import gg_runtime
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import dequantize_mxfp4, random_mxfp4
from lab.w4a8_ring_probe import w4a8_ring_kernel, w4a8_step_kernel
from lab.w4a8_probe import (grouped_slot_order, padded_tokens, w4a8_ragged_kernel,
                            ws_kernel_registers)

# (model, experts, top-k, N, K) of one product: gpt-oss-120b's up (2I) and
# down, Kimi-K2's.
PRODUCTS = (("gpt_oss_120b_up", 128, 4, 5760, 2880), ("gpt_oss_120b_down", 128, 4, 2880, 2880),
            ("kimi_k2_up", 384, 8, 4096, 7168), ("kimi_k2_down", 384, 8, 7168, 2048))
# (tokens a tile, ring stages, MMA partitions)
CONFIGS = ((128, 4, 2), (256, 4, 2))


def routed_ends(tokens: int, experts: int, topk: int) -> torch.Tensor:
    """Each expert's end row [E] (int32) when `tokens` tokens pick `topk`
    distinct experts each, uniformly at random."""
    ids = torch.rand(tokens, experts, device="cuda").argsort(dim=1)[:, :topk]
    return torch.bincount(ids.flatten(), minlength=experts).cumsum(0).int()


def tile_table(ends: torch.Tensor, tile: int) -> torch.Tensor:
    """[tiles, 2] (expert, first row): each expert's rows in tiles of `tile`."""
    bounds = [0] + ends.tolist()
    tiles = [(g, first) for g in range(len(ends))
             for first in range(bounds[g], bounds[g + 1], tile)]
    return torch.tensor(tiles, dtype=torch.int32, device="cuda")


def experts_weights(experts: int, n: int, k: int):
    """(packed [E, N, K / 2] uint8, shifts [E, N, K / 32] uint8, row scales [E, N],
    the same weights e4m3 per channel [E, N, K], in 128 x 128 blocks
    (values, scales), each expert's float64 weights as a function of g, and
    the e8m0 scale bytes [E, N, K / 32])."""
    w = random_mxfp4(experts, n, k, exponents=(115, 123))
    packed, scale_bytes = w.values.view(torch.uint8), w.scales.view(torch.uint8)
    exponents = scale_bytes.int()
    largest = exponents.amax(dim=2)
    shifts = (largest[..., None] - exponents).to(torch.uint8)
    w_scale = torch.exp2(largest.double() - 133).float()
    per_channel = torch.empty(experts, n, k, dtype=torch.float8_e4m3fn, device="cuda")
    block_values = torch.empty_like(per_channel)
    block_scales = torch.empty(experts, triton.cdiv(n, 128), triton.cdiv(k, 128), device="cuda")

    def weights(g: int) -> torch.Tensor:
        return dequantize_mxfp4(packed[g:g + 1], scale_bytes[g:g + 1])[0]

    for g in range(experts):
        exact = weights(g)
        per_channel[g] = (exact / w_scale[g][:, None].double()).float().to(torch.float8_e4m3fn)
        blocks = gg_runtime.quantize_fp8(exact.float().unsqueeze(0), "128x128")
        block_values[g], block_scales[g] = blocks.values[0], blocks.scales[0]
    return packed, shifts, w_scale, per_channel, (block_values, block_scales), weights, scale_bytes


def run_product(name: str, experts: int, topk: int, n: int, k: int, tokens: int,
                configs=CONFIGS, ring_configs=(), step_configs=()) -> dict:
    ends = routed_ends(tokens, experts, topk)
    rows = int(ends[-1])
    packed, shifts, w_scale, per_channel, blocks, weights, scale_bytes = experts_weights(
        experts, n, k)
    x = torch.randn(rows, k, device="cuda")
    x_fp8, x_scale = gg_runtime.quantize_fp8(x, "rowwise")[:2]
    x_grouped = padded_tokens(x_fp8, grouped_slot_order)
    x_blocks = gg_runtime.quantize_fp8(x, "1x128")
    x_blocks_grouped = padded_tokens(x_blocks.values, grouped_slot_order)
    padded = torch.nn.functional.pad(x_blocks.values.float(), (0, -k % 128))
    x_dequantized = (padded.unflatten(1, (-1, 128)) * x_blocks.scales[..., None]).flatten(1)[:, :k]
    step_reference = torch.empty(rows, n, device="cuda")
    reference = torch.empty(rows, n, device="cuda")
    unquantized = torch.empty(rows, n, device="cuda")
    starts = [0] + ends.tolist()[:-1]
    for g, (start, end) in enumerate(zip(starts, ends.tolist())):
        w_g = per_channel[g].float() * w_scale[g][:, None]
        reference[start:end] = (x_fp8[start:end].float() * x_scale[start:end, None]) @ w_g.T
        unquantized[start:end] = x[start:end] @ weights(g).float().T
        step_reference[start:end] = x_dequantized[start:end] @ weights(g).float().T
    ours = {}
    for bt, stages, parts in configs:
        tiles = tile_table(ends, bt)
        ours[f"w4a8_{bt}x{parts}"] = (
            lambda out, bt=bt, stages=stages, parts=parts, tiles=tiles:
            w4a8_ragged_kernel[(triton.cdiv(n, 64 * parts), tiles.shape[0])](
                packed, shifts, x_grouped, out, w_scale, x_scale, tiles, ends, n, rows, k,
                BT=bt, STAGES=stages, PARTS=parts, GROUPED=True, REPLICATED=True, num_warps=4,
                num_stages=1, maxnreg=ws_kernel_registers(parts)))
    shifts_t = shifts.transpose(1, 2).contiguous()
    for (bt, stages, parts, programs), d_global in itertools.product(ring_configs, (False, True)):
        if d_global and programs > 1:
            continue
        tiles = tile_table(ends, bt)
        # A thread's registers with `programs` programs an SM (the loader warp's 40).
        cap = 65536 // (programs * 32 * (4 * parts + 4)) // 8 * 8
        mma_registers = min((65536 // programs - 32 * 40) // (128 * parts) // 8 * 8, 240)
        ours[f"ring_{bt}x{stages}x{parts}x{programs}{'_dg' if d_global else ''}"] = (
            lambda out, bt=bt, stages=stages, parts=parts, tiles=tiles, d_global=d_global,
            cap=cap, mma_registers=mma_registers:
            w4a8_ring_kernel[(triton.cdiv(n, 64 * parts), tiles.shape[0])](
                packed, shifts, shifts_t, x_grouped, out, w_scale, x_scale, tiles, ends, n, rows,
                k, experts, BT=bt, STAGES=stages, PARTS=parts, D_GLOBAL=d_global,
                REGISTERS=mma_registers, num_warps=4, num_stages=1, maxnreg=cap))
    for bt, stages, parts, programs in step_configs:
        tiles = tile_table(ends, bt)
        cap = 65536 // (programs * 32 * (4 * parts + 4)) // 8 * 8
        mma_registers = min((65536 // programs - 32 * 40) // (128 * parts) // 8 * 8, 240)
        ours[f"step_{bt}x{stages}x{parts}x{programs}"] = (
            lambda out, bt=bt, stages=stages, parts=parts, tiles=tiles, cap=cap,
            mma_registers=mma_registers:
            w4a8_step_kernel[(triton.cdiv(n, 64 * parts), tiles.shape[0])](
                packed, scale_bytes, x_blocks_grouped, out, x_blocks.scales, tiles, ends, n, rows,
                k, experts, BT=bt, STAGES=stages, PARTS=parts, REGISTERS=mma_registers,
                num_warps=4, num_stages=1, maxnreg=cap))
    errors, timed = {}, {}
    for label, launch in ours.items():
        out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch(out)
        errors[label] = rel_error(out, step_reference if label.startswith("step") else reference)
        timed[label] = lambda launch=launch, out=out: launch(out)

    def ours_rowwise():
        return gg_runtime.scaled_grouped_mm(x_fp8, per_channel.transpose(1, 2), x_scale, w_scale,
                                            offs=ends, use_fast_accum=True)

    def ours_blockwise():
        return gg_runtime.scaled_grouped_mm(x_blocks.values, blocks[0].transpose(1, 2),
                                            x_blocks.scales, blocks[1], offs=ends,
                                            use_fast_accum=True)

    errors["ours_rowwise"] = rel_error(ours_rowwise(), reference)
    errors["ours_blockwise"] = rel_error(ours_blockwise(), unquantized)
    times = time_in_turns({**timed, "ours_rowwise": ours_rowwise,
                           "ours_blockwise": ours_blockwise})
    flops = 2 * rows * n * k
    counts = ends.diff(prepend=ends.new_zeros(1))
    touched = int((counts > 0).sum())
    bound_us = touched * n * (k // 2 + k // 32) / 4.26e12 * 1e6
    return {"bound_us": bound_us, "touched": touched, "product": name, "E": experts,
            "topk": topk, "N": n, "K": k, "T": tokens,
            "rows": rows, "rows_per_expert": [int(counts.min()), int(counts.max())],
            "errors": errors, "us": {label: ms * 1e3 for label, ms in times.items()},
            "tflops": {label: flops / ms / 1e9 for label, ms in times.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--configs", default=",".join("x".join(map(str, c)) for c in CONFIGS))
    parser.add_argument("--ring-configs", default="")
    parser.add_argument("--step-configs", default="")
    parser.add_argument("--products", default=",".join(p[0] for p in PRODUCTS))
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    configs = [tuple(map(int, c.split("x"))) for c in args.configs.split(",") if c]
    ring_configs = [tuple(map(int, c.split("x"))) for c in args.ring_configs.split(",") if c]
    step_configs = [tuple(map(int, c.split("x"))) for c in args.step_configs.split(",") if c]
    for name, experts, topk, n, k in PRODUCTS:
        if name not in args.products.split(","):
            continue
        for tokens in map(int, args.tokens.split(",")):
            row = run_product(name, experts, topk, n, k, tokens, configs, ring_configs,
                              step_configs)
            rows.append(row)
            print(f"{name} T={tokens} rows/expert {row['rows_per_expert']} "
                  f"bound {row['bound_us']:.1f} us: "
                  + " ".join(f"{label} {us:.1f} us ({row['tflops'][label]:.0f} TF, "
                             f"err {row['errors'][label]:.1e})"
                             for label, us in row["us"].items()), flush=True)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
