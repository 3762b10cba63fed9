"""Where expert_parallel's decode step spends its time: one step replayed
from a CUDA graph under torch.profiler, each kernel's start (from the first
kernel's) and duration on rank 0, beside the experts alone (moe_experts on
the same rows, graphed).  A layer (H, I, E, k) at a few token counts, 16-bit
and fp8 weights (128 x 128 blocks, the tokens sent in fp8).

    cd build && PYTHONPATH=WHEEL_SITE:.. torchrun --nproc-per-node 2 \
        -m lab.ep_decode_profile [--tokens 1,128] [--shape qwen3]

(from build/, as make bench runs: in the repository's root the tree's
gg_runtime, which has no extension, would shadow the installed wheel's).
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from bench import measure
from bench.expert_parallel_worker import join_group, layer
from gg_runtime import quantize_fp8
from gg_runtime.formats import SQUARE_BLOCKS
from gg_runtime.moe import expert_parallel

SHAPES = {"qwen3": (2048, 768, 128, 8), "dsv3": (7168, 2048, 256, 8)}
REPLAYS = 20


def timeline(replay) -> list[tuple[str, float, float]]:
    """(kernel, start µs from the step's first kernel, duration µs) of the
    last of REPLAYS replays."""
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            replay()
            torch.cuda.synchronize()
            dist.barrier()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    per_step = len(kernels) // REPLAYS
    last = kernels[-per_step:]
    t0 = last[0].time_range.start
    return [(e.name[:70], e.time_range.start - t0, e.time_range.end - e.time_range.start)
            for e in last]


def printed(title: str, steps: list[tuple[str, float, float]]) -> None:
    """A timeline's kernels, printed on rank 0 under `title`."""
    if dist.get_rank() != 0:
        return
    end = max(s + d for _, s, d in steps)
    print(f"\n== {title}: {len(steps)} kernels, first start to last end {end:.1f} µs")
    for kernel, start, duration in steps:
        print(f"{start:8.1f} {duration:7.1f}  {kernel}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,128")
    parser.add_argument("--shape", default="qwen3")
    args = parser.parse_args()
    join_group()
    for tokens in map(int, args.tokens.split(",")):
        x, ids, weights, w13, w2 = layer(*SHAPES[args.shape], tokens, 1)
        for name, (a, b) in (("bf16", (w13, w2)), ("fp8", (quantize_fp8(w13, SQUARE_BLOCKS),
                                                           quantize_fp8(w2, SQUARE_BLOCKS)))):
            with torch.no_grad():
                replay = measure.graphed(lambda: expert_parallel(x, ids, weights, a, b,
                                                                 max_tokens=tokens))
                steps = timeline(replay)
            printed(f"{args.shape} {name} T={tokens}", steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
