"""fp8 training of the MoE experts (issue 49): moe_experts(fp8=recipe) in
each recipe against bf16 moe_experts on the same bf16 inputs and routing,
forward and forward+backward (gradients of x, the routing weights and both
expert weights, through torch.autograd.grad), timed in turns; the memory
the forward keeps for the backward and the peak of a step.  Each recipe's
output and gradients are checked against bf16's before they are timed.
Also each recipe's step with the weights quantized once before
(quantize_expert_weights: gradient accumulation's micro-batches), and that
quantization's own time."""
from __future__ import annotations

from functools import partial

import torch

import gg_runtime
from gg_runtime.testing import moe_layer_inputs, rel_error, route_top_k, time_in_turns

from ..markdown import fmt, geomean, table
from ..measure import peak_gb
from .experts import OWN_ACTIVATION, saved_gb
from .training import LAYERS

TITLE = "fp8 training: moe_experts(fp8=...) against bf16 moe_experts"
RECIPES = ("rowwise", "blockwise")
IMPLEMENTATIONS = (None,) + RECIPES  # None: bf16
# fp8 against bf16 on the same inputs: every product's operands rounded to
# e4m3 (3 mantissa bits), a few percent of each result.
FP8_VS_BF16 = 0.1


def run(context) -> dict:
    layers = [(name, shape, {}) for name, shape in LAYERS.items()]
    layers += [(name, LAYERS[layer], options) for name, (layer, options) in OWN_ACTIVATION.items()]
    rows = []
    for name, shape, options in layers:
        if context.only in name:
            rows.append(bench_layer(name, shape, **options))
            torch.cuda.empty_cache()  # the next layer's inputs where this one's were
    return {"layers": rows}


def label(recipe) -> str:
    return recipe or "bf16"


def bench_layer(name: str, shape: tuple, bias=False, activation="swiglu",
                interleaved=False) -> dict:
    """One layer's rows; bias, activation, interleaved: as experts.OWN_ACTIVATION
    gives them (gg_runtime.testing.moe_layer's arguments)."""
    tokens, hidden, inter, experts, top_k = shape
    inputs = moe_layer_inputs(tokens, hidden, inter, experts, bias=bias)
    with torch.no_grad():
        weights, ids = route_top_k(inputs["x"], inputs["router"], top_k)
    biases = (inputs["b13"], inputs["b2"]) if bias else ()
    leaves = (inputs["x"], weights.requires_grad_(), inputs["w13"], inputs["w2"], *biases)
    layout = {"gate_up": "interleaved" if interleaved else "concatenated",
              "activation": activation}
    dy = torch.randn_like(inputs["x"])

    def forward(recipe):
        x, topk_weights, w13, w2, *b = leaves
        b13, b2 = b or (None, None)
        return gg_runtime.moe_experts(x, ids, topk_weights, w13, w2, b13=b13, b2=b2, fp8=recipe,
                                      **layout)

    def step(recipe):
        return torch.autograd.grad(forward(recipe), leaves, dy)

    def quantize(recipe):
        return gg_runtime.quantize_expert_weights(leaves[2], leaves[3], fp8=recipe)

    quantized = {recipe: quantize(recipe) for recipe in RECIPES}

    row = {"name": name, "shape": dict(zip(("T", "H", "I", "E", "k"), shape)), "errors": {}}
    reference = [forward(None).detach(), *step(None)]
    for recipe in RECIPES:
        got = [forward(recipe).detach(), *step(recipe)]
        row["errors"][recipe] = max(rel_error(g, r.float()) for g, r in zip(got, reference))
    del reference, got
    if max(row["errors"].values()) > FP8_VS_BF16:
        row["error"] = f"an fp8 recipe differs from bf16 by more than {FP8_VS_BF16}: " \
                       f"{row['errors']}"
        return row
    forward_ms = time_in_turns({label(r): partial(forward, r) for r in IMPLEMENTATIONS})
    steps = {label(r): partial(step, r) for r in IMPLEMENTATIONS}
    steps.update({f"{r} given": partial(step, quantized[r]) for r in RECIPES})
    step_ms = time_in_turns(steps)
    quantize_ms = time_in_turns({r: partial(quantize, r) for r in RECIPES})
    for recipe in IMPLEMENTATIONS:
        row[label(recipe)] = {"forward_ms": forward_ms[label(recipe)],
                              "step_ms": step_ms[label(recipe)],
                              "peak_step_gb": peak_gb(partial(step, recipe)),
                              "saved_gb": saved_gb(partial(forward, recipe))}
    bf16 = row["bf16"]
    for recipe in RECIPES:
        r = row[recipe]
        r["forward_x"] = bf16["forward_ms"] / r["forward_ms"]
        r["step_x"] = bf16["step_ms"] / r["step_ms"]
        r["step_given_ms"] = step_ms[f"{recipe} given"]
        r["step_given_x"] = bf16["step_ms"] / r["step_given_ms"]
        r["quantize_ms"] = quantize_ms[recipe]
    return row


def report(data) -> list:
    rows = [r for r in data["layers"] if "error" not in r]
    lines = ["x bf16: bf16 moe_experts' time / moe_experts(fp8=recipe)'s, same inputs and "
             "routing (fwd: forward; step: forward and the gradients of x, the routing "
             "weights, w13 and w2).  Kept: GB the forward keeps for the backward; peak: GB "
             "a step allocates at its peak.", ""]
    head = ["layer (T, H, I, E, k)", "bf16 fwd ms", "bf16 step ms", "bf16 kept / peak GB"]
    for recipe in RECIPES:
        head += [f"{recipe} fwd x", f"{recipe} step x", f"{recipe} kept / peak GB"]
    body = []
    for r in data["layers"]:
        shape = ", ".join(str(v) for v in r["shape"].values())
        if "error" in r:
            body.append([f"{r['name']} ({shape})", r["error"]] + [""] * (len(head) - 2))
            continue
        cells = [f"{r['name']} ({shape})", f"{r['bf16']['forward_ms']:.2f}",
                 f"{r['bf16']['step_ms']:.2f}", memory(r["bf16"])]
        for recipe in RECIPES:
            cells += [fmt(r[recipe]["forward_x"]), fmt(r[recipe]["step_x"]), memory(r[recipe])]
        body.append(cells)
    lines += table(head, body)
    if rows:
        lines += ["", "Geomeans: " + ", ".join(
            f"{recipe} fwd {fmt(geomean(r[recipe]['forward_x'] for r in rows))}, step "
            f"{fmt(geomean(r[recipe]['step_x'] for r in rows))}" for recipe in RECIPES) + "."]
        lines += ["", *given_report(rows)]
    return lines


def given_report(rows) -> list:
    """The steps with the weights quantized once before (quantize_expert_weights)."""
    lines = ["With the weights quantized once for several calls (`quantize_expert_weights`, "
             "as gradient accumulation's micro-batches use them): x bf16 of such a step, and "
             "the quantization's own ms (once per optimizer step, both weights in both "
             "orientations).", ""]
    head = ["layer"]
    for recipe in RECIPES:
        head += [f"{recipe} step x, weights given", f"{recipe} quantize ms"]
    body = [[r["name"]] + [cell for recipe in RECIPES for cell in (
        fmt(r[recipe]["step_given_x"]), f"{r[recipe]['quantize_ms']:.2f}")] for r in rows]
    return lines + table(head, body) + ["", "Geomeans: " + ", ".join(
        f"{recipe} {fmt(geomean(r[recipe]['step_given_x'] for r in rows))}"
        for recipe in RECIPES) + "."]


def memory(run: dict) -> str:
    return f"{run['saved_gb']:.2f} / {run['peak_step_gb']:.2f}"
