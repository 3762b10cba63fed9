"""The expert-parallel dispatch and return at each compiled config of one
of the transfer's families (send_rows, or sum_peer_rows: the wheel's bf16
variants, each forced in turn), on SM counts held by CUDA green contexts,
as the expert_parallel bench section times them
(bench/expert_parallel_worker.transfers_by_sms): which tile a program
should take at 4096 tokens a rank.  Rank 0 prints µs and NVLink GB/s.

    cd build && PYTHONPATH=WHEEL_SITE:.. torchrun --nproc-per-node 2 -m lab.send_configs \
        [send_rows | sum_peer_rows]
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from bench.expert_parallel_worker import TOKENS, join_group, layer, transfers_by_sms
from gg_runtime import _C
from gg_runtime.testing.hooks import forced

# The bench section's layers: H, I, E, k.
LAYERS = {"deepseek_v3": (7168, 2048, 256, 8), "qwen3_30b_a3b": (2048, 768, 128, 8)}


def main():
    join_group()
    major, minor = torch.cuda.get_device_capability()
    family = sys.argv[1] if len(sys.argv) > 1 else "send_rows"
    keys = [v["key"] for v in _C.variants() if v["family"] == family and v["dtype"] == "bfloat16"
            and v["arch"] == 10 * major + minor and v["flavour"] == "aligned"]
    world = dist.get_world_size()
    for name, shape in LAYERS.items():
        x, ids, weights, w13, w2 = layer(*shape, TOKENS, 0)
        for key in keys:
            with torch.no_grad(), forced(key):
                rows = transfers_by_sms(x, ids, weights, w13, w2)
            for row in rows if dist.get_rank() == 0 else ():
                crossed = row["rows_sent"] * shape[0] * 2 * (world - 1) / world  # as the section
                print(f"{name} {key} {row['sms'] or 'all'} SMs: dispatch "
                      f"{row['dispatch_ms'] * 1e3:.0f} us {crossed / row['dispatch_ms'] / 1e6:.0f} "
                      f"GB/s, return {row['return_ms'] * 1e3:.0f} us "
                      f"{crossed / row['return_ms'] / 1e6:.0f} GB/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
