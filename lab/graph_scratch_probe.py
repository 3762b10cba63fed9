"""What a captured launch's scratch costs a CUDA graph's replay: fp8
moe_experts on the vllm_fp8 section's shapes and token counts, captured as
the runtime captures it (each launch that needs scratch gets its own graph
memory: an allocation node and a free node around it) against captured with
GG_PROBE_STATIC_SCRATCH set (a wheel built with lab/static_scratch.patch applied:
a captured launch reuses the stream blocks made by the call before the
capture; fine for one graph replayed on one stream, a probe only), replayed
with the L2 flushed, timed in turns.

    cd build && PYTHONPATH=<patched wheel>:.. python -m lab.graph_scratch_probe [--filter NAME]
        [--tokens T ...] [--plain | --kernels]
"""
from __future__ import annotations

import argparse
import os

import torch

import gg_runtime
from bench.measure import graphed
from gg_runtime.testing import time_in_turns
from lab.vllm_kernel_split import kernel_us, served_cases

ENV = "GG_PROBE_STATIC_SCRATCH"


def captured(fn, static: bool):
    if static:
        os.environ[ENV] = "1"
    try:
        return graphed(fn)
    finally:
        os.environ.pop(ENV, None)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 8, 64, 256])
    parser.add_argument("--kernels", action="store_true",
                        help="each kernel's µs under the profiler: called, replayed, "
                             "replayed with the static scratch")
    parser.add_argument("--plain", action="store_true",
                        help="the wheel's replay alone (any wheel): to compare wheels, a "
                             "process each")
    args = parser.parse_args()
    for model, _, tokens, (x, ids, topk_weights), w13, w2 in served_cases(args.filter,
                                                                          args.tokens):
        def call():
            return gg_runtime.moe_experts(x, ids, topk_weights, w13, w2)
        if args.kernels:
            for name, fn in (("called", call), ("replayed", captured(call, False)),
                             ("static", captured(call, True))):
                table = kernel_us(fn)
                print(f"{model} T={tokens} {name}: " + ", ".join(
                    f"{kernel} {us:.1f}" for kernel, us in table.items()), flush=True)
            continue
        if args.plain:
            (ms,) = time_in_turns({"plain": graphed(call)}).values()
            print(f"{model:18s} T={tokens:4d}: {1e3 * ms:6.1f} µs", flush=True)
            continue
        replays = {"graph_memory": captured(call, False), "static": captured(call, True)}
        times = {name: 1e3 * ms for name, ms in time_in_turns(replays).items()}
        print(f"{model:18s} T={tokens:4d}: graph memory {times['graph_memory']:6.1f} µs, "
              f"static {times['static']:6.1f} µs, "
              f"x {times['graph_memory'] / times['static']:.3f}", flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()
