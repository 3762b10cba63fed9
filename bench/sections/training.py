"""One torchtitan-style MoE layer (gg_runtime.testing.moe_layer) trained as a
model would be, with torch._grouped_mm and with gg_runtime.grouped_mm, same
inputs: forward (autograd recording), forward + backward, peak memory."""
from __future__ import annotations

from functools import partial

import torch

import gg_runtime
from gg_runtime.testing import (TOLERANCE, moe_layer, moe_layer_inputs, rel_error, time_in_turns,
                                with_added_bias)

from ..markdown import fmt, geomean, table
from ..measure import peak_gb

TITLE = "MoE layer training: torch._grouped_mm against gg_runtime.grouped_mm"
# torchtitan-style MoE layers (tokens, hidden, expert intermediate, experts, top-k):
# coarse experts first, then fine-grained ones.
LAYERS = {
    "mixtral_8x7b": (8192, 4096, 14336, 8, 2),
    "gpt_oss_20b": (16384, 2880, 2880, 32, 4),
    "dsv3_ep8_slice": (8192, 7168, 2048, 32, 8),
    "olmoe": (16384, 2048, 1024, 64, 8),
    "qwen3_30b_a3b": (16384, 2048, 768, 128, 8),
}
# With experts' biases too (as gpt-oss has): torch's grouped_mm refuses bias, so its layer adds it.
WITH_BIAS = ("gpt_oss_20b",)
MMS = {"torch": with_added_bias(torch._grouped_mm), "gg_runtime": gg_runtime.grouped_mm}


def run(context) -> dict:
    layers = [(name, shape, False) for name, shape in LAYERS.items()]
    layers += [(name, LAYERS[name], True) for name in WITH_BIAS]
    return {"layers": [bench_training(*layer) for layer in layers if context.only in layer[0]]}


def bench_training(name: str, shape: tuple, bias: bool = False) -> dict:
    """Forward and forward + backward (gradients of x, the router and both
    expert weights, set to None before each step, as optimizer.zero_grad
    does), each timed in turns with the other implementation
    (gg_runtime.testing.time_in_turns), and the peak memory of one such step
    above what was allocated before it.  gg_runtime's output and gradients are
    checked against torch's layer first."""
    tokens, hidden, inter, experts, top_k = shape
    inputs = moe_layer_inputs(tokens, hidden, inter, experts, bias=bias)
    dy = torch.randn_like(inputs["x"])

    def forward(mm):
        return moe_layer(mm, **inputs, top_k=top_k)

    def step(mm):
        for t in inputs.values():
            t.grad = None
        forward(mm).backward(dy)

    results = {}
    for impl, mm in MMS.items():
        step(mm)
        results[impl] = [forward(mm).detach()] + [t.grad for t in inputs.values()]
    errors = {key: rel_error(ours, theirs.float()) for key, ours, theirs in
              zip(["out"] + list(inputs), results["gg_runtime"], results["torch"])}
    row = {"name": name + (" (bias)" if bias else ""),
           "shape": dict(zip(("T", "H", "I", "E", "k"), shape)),
           "rel_error_vs_torch": errors}
    if max(errors.values()) > TOLERANCE[torch.bfloat16]:
        row["error"] = f"gg_runtime's layer differs from torch's: {errors}"
        return row
    del results
    forward_ms = time_in_turns({impl: partial(forward, mm) for impl, mm in MMS.items()})
    step_ms = time_in_turns({impl: partial(step, mm) for impl, mm in MMS.items()})
    for impl, mm in MMS.items():
        row[impl] = {"forward_ms": forward_ms[impl], "train_step_ms": step_ms[impl],
                     "peak_step_gb": peak_gb(lambda: step(mm))}
    ours, theirs = row["gg_runtime"], row["torch"]
    row["forward_vs_torch"] = theirs["forward_ms"] / ours["forward_ms"]
    row["train_step_vs_torch"] = theirs["train_step_ms"] / ours["train_step_ms"]
    row["peak_vs_torch"] = ours["peak_step_gb"] / theirs["peak_step_gb"]
    return row


def report(data) -> list:
    rows = data["layers"]
    lines = ["ms and GB, torch / gg_runtime; x: torch's time / ours (peak: ours / torch's).", ""]
    cells = []
    for r in rows:
        name = f"{r['name']} ({', '.join(str(v) for v in r['shape'].values())})"
        if "error" in r:
            cells.append([name, r["error"], "", "", "", "", ""])
            continue
        t, g = r["torch"], r["gg_runtime"]
        cells.append([name, f"{t['forward_ms']:.2f} / {g['forward_ms']:.2f}",
                      fmt(r["forward_vs_torch"]),
                      f"{t['train_step_ms']:.2f} / {g['train_step_ms']:.2f}",
                      fmt(r["train_step_vs_torch"]),
                      f"{t['peak_step_gb']:.2f} / {g['peak_step_gb']:.2f}",
                      fmt(r["peak_vs_torch"])])
    lines += table(["layer (T, H, I, E, k)", "forward ms", "x", "forward + backward ms", "x",
                    "peak GB", "x"], cells)
    plain = [r for r in rows if not r["name"].endswith("(bias)")]
    return lines + ["", "Geomeans x torch, layers without bias: forward "
                    f"{fmt(geomean(r.get('forward_vs_torch') for r in plain))}, forward + "
                    f"backward {fmt(geomean(r.get('train_step_vs_torch') for r in plain))}."]
