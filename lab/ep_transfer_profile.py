"""The expert-parallel dispatch at TOKENS tokens a rank, alone, on a CUDA
green context of each given SM count (as the bench section's transfers by
SM count run it), replayed from a CUDA graph under torch.profiler: each
kernel's start and duration on rank 0, to see which kernel grows as the
SMs shrink.

    cd build && PYTHONPATH=WHEEL_SITE:.. torchrun --nproc-per-node 2 \
        -m lab.ep_transfer_profile [--sms 24,32] [--shape qwen3]
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from bench import measure
from bench.expert_parallel_worker import TOKENS, join_group, layer, on_sms
from gg_runtime import sm_limit
from gg_runtime.moe import exchange
from lab.ep_decode_profile import SHAPES, printed, timeline


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sms", default="24,32")
    parser.add_argument("--shape", default="qwen3")
    args = parser.parse_args()
    join_group()
    x, ids, weights, w13, _ = layer(*SHAPES[args.shape], TOKENS, 0)
    layout, = exchange.layout_for(dist.group.WORLD, x, ids, w13, None)
    for sms in map(int, args.sms.split(",")):
        stream = on_sms(sms)
        with torch.no_grad(), sm_limit(sms), torch.cuda.stream(stream):
            replay = measure.graphed(lambda: exchange.Plan(layout, ids, weights).dispatch(x),
                                     stream)
            steps = timeline(replay)
        printed(f"{args.shape} dispatch of {TOKENS} tokens on {sms} SMs", steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
