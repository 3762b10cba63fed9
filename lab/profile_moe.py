"""Where an MoE layer's time goes (a GPU machine, the wheel on the path, as for
make bench): torch.profiler's kernels of a forward and of a forward +
backward, of the experts section's layers PROFILED names, and the host side of
moe_experts' forward on a tiny problem (the ops that cost CPU time).

    cd build && PYTHONPATH=bench-site:.. python -m lab.profile_moe [SHAPE ...] [--host]

SHAPE is a name of the training section's LAYERS, the experts section's shapes
(default: all).  Prints tables only."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import gg_runtime
from gg_runtime.testing import moe_layer_inputs

from bench.sections.experts import LAYERS as EXPERTS_LAYERS
from bench.sections.training import LAYERS as SHAPES

PROFILED = ("no_atomics", "moe_experts")
STEPS = 5


def kernel_table(fn, rows=25) -> str:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows)


def profile_layer(name, shape):
    tokens, hidden, inter, experts, top_k = shape
    inputs = moe_layer_inputs(tokens, hidden, inter, experts)
    dy = torch.randn_like(inputs["x"])
    for impl in PROFILED:
        layer = EXPERTS_LAYERS[impl]

        def forward():
            with torch.no_grad():
                return layer(**inputs, top_k=top_k)

        def step():
            for t in inputs.values():
                t.grad = None
            layer(**inputs, top_k=top_k).backward(dy)

        for what, fn in (("forward", forward), ("forward+backward", step)):
            print(f"\n=== {name} {shape} {impl} {what} ({STEPS} calls) ===")
            print(kernel_table(fn))


def profile_host():
    """The ops of moe_experts' forward on the host section's tiny problem, by CPU time."""
    x = torch.randn(256, 128, dtype=torch.bfloat16, device="cuda")
    weights, chosen = torch.rand(256, 8, device="cuda").topk(2, dim=-1)
    w13 = torch.randn(8, 128, 128, dtype=torch.bfloat16, device="cuda")
    w2 = torch.randn(8, 128, 64, dtype=torch.bfloat16, device="cuda")

    def call():
        return gg_runtime.moe_experts(x, chosen, weights, w13, w2)

    for _ in range(50):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(200):
            call()
        torch.cuda.synchronize()
    print("\n=== moe_experts forward, host (200 calls) ===")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def main(argv):
    names = [a for a in argv if not a.startswith("--")] or list(SHAPES)
    if "--host" in argv:
        profile_host()
    for name in names:
        profile_layer(name, SHAPES[name])


if __name__ == "__main__":
    main(sys.argv[1:])
