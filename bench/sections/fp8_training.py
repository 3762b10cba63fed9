"""fp8 training of grouped products (issue 49): fp8_grouped_mm in each
recipe against bf16 grouped_mm on the same bf16 inputs, forward and
forward+backward (both gradients, through torch.autograd.grad: nothing
accumulates between calls), on the up and down projections of four MoE
models' experts at a training batch.  Each result is checked against the
bf16 path's before it is timed."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime.testing import rel_error

from ..markdown import fmt, geomean, not_timed, table
from ..measure import measure, ratio

TITLE = "fp8 training: grouped products"
# (rows T x k, experts, K, N) of each model's up (N = 2I) and down projections.
SHAPES = {"mixtral_up": (16384, 8, 4096, 28672), "mixtral_down": (16384, 8, 14336, 4096),
          "deepseek_v3_ep8_up": (65536, 32, 7168, 4096),
          "deepseek_v3_ep8_down": (65536, 32, 2048, 7168),
          "qwen3_30b_a3b_up": (131072, 128, 2048, 1536),
          "qwen3_30b_a3b_down": (131072, 128, 768, 2048),
          "olmoe_up": (131072, 64, 2048, 2048), "olmoe_down": (131072, 64, 1024, 2048)}
RECIPES = ("rowwise", "blockwise")
# fp8 against bf16 on the same inputs: both operands of every product are
# rounded to e4m3 (3 mantissa bits), a few percent of the result.
FP8_VS_BF16 = 0.1


def run(context) -> dict:
    workloads = []
    for name, shape in SHAPES.items():
        workloads.append(bench_shape(name, *shape))
        torch.cuda.empty_cache()  # the next shape's inputs where this one's were
    return {"workloads": workloads}


def inputs(rows, experts, k, n):
    counts = torch.distributions.Multinomial(rows, torch.ones(experts)).sample()
    offs = counts.cumsum(0).to(torch.int32).cuda()
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16).requires_grad_()
    w = (torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5)
    return a, w.requires_grad_(), offs, torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)


def bench_shape(name, rows, experts, k, n) -> dict:
    a, w, offs, grad = inputs(rows, experts, k, n)
    products = {"bf16": lambda: gg_runtime.grouped_mm(a, w.mT, offs)}
    for recipe in RECIPES:
        products[recipe] = (lambda r=recipe: gg_runtime.fp8_grouped_mm(a, w.mT, offs, recipe=r))
    flops = 2 * rows * k * n
    with torch.no_grad():
        ref = products["bf16"]()
        forward = measure({f"{p}_fwd": fn for p, fn in products.items()},
                          lambda out: rel_error(out, ref.float()), FP8_VS_BF16, flops)
    ref_grads = torch.autograd.grad(products["bf16"](), (a, w), grad)

    def step(fn):
        return lambda: torch.autograd.grad(fn(), (a, w), grad)

    both = measure({f"{p}_step": step(fn) for p, fn in products.items()},
                   lambda grads: max(rel_error(g, r.float()) for g, r in zip(grads, ref_grads)),
                   FP8_VS_BF16, 3 * flops)
    runs = {**forward, **both}
    return {"name": name, "shape": [rows, experts, k, n], "runs": runs,
            **{f"{r}_fwd_vs_bf16": ratio(runs, f"{r}_fwd", "bf16_fwd") for r in RECIPES},
            **{f"{r}_step_vs_bf16": ratio(runs, f"{r}_step", "bf16_step") for r in RECIPES}}


def report(data) -> list:
    rows = data["workloads"]
    lines = ["x bf16: bf16 grouped_mm's time / fp8_grouped_mm's, same inputs (fwd: forward; "
             "step: forward and both gradients).  TFLOP/s count the bf16 products' FLOPs "
             "(3 products a step).", ""]
    head = ["workload (T x k, E, K, N)", "bf16 fwd TFLOP/s", "bf16 step TFLOP/s"]
    for recipe in RECIPES:
        head += [f"{recipe} fwd x bf16", f"{recipe} step x bf16"]
    body = []
    for r in rows:
        cells = [f"{r['name']} {tuple(r['shape'])}",
                 fmt(r["runs"]["bf16_fwd"].get("tflops"), "{:.0f}"),
                 fmt(r["runs"]["bf16_step"].get("tflops"), "{:.0f}")]
        for recipe in RECIPES:
            cells += [fmt(r[f"{recipe}_fwd_vs_bf16"]), fmt(r[f"{recipe}_step_vs_bf16"])]
        body.append(cells)
    lines += table(head, body)
    lines += ["", "Geomeans: " + ", ".join(
        f"{recipe} fwd {fmt(geomean(r[f'{recipe}_fwd_vs_bf16'] for r in rows))}, step "
        f"{fmt(geomean(r[f'{recipe}_step_vs_bf16'] for r in rows))}" for recipe in RECIPES)
        + "."]
    return lines + not_timed(rows)
