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

    python lab/w4a8_experts_probe.py [--json OUT] [--tokens 4096,16384]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

import gg_runtime
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_in_turns
from gg_runtime.testing.w4 import dequantize_mxfp4, random_mxfp4
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
    (values, scales), and each expert's float64 weights as a function of g)."""
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
    return packed, shifts, w_scale, per_channel, (block_values, block_scales), weights


def run_product(name: str, experts: int, topk: int, n: int, k: int, tokens: int) -> dict:
    ends = routed_ends(tokens, experts, topk)
    rows = int(ends[-1])
    packed, shifts, w_scale, per_channel, blocks, weights = experts_weights(experts, n, k)
    x = torch.randn(rows, k, device="cuda")
    x_fp8, x_scale = gg_runtime.quantize_fp8(x, "rowwise")[:2]
    x_grouped = padded_tokens(x_fp8, grouped_slot_order)
    x_blocks = gg_runtime.quantize_fp8(x, "1x128")
    reference = torch.empty(rows, n, device="cuda")
    unquantized = torch.empty(rows, n, device="cuda")
    starts = [0] + ends.tolist()[:-1]
    for g, (start, end) in enumerate(zip(starts, ends.tolist())):
        w_g = per_channel[g].float() * w_scale[g][:, None]
        reference[start:end] = (x_fp8[start:end].float() * x_scale[start:end, None]) @ w_g.T
        unquantized[start:end] = x[start:end] @ weights(g).float().T
    ours = {}
    for bt, stages, parts in CONFIGS:
        tiles = tile_table(ends, bt)
        ours[f"w4a8_{bt}x{parts}"] = (
            lambda out, bt=bt, stages=stages, parts=parts, tiles=tiles:
            w4a8_ragged_kernel[(triton.cdiv(n, 64 * parts), tiles.shape[0])](
                packed, shifts, x_grouped, out, w_scale, x_scale, tiles, ends, n, rows, k,
                BT=bt, STAGES=stages, PARTS=parts, GROUPED=True, REPLICATED=True, num_warps=4,
                num_stages=1, maxnreg=ws_kernel_registers(parts)))
    errors, timed = {}, {}
    for label, launch in ours.items():
        out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch(out)
        errors[label] = rel_error(out, reference)
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
    return {"product": name, "E": experts, "topk": topk, "N": n, "K": k, "T": tokens,
            "rows": rows, "rows_per_expert": [int(counts.min()), int(counts.max())],
            "errors": errors, "us": {label: ms * 1e3 for label, ms in times.items()},
            "tflops": {label: flops / ms / 1e9 for label, ms in times.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--tokens", default="4096,16384")
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    for name, experts, topk, n, k in PRODUCTS:
        for tokens in map(int, args.tokens.split(",")):
            row = run_product(name, experts, topk, n, k, tokens)
            rows.append(row)
            print(f"{name} T={tokens} rows/expert {row['rows_per_expert']}: "
                  + " ".join(f"{label} {us:.1f} us ({row['tflops'][label]:.0f} TF, "
                             f"err {row['errors'][label]:.1e})"
                             for label, us in row["us"].items()), flush=True)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
