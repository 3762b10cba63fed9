"""Where one training step of the training section's MoE layer spends its GPU time,
torch._grouped_mm's layer next to gg_runtime's: CUDA kernel time per kernel
name (torch.profiler), largest first; then, per layer, the grouped products'
kernel time against everything else's, and how much faster than torch's the
products would have to be for the layer to run `TARGET` times torch's.

    cd build && PYTHONPATH=bench-site:.. python -m lab.profile_training [layer ...]

Layer names: the training section's LAYERS (default: all).
"""
import statistics
import sys

import torch

from gg_runtime.testing import moe_layer, moe_layer_inputs

from bench.sections.training import LAYERS, MMS

TARGET = 1.05  # issue 26's layer geomean
TURNS = 4


def kernel_ms(step, steps=5) -> dict:
    """Kernel name -> ms per step, over `steps` profiled steps after a warm-up."""
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / 1e3 / steps
    return totals


def is_grouped_product(kernel: str) -> bool:
    """torch._grouped_mm's CUTLASS kernels and ours (the ragged families)."""
    return "cutlass" in kernel or kernel.startswith("ragged_")


def split(totals: dict) -> tuple:
    """(ms of the grouped products, ms of every other kernel)."""
    products = sum(ms for kernel, ms in totals.items() if is_grouped_product(kernel))
    return products, sum(totals.values()) - products


def main(names):
    rows = []
    for name in names or LAYERS:
        tokens, hidden, inter, experts, top_k = LAYERS[name]
        inputs = moe_layer_inputs(tokens, hidden, inter, experts)
        dy = torch.randn_like(inputs["x"])

        def step(mm):
            for t in inputs.values():
                t.grad = None
            moe_layer(mm, **inputs, top_k=top_k).backward(dy)

        # In turns, each implementation first every other turn: the GPU's clock
        # drifts within a run (the rest's kernels, the same on both sides,
        # show it); each part's median is kept.
        parts = {impl: [] for impl in MMS}
        for turn in range(TURNS):
            order = list(MMS.items())
            for impl, mm in order if turn % 2 == 0 else order[::-1]:
                totals = kernel_ms(lambda mm=mm: step(mm))
                parts[impl].append(split(totals))
                if turn == 0:
                    print(f"\n{name} / {impl}: {sum(totals.values()):.2f} ms of kernels per step")
                    for kernel, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:12]:
                        print(f"  {ms:8.3f}  {kernel[:110]}")
        rows.append((name, *(tuple(statistics.median(p) for p in zip(*parts[impl]))
                             for impl in ("torch", "gg_runtime"))))
    print(f"\nms per step (medians of {TURNS} turns): grouped products, the rest; the layer x "
          f"torch; the products' x torch, and what {TARGET}x would need (the rest as measured)")
    for name, (theirs, their_rest), (ours, our_rest) in rows:
        rest = (their_rest + our_rest) / 2
        needed = theirs / ((theirs + rest) / TARGET - rest)
        print(f"{name:16} torch {theirs:6.2f} {their_rest:6.2f}  ours {ours:6.2f} {our_rest:6.2f}"
              f"  layer {(theirs + their_rest) / (ours + our_rest):.3f}  products "
              f"{theirs / ours:.3f}, {needed:.3f} needed")


if __name__ == "__main__":
    main(sys.argv[1:])
