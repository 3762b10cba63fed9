"""Host time per call on a tiny problem, ours next to torch's, and cold start
(bench/cold_start.py in a fresh process)."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import gg_runtime
from gg_runtime.testing import list_inputs, moe_inputs

from ..markdown import table

TITLE = "Host time per call, and cold start"
COLD_START = Path(__file__).resolve().parents[1] / "cold_start.py"


def run(context) -> dict:
    return {"calls": host_costs(), "cold_start": cold_start()}


def host_us(fn, calls=2000) -> float:
    """Median host-side microseconds per call (GPU work kept tiny so it never throttles)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        samples.append((time.perf_counter() - t0) / (calls // 5) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def shielded_host_us(fn, batch=100, sleep_cycles=40_000_000) -> float:
    """Host microseconds per call of `batch` calls queued behind a GPU sleep
    (tens of milliseconds) that outlasts them: the host never waits for the
    GPU, whatever the calls' own GPU time, and the queue stays far from full
    (a few hundred launches)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    t0 = time.perf_counter()
    for _ in range(batch):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / batch * 1e6


def host_us_in_turns(fns: dict, turns=9) -> dict:
    """{name: median shielded_host_us} of each fn, all timed in each turn, in
    reverse order every other turn: the host's own speed drifts within a
    process, and this spreads the drift over all of them alike."""
    for fn in fns.values():
        for _ in range(50):
            fn()
    times = {name: [] for name in fns}
    for turn in range(turns):
        for name in (list(fns) if turn % 2 == 0 else list(reversed(fns))):
            times[name].append(shielded_host_us(fns[name]))
    return {name: statistics.median(values) for name, values in times.items()}


def host_costs() -> dict:
    """Host time per call on a tiny problem, ours next to torch's, same inputs:
    plain, with autograd recording (weights that require grad), the weight
    gradient (ragged K of a.t() and an output-shaped dy), and the list
    API with 128 groups against a loop of matmuls and torch's fused 128-tensor
    foreach op; moe_experts' whole forward (256 tokens, top-2 of 8 experts, no
    autograd recording), to set against one torch._grouped_mm call, and the
    replay of a CUDA graph that captured it; and that forward against one
    torch._grouped_mm timed in turns behind a GPU sleep (host_us_in_turns),
    the issue's host target.  Where ours goes: `op_` rows call the operator
    torch.ops.gg_runtime.grouped_mm directly (no Python wrapper), `empty_op_`
    rows on meta tensors (dispatch, checks, allocation; no launch)."""
    a, b, offs = moe_inputs([32] * 8, 128, 128, torch.bfloat16)
    w = b.detach().requires_grad_()
    dy = torch.randn_like(gg_runtime.grouped_mm(a, b, offs))
    As, Bs = list_inputs([(16, 16, 32)] * 128, torch.float16)
    weights, chosen = torch.rand(256, 8, device="cuda").topk(2, dim=-1)
    w13, w2 = b.new_empty(8, 128, 128).normal_(), b.new_empty(8, 128, 64).normal_()
    ours = {"grouped_mm_us": lambda: gg_runtime.grouped_mm(a, b, offs),
            "grouped_mm_autograd_us": lambda: gg_runtime.grouped_mm(a, w, offs),
            "weight_gradient_us": lambda: gg_runtime.grouped_mm(a.t(), dy, offs),
            "grouped_gemm_128_groups_us": lambda: gg_runtime.grouped_gemm(As, Bs),
            "moe_experts_forward_us": lambda: gg_runtime.moe_experts(a, chosen, weights, w13, w2)}
    op = torch.ops.gg_runtime.grouped_mm.default
    meta = [x.to("meta") for x in (a, b, offs)]
    ours.update(op_grouped_mm_us=lambda: op(a, b, offs, None, None, False),
                op_grouped_mm_autograd_us=lambda: op(a, w, offs, None, None, False),
                empty_op_grouped_mm_us=lambda: op(*meta, None, None, False))
    # The same forward captured in a CUDA graph: what replaying it costs the host.
    forward_graph = torch.cuda.CUDAGraph()
    gg_runtime.moe_experts(a, chosen, weights, w13, w2)  # kernels loaded before the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(forward_graph):
        gg_runtime.moe_experts(a, chosen, weights, w13, w2)
    ours["moe_experts_forward_graph_replay_us"] = forward_graph.replay
    # The issue's host target, moe_experts' forward against one torch._grouped_mm,
    # timed in turns behind a GPU sleep (its forward's own GPU time is as long as
    # its host time here, which host_us's unshielded batches let the GPU throttle).
    turns = host_us_in_turns({
        "moe_experts_forward_in_turns_us": ours["moe_experts_forward_us"],
        "torch_grouped_mm_in_turns_us": lambda: torch._grouped_mm(a, b, offs)})
    costs = {name: host_us(fn) for name, fn in ours.items()}
    costs.update(turns, moe_experts_forward_x_torch=turns["moe_experts_forward_in_turns_us"]
                 / turns["torch_grouped_mm_in_turns_us"])
    costs.update(torch_grouped_mm_us=host_us(lambda: torch._grouped_mm(a, b, offs)),
                 torch_grouped_mm_autograd_us=host_us(lambda: torch._grouped_mm(a, w, offs)),
                 torch_weight_gradient_us=host_us(lambda: torch._grouped_mm(a.t(), dy, offs)),
                 matmul_loop_128_groups_us=host_us(lambda: [x @ y for x, y in zip(As, Bs)], 500),
                 # torch's fastest op with 128 new tensors out (one fused launch): what
                 # torch itself pays to return that many tensors, a floor for the list API
                 torch_foreach_128_groups_us=host_us(lambda: torch._foreach_add(As, 1.0)))
    return costs


def cold_start() -> dict:
    out = subprocess.run([sys.executable, str(COLD_START)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(data) -> list:
    calls = data["calls"]
    lines = ["Microseconds of host time per call (`op_`: the operator called directly, "
             "`empty_op_`: on meta tensors, no launch; `_in_turns`: timed in turns behind a GPU "
             "sleep).", ""]
    lines += table(["call", "host us"], [[f"`{name}`", f"{value:.1f}"]
                                         for name, value in calls.items() if name.endswith("_us")])
    cold = data["cold_start"]
    return lines + [
        "", f"moe_experts' forward / one torch._grouped_mm, in turns: "
        f"{calls['moe_experts_forward_x_torch']:.2f}x the host time.",
        "", f"Cold start in a fresh process: import {cold['import_ms']:.1f} ms, first call "
        f"{cold['first_call_ms']:.1f} ms (Triton loaded: {cold['triton_loaded']})."]
