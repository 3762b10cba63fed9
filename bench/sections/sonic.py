"""gg_runtime.moe_experts against SonicMoE (bf16, forward and forward +
backward), the fastest public MoE kernels on Hopper, where SonicMoE imports
(its code is run, never copied; docs/build.md says how to install it for
this).  Both take the same tokens, weights and
top-k routing; SonicMoE through moe_general_routing_inputs with w13 and w2
as its [2I, H, E] and [H, I, E] views (gate rows then up rows).  TFLOP/s
count 6 T k H I for the forward and 18 T k H I with the backward, against
the dense bf16 matmul rate measured in the same run.  SonicMoE's first call
of each layer can take minutes: run a layer at a time where a process is
time-limited (--only NAME); runs of one commit and device merge their rows
(bench/run.py merged)."""
from __future__ import annotations

import time
from functools import partial

import torch

import gg_runtime
from gg_runtime.testing import (TOLERANCE, moe_layer_inputs, rel_error, route_top_k,
                                time_in_turns)

from ..markdown import fmt, table
from ..measure import peak_gb
from .training import LAYERS as TRAINING_LAYERS

TITLE = "MoE experts against SonicMoE"
# Issue 50's layers, then a fine-grained layer no kernel was tuned on
# (DeepSeek-V2-Lite's experts).
LAYERS = {name: TRAINING_LAYERS[name]
          for name in ("qwen3_30b_a3b", "olmoe", "mixtral_8x7b", "dsv3_ep8_slice")}
LAYERS["deepseek_v2_lite"] = (16384, 2048, 1408, 64, 6)
IMPLEMENTATIONS = ("moe_experts", "sonicmoe")
ROWS = "layers"  # named rows: --only runs of one commit merge (bench/run.py merged)


def sonicmoe():
    """The sonicmoe module, or None where it does not import."""
    try:
        import sonicmoe  # noqa: PLC0415 (an optional anchor, absent from most machines)
    except ImportError:
        return None
    return sonicmoe


def run(context) -> dict:
    sonic = sonicmoe()
    if sonic is None:
        return {"skipped": "sonicmoe does not import here (docs/build.md, PYTHONPATH: "
                           "installing SonicMoE for this section)"}
    dense = context.ceilings()["matmul_tflops"]
    return {"sonicmoe": sonic.__version__,
            "layers": [bench_layer(name, shape, sonic, dense) for name, shape in LAYERS.items()
                       if context.only in name]}


def sonic_experts(sonic, x, ids, weights, w13, w2):
    """moe_experts' forward computed by SonicMoE: the top-k routing as its
    general routing's (token, expert, score) triples, in token order."""
    from sonicmoe.enums import ActivationType  # noqa: PLC0415 (as sonicmoe())

    tokens, top_k = ids.shape
    token_idx = torch.arange(tokens, device=x.device, dtype=torch.int32).repeat_interleave(top_k)
    out, _ = sonic.moe_general_routing_inputs(
        x, weights.reshape(-1), token_idx, ids.reshape(-1).to(torch.int32),
        w13.permute(1, 2, 0), None, w2.permute(1, 2, 0), None, w13.shape[0],
        torch.cuda.current_stream().cuda_stream, ActivationType.SWIGLU,
        is_inference_mode_enabled=False, concat_layout=True)
    return out


def bench_layer(name: str, shape: tuple, sonic, dense_tflops: float) -> dict:
    """One layer: each implementation's first forward + backward (wall-clock,
    SonicMoE's autotuning included), its output and gradients against
    moe_experts', then forward and forward + backward timed in turns, and a
    step's peak memory above the inputs and weights."""
    tokens, hidden, inter, experts, top_k = shape
    inputs = moe_layer_inputs(tokens, hidden, inter, experts)
    with torch.no_grad():
        weights, ids = route_top_k(inputs["x"], inputs["router"], top_k)
    leaves = (inputs["x"], weights.requires_grad_(), inputs["w13"], inputs["w2"])
    dy = torch.randn_like(inputs["x"])
    layers = {"moe_experts": gg_runtime.moe_experts, "sonicmoe": partial(sonic_experts, sonic)}

    def forward(impl):
        x, weights, w13, w2 = leaves
        return layers[impl](x, ids, weights, w13, w2)

    def step(impl):
        for t in leaves:
            t.grad = None
        forward(impl).backward(dy)

    row = {"name": name, "shape": dict(zip(("T", "H", "I", "E", "k"), shape)),
           "first_call_s": {impl: first_call_s(partial(step, impl)) for impl in layers}}
    results = {}
    for impl in layers:
        step(impl)
        results[impl] = [forward(impl).detach()] + [t.grad for t in leaves]
    row["error"] = max(rel_error(theirs, ours.float()) for ours, theirs in
                       zip(results["moe_experts"], results["sonicmoe"]))
    del results
    if row["error"] > TOLERANCE[torch.bfloat16]:
        return row
    flops = 6 * tokens * top_k * hidden * inter
    forward_ms = time_in_turns({impl: partial(forward, impl) for impl in layers})
    step_ms = time_in_turns({impl: partial(step, impl) for impl in layers})
    for impl in layers:
        for t in leaves:  # a step's peak counts the gradients it makes
            t.grad = None
        row[impl] = {"forward_ms": forward_ms[impl], "step_ms": step_ms[impl],
                     "forward_tflops": flops / forward_ms[impl] / 1e9,
                     "step_tflops": 3 * flops / step_ms[impl] / 1e9,
                     "peak_step_gb": peak_gb(partial(step, impl))}
    ours = row["moe_experts"]
    row["forward_x"] = row["sonicmoe"]["forward_ms"] / ours["forward_ms"]
    row["step_x"] = row["sonicmoe"]["step_ms"] / ours["step_ms"]
    row["dense_tflops"] = dense_tflops
    row["of_dense"] = ours["step_tflops"] / dense_tflops
    return row


def first_call_s(fn) -> float:
    """Wall-clock seconds of fn() on a new shape, synchronized."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


COLUMNS = ["layer (T, H, I, E, k)", "moe_experts fwd / fwd+bwd TFLOP/s",
           "SonicMoE fwd / fwd+bwd TFLOP/s", "x SonicMoE fwd", "x SonicMoE fwd+bwd",
           "dense TFLOP/s", "fwd+bwd of dense", "peak GB ours / SonicMoE",
           "1st call s ours / SonicMoE", "error"]


def report(data) -> list:
    if "skipped" in data:
        return [f"Not run: {data['skipped']}."]
    lines = [f"bf16, SonicMoE {data['sonicmoe']} (autotuned on its first call of each shape), "
             "same weights and top-k routing. x SonicMoE: its time / moe_experts'. fwd+bwd of "
             "dense: moe_experts' forward + backward TFLOP/s / the dense bf16 matmul's (8192^3) "
             "measured in the same process. 1st call: the first forward + backward of the "
             "shape, wall-clock. error: SonicMoE's output and gradients against moe_experts' "
             f"(relative, the largest), within {TOLERANCE[torch.bfloat16]:.0e} before either is "
             "timed.", ""]
    return lines + table(COLUMNS, [row_cells(row) for row in data["layers"]])


def row_cells(row: dict) -> list:
    shape = f"{row['name']} ({', '.join(str(v) for v in row['shape'].values())})"
    first = " / ".join(f"{row['first_call_s'][impl]:.1f}" for impl in IMPLEMENTATIONS)
    if "moe_experts" not in row:
        return [shape, "-", "-", "-", "-", "-", "-", "-", first,
                f"{row['error']:.1e} (not timed)"]
    ours, sonic = row["moe_experts"], row["sonicmoe"]
    return [shape, f"{ours['forward_tflops']:.0f} / {ours['step_tflops']:.0f}",
            f"{sonic['forward_tflops']:.0f} / {sonic['step_tflops']:.0f}",
            fmt(row["forward_x"]), fmt(row["step_x"]), f"{row['dense_tflops']:.0f}",
            f"{row['of_dense']:.2f}",
            f"{ours['peak_step_gb']:.2f} / {sonic['peak_step_gb']:.2f}", first,
            f"{row['error']:.1e}"]
