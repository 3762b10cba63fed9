"""vLLM's Triton fused MoE against moe_experts, both with fp8 e4m3 weights in
128 x 128 blocks (DeepSeek-V3's format; issue 48), on the expert shapes servers
run: whole models and their tensor-parallel shards (SHAPES), fp8_experts'
token counts.  Decode rows (T <= DECODE_MAX) are timed replayed from CUDA
graphs on both sides, as vLLM serves them; prefill rows eagerly.  vLLM's two
fused_moe_kernel launches are also timed alone.  vLLM's fused_moe_kernel and per-token-group
quantisation are copied from a vLLM release into an ignored folder by
bench/vendor_vllm.py (nothing of vLLM is committed) and run with this
machine's Triton around a host path written in torch (bench/vllm_moe.py says
where it differs from vLLM's).  GPU time, and each one's first call on a new
token count: vLLM's includes its Triton JIT compile, the Triton cache being a
new empty folder for the section.  vLLM's output is checked against ours
before either is timed.  Runs where GG_VLLM_SRC names the vendored folder (a
relative path is taken from the repository root), and says why not elsewhere:

    python3 -m bench.vendor_vllm SOURCE   # a vLLM wheel, checkout or git directory
    GG_VLLM_SRC=.device/vllm make bench BENCH_ARGS="--sections vllm_fp8"
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
from pathlib import Path

import torch

import gg_runtime
from gg_runtime.testing import rel_error

from .. import vendor_vllm, vllm_moe
from ..markdown import fmt, not_timed, table
from ..measure import measure, ratio
from .fp8_experts import (DECODE_TOKENS, PREFILL_TOKENS, SCALES, expert_weights,
                          first_call_ms, routed_tokens)

TITLE = "MoE experts with fp8 weights against vLLM's Triton fused MoE"
ENV = "GG_VLLM_SRC"
SCALES_NAME = "blockwise"
IMPLEMENTATIONS = ("gg_fp8", "vllm_fp8", "vllm_gemms")
ROWS = "cases"  # one model a process: bench.run merges runs filtered by --only
COLUMNS = ["T", "experts touched", "fp8 ms", "vLLM ms", "vLLM GEMMs ms", "x vLLM",
           "x vLLM GEMMs", "graphs", "its way: fp8 ms", "its way: vLLM ms", "its way: x vLLM",
           "1st fp8 ms", "1st vLLM ms", "vLLM error", "vLLM config"]
# Expert shapes as served, (H, I per shard, E, k): DeepSeek-V3 on 8 and 16 GPUs of
# tensor parallelism (I 256, 128) and whole, Qwen3-30B-A3B whole and on 2 and 4,
# Mixtral 8x7B whole and on 2.
SHAPES = {"deepseek_v3_tp16": (7168, 128, 256, 8), "deepseek_v3_tp8": (7168, 256, 256, 8),
          "deepseek_v3": (7168, 2048, 256, 8), "qwen3_30b_a3b": (2048, 768, 128, 8),
          "qwen3_30b_a3b_tp2": (2048, 384, 128, 8), "qwen3_30b_a3b_tp4": (2048, 192, 128, 8),
          "mixtral": (4096, 14336, 8, 2), "mixtral_tp2": (4096, 7168, 8, 2)}
# vLLM replays decode steps of up to this many tokens from CUDA graphs
# (max_cudagraph_capture_size's default).
DECODE_MAX = 512
# vLLM's output against ours on the same fp8 weights and routing: both round x
# and SwiGLU's output to e4m3 per 1 x 128 group, each about 5% from bf16
# (fp8_experts) mostly through the same roundings; they differ where vLLM
# rounds the gate/up product to bf16 before SwiGLU, which moves some of h's
# e4m3 roundings by a step.  A wrong expert, scale or routing weight is off by
# order one.
TOLERANCE = 8e-2
# vLLM's benchmarks/kernels/benchmark_moe.py times a config as this many calls
# captured in one CUDA graph, the graph replayed between two events.
ITS_CALLS_A_GRAPH = 10
ITS_REPLAYS = 20


def run(context) -> dict:
    folder, reason = vendored_folder()
    if reason:
        return {"skipped": reason}
    models = [model for model in SHAPES if context.only in f"{model}_{SCALES_NAME}"]
    with fresh_triton_cache(), torch.no_grad():
        kernels = vendor_vllm.load(folder)
        cases = [bench_case(kernels, model) for model in models]
    vllm = {key: kernels.provenance[key] for key in ("kind", "version", "commit_id", "commit")
            if key in kernels.provenance}
    return {"vllm": vllm, "triton": kernels.triton_version, "cases": cases}


def vendored_folder() -> tuple:
    """(the folder GG_VLLM_SRC names, why the section cannot run or None)."""
    value = os.environ.get(ENV)
    if not value:
        return None, (f"{ENV} is not set: `python3 -m bench.vendor_vllm SOURCE` copies vLLM's "
                      f"kernels into .device/vllm, then `{ENV}=.device/vllm make bench`")
    folder = vendor_vllm.ROOT / Path(value)
    lacking = vendor_vllm.missing(folder)
    if lacking:
        return folder, (f"{ENV}={value}: {folder} lacks {', '.join(lacking)} (made by "
                        "`python3 -m bench.vendor_vllm SOURCE`)")
    if importlib.util.find_spec("triton") is None:
        return folder, "no Triton in this environment to run vLLM's kernels with"
    return folder, None


@contextlib.contextmanager
def fresh_triton_cache():
    """TRITON_CACHE_DIR a new empty folder within the block (removed after),
    so that vLLM's first calls compile its kernels."""
    before = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="gg-bench-triton-") as folder:
        os.environ["TRITON_CACHE_DIR"] = folder
        try:
            yield
        finally:
            if before is None:
                del os.environ["TRITON_CACHE_DIR"]
            else:
                os.environ["TRITON_CACHE_DIR"] = before


def bench_case(kernels, model: str) -> dict:
    """One model's experts, every token count; the weights freed after."""
    hidden, inter, experts, top_k = SHAPES[model]
    name = f"{model}_{SCALES_NAME}"
    weights = expert_weights(hidden, inter, experts, SCALES[SCALES_NAME], bf16=False)
    rows = [bench_tokens(kernels, f"{name}, T={tokens}", tokens, top_k, weights)
            for tokens in DECODE_TOKENS + PREFILL_TOKENS]
    del weights
    torch.cuda.empty_cache()
    return {"name": name, "model": model,
            "shape": {"H": hidden, "I": inter, "E": experts, "k": top_k}, "rows": rows}


def bench_tokens(kernels, name: str, tokens: int, top_k: int, weights: dict) -> dict:
    """Ours, vLLM's and vLLM's GEMMs alone on `tokens` random tokens, random
    top-k routing: first call, vLLM's checked against ours, all timed in turns,
    replayed from CUDA graphs at decode sizes."""
    w13, w2 = weights["w13"], weights["w2"]
    experts, _, hidden = w13.values.shape
    inter = w2.values.shape[2]
    x, topk_ids, topk_weights = routed_tokens(tokens, hidden, experts, top_k)
    chosen = vllm_moe.plan(kernels, experts, inter, top_k, tokens)
    refused = vllm_moe.refusal(hidden, inter)
    candidates = {
        "gg_fp8": lambda: gg_runtime.moe_experts(x, topk_ids, topk_weights, w13, w2)}
    if not refused:
        candidates["vllm_fp8"] = lambda: vllm_moe.fused_experts(
            kernels, chosen, x, topk_ids, topk_weights, w13.values, w2.values, w13.scales,
            w2.scales)
    first_call = {impl: first_call_ms(fn) for impl, fn in candidates.items()}
    if not refused:
        candidates["vllm_gemms"] = vllm_moe.gemms_alone(
            kernels, chosen, x, topk_ids, topk_weights, w13.values, w2.values, w13.scales,
            w2.scales)
    ref = candidates["gg_fp8"]().float()
    flops = 2 * tokens * top_k * 3 * hidden * inter
    runs = measure(candidates, lambda out: rel_error(summed(out), ref), TOLERANCE, flops,
                   graphs=tokens <= DECODE_MAX)
    runs.update({impl: {"error": refused} for impl in IMPLEMENTATIONS[1:] if refused})
    its_way = ({impl: benchmark_moe_ms(fn) for impl, fn in candidates.items()}
               if tokens <= DECODE_MAX else {})
    return {"name": name, "T": tokens, "touched_experts": topk_ids.unique().numel(),
            "runs": runs, "first_call_ms": first_call, "its_way_ms": its_way,
            "vs_vllm": ratio(runs, "gg_fp8", "vllm_fp8"),
            "vs_vllm_gemms": ratio(runs, "gg_fp8", "vllm_gemms"),
            "vllm_config": {"tuned": chosen.tuned, "source": chosen.source,
                            "naive": chosen.naive, "swap_ab": chosen.swap_ab, **chosen.config}}


def benchmark_moe_ms(fn) -> float | None:
    """fn's ms a call as vLLM's benchmark_moe.py times fused_moe: calls
    captured back to back in one CUDA graph, no L2 flush between them (so the
    experts' weights stay in L2 where they fit), the mean over every call of
    ITS_REPLAYS replays; the routing fixed (its script draws new gating for
    each replay).  None where fn cannot be captured."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(ITS_CALLS_A_GRAPH):
                fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total = 0.0
    for _ in range(ITS_REPLAYS):
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        total += start.elapsed_time(end)
    return total / (ITS_REPLAYS * ITS_CALLS_A_GRAPH)


def summed(out: torch.Tensor) -> torch.Tensor:
    """[T, H]: out, or the sum over k of vLLM's GEMMs' [T, k, H]."""
    return out.sum(1) if out.dim() == 3 else out


def report(data) -> list:
    if "skipped" in data:
        return [f"Not run: {data['skipped']}."]
    vllm = data["vllm"]
    release = f"vLLM {vllm.get('version', 'of unknown version')}"
    commit = vllm.get("commit") or vllm.get("commit_id")
    lines = [
        "Forward ms: `fp8`, moe_experts; `vLLM`, the Triton fused_moe_kernel and "
        f"per-token-group quantisation of {release} ({vllm['kind']}"
        f"{f', {commit}' if commit else ''}), run with Triton {data['triton']} around a host "
        "path written in torch "
        "as vLLM's fused_experts: slots aligned to the M tile by expert (vLLM's "
        "moe_align_block_size, a CUDA op in vLLM, is some ten torch launches here), SwiGLU and "
        "the top-k sum in torch, where vLLM has one CUDA op each. `vLLM GEMMs`: its two "
        "fused_moe_kernel launches alone, on the other steps' results: a lower bound for "
        "vLLM. Both on the same fp8 "
        "weights in 128 x 128 blocks, bf16 tokens, random top-k routing. "
        f"{timing_sentence(data)} The L2 cache is flushed before each call. x vLLM: vLLM's time "
        "/ ours. Its way: the decode rows timed again as vLLM's benchmark_moe.py times its "
        f"kernels, {ITS_CALLS_A_GRAPH} calls back to back in one CUDA graph, no flush between "
        "them (the weights stay in L2 where they fit), the mean a call. 1st: the first call "
        "on that token count, wall-clock, host included; vLLM's "
        "includes Triton compiling its kernels and their launchers for a new config (the "
        "Triton cache empty at the section's start). vLLM error: its relative "
        f"error against ours, within {TOLERANCE:.0e} before either is timed. vLLM config: its "
        "tuned config for this GPU and shape where vLLM has one (`tuned`), else its H200 file "
        "for the shape as a proxy (`H200 proxy`), else its default for block "
        "fp8 (M x N x K tiles, warps, stages); naive: one M tile per slot, no alignment "
        "(vLLM's choice where T * k * 4 <= E); swap AB: its kernel's transposed product."]
    for case in data["cases"]:
        shape = ", ".join(f"{axis} {value}" for axis, value in case["shape"].items())
        lines += ["", f"{case['model']} ({shape}):", ""]
        lines += table(COLUMNS, [row_cells(row) for row in case["rows"]])
    return lines + not_timed([row for case in data["cases"] for row in case["rows"]])


def timing_sentence(data) -> str:
    """How the rows were timed: decode rows from CUDA graphs, or (a run from
    before they were) every row eagerly."""
    rows = [row for case in data["cases"] for row in case["rows"]]
    if any("graph" in run for row in rows for run in row["runs"].values()):
        return (f"Rows of at most {DECODE_MAX} tokens are timed replayed from CUDA graphs on "
                "every side, as vLLM serves decode steps (`graphs`: which sides were captured: "
                "fp8, vLLM, GEMMs), the others eagerly.")
    return ("Every row was timed eagerly, on both sides: vLLM serves decode steps replayed "
            "from CUDA graphs, so its decode rows here include launch costs it does not pay.")


def row_cells(row: dict) -> list:
    runs = [row["runs"].get(impl, {}) for impl in IMPLEMENTATIONS]
    first = [row["first_call_ms"].get(impl) for impl in IMPLEMENTATIONS[:2]]
    error = row["runs"].get("vllm_fp8", {}).get("rel_error")
    graphs = ("/".join("yes" if run.get("graph") else "no" for run in runs)
              if any("graph" in run for run in runs) else "eager")
    its_way = row.get("its_way_ms", {})
    ours, vllm = its_way.get("gg_fp8"), its_way.get("vllm_fp8")
    return [row["T"], row["touched_experts"], *(fmt(run.get("ms"), "{:.3f}") for run in runs),
            fmt(row["vs_vllm"]), fmt(row.get("vs_vllm_gemms")), graphs,
            fmt(ours, "{:.3f}"), fmt(vllm, "{:.3f}"), fmt(ours and vllm and vllm / ours),
            *(fmt(t, "{:.1f}") for t in first), fmt(error, "{:.1e}"),
            config_cell(row["vllm_config"])]


def config_cell(config: dict) -> str:
    """vLLM's config in a few words: tuned or default, tiles, warps, stages."""
    tiles = "x".join(str(config[f"BLOCK_SIZE_{axis}"]) for axis in "MNK")
    words = [config.get("source", "tuned" if config["tuned"] else "default"), tiles,
             f"{config['num_warps']}w/{config['num_stages']}s"]
    return ", ".join(words + ["naive"] * config["naive"] + ["swap AB"] * config["swap_ab"])
