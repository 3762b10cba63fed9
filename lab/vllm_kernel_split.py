"""Where the vllm_fp8 section's decode rows spend their GPU time, kernel by
kernel, on both sides: fp8 moe_experts' kernels and vLLM's two
fused_moe_kernel launches (its up and down projections apart), each side's
calls replayed from a CUDA graph with the L2 flushed before each (as the
section times them), under torch.profiler.  Needs GG_VLLM_SRC as the section
does.

    cd build && GG_VLLM_SRC=../.device/vllm PYTHONPATH=<wheel>:.. \
        python -m lab.vllm_kernel_split [--filter NAME] [--tokens T ...] [--json OUT]
"""
from __future__ import annotations

import argparse
import collections
import json

import torch
from torch.profiler import ProfilerActivity, profile

import gg_runtime
from bench import vendor_vllm, vllm_moe
from bench.measure import graphed
from bench.sections.fp8_experts import SCALES, expert_weights, routed_tokens
from bench.sections.vllm_fp8 import SCALES_NAME, SHAPES, vendored_folder
from gg_runtime.testing import flush_l2

REPLAYS = 20
# Whole models profiled only when named (--filter deepseek_v3): their weights are large.
WHOLE = ("deepseek_v3", "mixtral")


def kernel_us(replay) -> dict:
    """kernel name -> µs a call, over REPLAYS replays, the L2 flushed before each."""
    for _ in range(3):
        flush_l2()
        replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            flush_l2()
            replay()
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA \
                and "FillFunctor<int>" not in event.name:  # flush_l2's
            totals[event.name[:60]] += event.device_time / REPLAYS
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def served_cases(name_filter: str, token_counts, scales: str = SCALES_NAME):
    """(model, (H, I, E, k), T, (x, top-k ids, top-k weights), w13, w2) for
    the vllm_fp8 section's shapes whose name holds name_filter (a whole
    model's only where named exactly) and each token count, on the section's
    inputs (its weights' scales, or `scales`: bench/sections/fp8_experts.py
    SCALES' name); a model's fp8 weights made once, freed before the next's."""
    for model, shape in SHAPES.items():
        if name_filter not in model or (model in WHOLE and name_filter != model):
            continue
        hidden, inter, experts, top_k = shape
        weights = expert_weights(hidden, inter, experts, SCALES[scales], bf16=False)
        for tokens in token_counts:
            yield (model, shape, tokens, routed_tokens(tokens, hidden, experts, top_k),
                   weights["w13"], weights["w2"])
        del weights
        torch.cuda.empty_cache()


def vllm_parts(kernels, chosen, x, topk_ids, topk_weights, w13, w2) -> dict:
    """vLLM's up and down fused_moe_kernel launches, each alone, as replays."""
    blocks = vllm_moe.assignment(topk_ids, w13.values.shape[0], chosen)
    xq, x_scale = vllm_moe.quantize(kernels, x)
    gate_up = vllm_moe.up_projection(kernels, chosen, blocks, xq, x_scale, w13.values,
                                     w13.scales, topk_weights)
    hq, h_scale = vllm_moe.quantize(kernels, vllm_moe.gated_activation(gate_up.flatten(0, 1)))
    return {
        "vllm up": graphed(lambda: vllm_moe.up_projection(
            kernels, chosen, blocks, xq, x_scale, w13.values, w13.scales, topk_weights)),
        "vllm down": graphed(lambda: vllm_moe.down_projection(
            kernels, chosen, blocks, hq, h_scale, w2.values, w2.scales, topk_weights))}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 8, 64, 256])
    parser.add_argument("--json")
    args = parser.parse_args()
    folder, reason = vendored_folder()
    if reason:
        raise SystemExit(reason)
    kernels = vendor_vllm.load(folder)
    found = []
    for model, (hidden, inter, experts, top_k), tokens, routed, w13, w2 in served_cases(
            args.filter, args.tokens):
        x, topk_ids, topk_weights = routed
        chosen = vllm_moe.plan(kernels, experts, inter, top_k, tokens)
        replays = {"ours": graphed(lambda: gg_runtime.moe_experts(
            x, topk_ids, topk_weights, w13, w2))}
        if not vllm_moe.refusal(hidden, inter):
            replays.update(vllm_parts(kernels, chosen, x, topk_ids, topk_weights, w13, w2))
        row = {"model": model, "T": tokens, "touched": topk_ids.unique().numel(),
               "kernels": {side: kernel_us(replay) for side, replay in replays.items()}}
        found.append(row)
        print(f"\n{model} T={tokens} ({row['touched']} experts touched)")
        for side, table in row["kernels"].items():
            print(f"  {side}: {sum(table.values()):.1f} µs")
            for name, us in table.items():
                print(f"    {us:7.1f}  {name}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(found, out, indent=1)


if __name__ == "__main__":
    with torch.no_grad():
        main()
