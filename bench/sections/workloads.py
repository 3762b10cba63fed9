"""Every workload of bench/workloads.json side by side: gg_runtime,
torch._grouped_mm (ragged workloads), a cuBLAS loop, the tutorial's kernel
under Triton's JIT (fp16 list workloads, where triton is importable) and one
dense matmul of equal FLOPs; the roofline fraction (floor = max(FLOPs / dense
rate, bytes / copy bandwidth), both measured in the same run)."""
from __future__ import annotations

import torch

import gg_runtime
from gg_runtime.testing import (TOLERANCE, list_inputs, moe_inputs, ref_grouped_mm, ref_list,
                                rel_error, time_ms)

from ..markdown import fmt, geomean, not_timed, table
from ..measure import DTYPES, measure, ratio
from ..plotting import pyplot, save

TITLE = "Workloads: grouped GEMM against its anchors"
ANCHORS = {"gg_runtime": "ours", "torch_grouped_mm": "torch", "cublas_loop": "loop",
           "seed_basic_jit": "seed", "dense_same_flops": "dense"}


def run(context) -> dict:
    ceil = context.ceilings()
    seed = seed_available()
    rows = [bench_workload(w, ceil, seed) for w in context.workloads]
    data = {"ceilings": ceil, "workloads": rows, "summary": summary(rows)}
    path, link = context.plot_path("workloads.png")
    if plot(rows, path):
        data["plot"] = link
    return data


def group_sizes(w) -> list:
    if "mnk" in w:
        return [tuple(x) for x in w["mnk"]]
    return [(m, w["N"], w["K"]) for m in w["m"]]


def traffic_bytes(w) -> int:
    """A + weights of non-empty groups + C, each once (2-byte elements)."""
    return 2 * sum(m * k + (k * n if m else 0) + m * n for m, n, k in group_sizes(w))


def ragged_candidates(w, dtype):
    """(candidates, check, dense matmul shape) of a ragged (MoE) workload."""
    a, b, offs = moe_inputs(w["m"], w["N"], w["K"], dtype)
    ref = ref_grouped_mm(a, b, offs)
    bounds = offs.tolist()
    starts = [0] + bounds[:-1]
    candidates = {
        "gg_runtime": lambda: gg_runtime.grouped_mm(a, b, offs),
        "torch_grouped_mm": lambda: torch._grouped_mm(a, b, offs),
        "cublas_loop": lambda: [a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, bounds))],
    }

    def check(out):
        return rel_error(torch.cat(out) if isinstance(out, list) else out, ref)

    return candidates, check, (sum(w["m"]), w["K"], w["N"])


def list_candidates(w, dtype, sizes, flops, with_seed):
    """(candidates, check, dense matmul shape) of a list workload."""
    As, Bs = list_inputs(sizes, dtype)
    refs = ref_list(As, Bs)
    candidates = {
        "gg_runtime": lambda: gg_runtime.grouped_gemm(As, Bs),
        "cublas_loop": lambda: [x @ y for x, y in zip(As, Bs)],
    }
    if with_seed and dtype == torch.float16:
        from ..seed_kernels import seed_grouped_gemm
        candidates["seed_basic_jit"] = lambda: seed_grouped_gemm(As, Bs)

    def check(outs):
        return max(rel_error(o, r) for o, r in zip(outs, refs))

    side = round((flops / 2) ** (1 / 3))
    return candidates, check, (side, side, side)


def bench_workload(w, ceil, with_seed) -> dict:
    dtype = DTYPES[w["dtype"]]
    sizes = group_sizes(w)
    flops = 2 * sum(m * n * k for m, n, k in sizes)
    if w["layout"] == "ragged":
        candidates, check, (m, k, n) = ragged_candidates(w, dtype)
    else:
        candidates, check, (m, k, n) = list_candidates(w, dtype, sizes, flops, with_seed)
    runs = measure(candidates, check, TOLERANCE[dtype], flops)
    da = torch.randn(m, k, device="cuda").to(dtype)
    db = torch.randn(k, n, device="cuda").to(dtype)
    dense_ms = time_ms(lambda: da @ db)
    runs["dense_same_flops"] = {"ms": dense_ms, "tflops": 2 * m * k * n / dense_ms / 1e9}
    floor_ms = max(flops / ceil["matmul_tflops"] / 1e9, traffic_bytes(w) / ceil["copy_tbps"] / 1e9)
    result = {"name": w["name"], "dtype": w["dtype"], "layout": w["layout"], "groups": len(sizes),
              "flops": flops, "bytes": traffic_bytes(w), "floor_ms": floor_ms, "runs": runs}
    ours = runs.get("gg_runtime", {}).get("ms")
    if ours:
        result["roofline_fraction"] = floor_ms / ours
        result["vs_dense"] = dense_ms / ours
        result["vs_torch"] = ratio(runs, "gg_runtime", "torch_grouped_mm")
        result["vs_cublas_loop"] = ratio(runs, "gg_runtime", "cublas_loop")
    return result


def summary(rows) -> dict:
    moe = [r for r in rows if r["layout"] == "ragged" and r["dtype"] == "bfloat16"]
    vs_torch = [r["vs_torch"] for r in moe if r.get("vs_torch")]
    roof = [r["roofline_fraction"] for r in moe if r.get("roofline_fraction")]
    return {"moe_bf16_geomean_vs_torch": geomean(vs_torch),
            "moe_bf16_min_vs_torch": min(vs_torch, default=None),
            "moe_bf16_geomean_roofline": geomean(roof),
            "moe_bf16_min_roofline": min(roof, default=None)}


def seed_available() -> bool:
    """The tutorial's kernel runs under Triton's JIT, where triton is importable."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def plot(rows, path) -> bool:
    """A bar chart of each workload's TFLOP/s per anchor at `path`; False where
    matplotlib is not importable."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(14, 5))
    width = 0.16
    for i, name in enumerate(ANCHORS):
        ys = [r["runs"].get(name, {}).get("tflops", 0) for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], ys, width, label=name)
    ax.set_xticks([x + 2 * width for x in range(len(rows))])
    ax.set_xticklabels([r["name"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"grouped GEMM on {torch.cuda.get_device_name()}")
    ax.legend()
    save(fig, path)
    return True


def report(data) -> list:
    ceil, rows, s = data["ceilings"], data["workloads"], data["summary"]
    lines = [f"Ceilings measured in the same run: dense bf16 matmul "
             f"{ceil['matmul_tflops']:.0f} TFLOP/s, device copy {ceil['copy_tbps']:.2f} TB/s. "
             "TFLOP/s = 2·Σ m·N·K / time; x = how many times faster gg_runtime ran; "
             "roof = roofline floor / gg_runtime's time.", ""]
    header = ["workload", *ANCHORS.values(), "x torch", "x dense", "x loop", "roof"]
    lines += table(header, [
        [r["name"], *(fmt(r["runs"].get(name, {}).get("tflops"), "{:.0f}") for name in ANCHORS),
         fmt(r.get("vs_torch")), fmt(r.get("vs_dense")), fmt(r.get("vs_cublas_loop")),
         fmt(r.get("roofline_fraction"), "{:.0%}")] for r in rows])
    lines += ["", f"bf16 MoE workloads: x torch geomean {fmt(s['moe_bf16_geomean_vs_torch'])} "
              f"(least {fmt(s['moe_bf16_min_vs_torch'])}), roof geomean "
              f"{fmt(s['moe_bf16_geomean_roofline'], '{:.0%}')} "
              f"(least {fmt(s['moe_bf16_min_roofline'], '{:.0%}')})."]
    lines += not_timed(rows)
    if "plot" in data:
        lines += ["", f"![TFLOP/s per workload]({data['plot']})"]
    return lines
