"""Where one training step of bench/run.py's MoE layer spends its GPU time,
torch._grouped_mm's layer next to gg_runtime's: CUDA kernel time per kernel
name (torch.profiler), largest first.

    python bench/profile_training.py [layer ...]     # names from run.TRAINING_LAYERS
"""
import sys

import torch

from run import TRAINING_LAYERS, TRAINING_MMS
from problems import moe_layer, moe_layer_inputs


def kernel_ms(step, steps=3) -> dict:
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


def main(names):
    for name in names or TRAINING_LAYERS:
        tokens, hidden, inter, experts, top_k = TRAINING_LAYERS[name]
        inputs = moe_layer_inputs(tokens, hidden, inter, experts)
        dy = torch.randn_like(inputs["x"])
        for impl, mm in TRAINING_MMS.items():
            def step(mm=mm):
                for t in inputs.values():
                    t.grad = None
                moe_layer(mm, **inputs, top_k=top_k).backward(dy)
            totals = kernel_ms(step)
            print(f"\n{name} / {impl}: {sum(totals.values()):.2f} ms of kernels per step")
            for kernel, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:12]:
                print(f"  {ms:8.3f}  {kernel[:110]}")


if __name__ == "__main__":
    main(sys.argv[1:])
