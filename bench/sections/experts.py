"""gg_runtime.moe_experts against MoE layers written with torch: the router,
then the experts as torchtitan writes them (index_add_), without atomics (the
baseline), the same with gg_runtime.grouped_mm, and gg_runtime.moe_experts.
Forward, forward + backward, peak memory of a step and the memory the forward
keeps for backward."""
from __future__ import annotations

from functools import partial

import torch

import gg_runtime
from gg_runtime.testing import (TOLERANCE, moe_layer, moe_layer_inputs, moe_layer_no_atomics,
                                rel_error, route_top_k, time_in_turns, with_added_bias)

from ..markdown import table
from ..measure import peak_gb
from .training import LAYERS as TRAINING_LAYERS

TITLE = "MoE experts: gg_runtime.moe_experts against torch layers"


def fused_layer(x, router, w13, w2, top_k: int, b13=None, b2=None, activation="swiglu",
                interleaved=False):
    weights, chosen = route_top_k(x, router, top_k)
    return gg_runtime.moe_experts(x, chosen, weights, w13, w2, b13=b13, b2=b2,
                                  activation=activation,
                                  gate_up="interleaved" if interleaved else "concatenated")


LAYERS = {
    "torchtitan": partial(moe_layer, with_added_bias(torch._grouped_mm)),
    "no_atomics": partial(moe_layer_no_atomics, with_added_bias(torch._grouped_mm)),
    "no_atomics_gg_mm": partial(moe_layer_no_atomics, gg_runtime.grouped_mm),
    "moe_experts": fused_layer,
}
BASELINE = "no_atomics"
# The rows besides the training section's layers (SwiGLU, no bias): gpt-oss-20b as
# it is, with its experts' biases, interleaved gate/up and clamped activation.
OWN_ACTIVATION = {"gpt_oss_20b_as_is": ("gpt_oss_20b", {"bias": True, "activation": "gpt_oss",
                                                        "interleaved": True})}


def run(context) -> dict:
    rows = [(name, shape, {}) for name, shape in TRAINING_LAYERS.items()]
    rows += [(name, TRAINING_LAYERS[layer], options)
             for name, (layer, options) in OWN_ACTIVATION.items()]
    return {"layers": [bench_experts(name, shape, **options) for name, shape, options in rows
                       if context.only in name]}


def bench_experts(name: str, shape: tuple, bias=False, **activation) -> dict:
    """One MoE layer, each of LAYERS on the same inputs: forward, forward +
    backward (all gradients; both timed in turns over the layers,
    gg_runtime.testing.time_in_turns), peak memory of a step and the memory
    the forward keeps for backward (allocated after it, less its output).
    Ratios against the BASELINE layer, whose outputs and gradients the others'
    are checked against first.  activation: the layers' activation and
    interleaved arguments (gg_runtime.testing.moe_layer)."""
    tokens, hidden, inter, experts, top_k = shape
    inputs = moe_layer_inputs(tokens, hidden, inter, experts, bias=bias)
    dy = torch.randn_like(inputs["x"])

    def forward(layer):
        return layer(**inputs, top_k=top_k, **activation)

    def step(layer):
        for t in inputs.values():
            t.grad = None
        forward(layer).backward(dy)

    row = {"name": name, "shape": dict(zip(("T", "H", "I", "E", "k"), shape)), "errors": {}}
    results = {}
    for impl, layer in LAYERS.items():
        step(layer)
        results[impl] = [forward(layer).detach()] + [t.grad for t in inputs.values()]
    for impl in LAYERS:
        row["errors"][impl] = max(rel_error(ours, theirs.float()) for ours, theirs in
                                  zip(results[impl], results[BASELINE]))
    del results
    if max(row["errors"].values()) > TOLERANCE[torch.bfloat16]:
        row["error"] = f"a layer differs from the {BASELINE} torch layer: {row['errors']}"
        return row
    forward_ms = time_in_turns({impl: partial(forward, layer) for impl, layer in LAYERS.items()})
    step_ms = time_in_turns({impl: partial(step, layer) for impl, layer in LAYERS.items()})
    for impl, layer in LAYERS.items():
        row[impl] = {"forward_ms": forward_ms[impl], "train_step_ms": step_ms[impl],
                     "peak_step_gb": peak_gb(lambda: step(layer)),
                     "saved_gb": saved_gb(lambda: forward(layer))}
    base = row[BASELINE]
    for impl in LAYERS:
        r = row[impl]
        r["forward_x"] = base["forward_ms"] / r["forward_ms"]
        r["train_step_x"] = base["train_step_ms"] / r["train_step_ms"]
        r["saved_x"] = r["saved_gb"] / base["saved_gb"]
    return row


def saved_gb(forward) -> float:
    """GB the forward leaves allocated (what autograd keeps for backward), its output aside."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = forward()
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
    del out
    return kept / 1e9


def report(data) -> list:
    lines = [f"bf16. x: the {BASELINE} torch layer's time / this layer's (memory kept for "
             f"backward: this layer's / the {BASELINE} layer's).", ""]
    cells = []
    for r in data["layers"]:
        if "error" in r:
            cells.append([r["name"], "", r["error"], "", "", "", "", "", ""])
            continue
        shape = ", ".join(str(v) for v in r["shape"].values())
        for impl in LAYERS:
            x = r[impl]
            cells.append([f"{r['name']} ({shape})", impl, f"{x['forward_ms']:.2f}",
                          f"{x['train_step_ms']:.2f}", f"{x['saved_gb']:.2f}",
                          f"{x['peak_step_gb']:.2f}", f"{x['forward_x']:.2f}",
                          f"{x['train_step_x']:.2f}", f"{x['saved_x']:.2f}"])
    return lines + table(["layer (T, H, I, E, k)", "implementation", "forward ms",
                          "forward + backward ms", "kept GB", "peak GB", "x forward",
                          "x forward + backward", "x kept"], cells)
