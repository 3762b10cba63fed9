"""What the sections share to measure: this GPU's ceilings, candidates checked
against a reference and then timed in turns, and peak memory."""
from __future__ import annotations

import torch

from gg_runtime.testing import time_in_turns, time_ms

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def ceilings() -> dict:
    """Dense bf16 matmul rate and device-to-device copy bandwidth, measured now."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    matmul_ms = time_ms(lambda: a @ b)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src))
    return {"matmul_tflops": 2 * n ** 3 / matmul_ms / 1e9,
            "copy_tbps": 2 * src.numel() / copy_ms / 1e9}


def measure(candidates: dict, check, tolerance: float, flops: int, settle: bool = False,
            graphs: bool = False) -> dict:
    """name -> {ms, tflops, rel_error} for each candidate whose result passes
    check (relative error) within tolerance, else {error}: an anchor that
    cannot run a case, or gets it wrong, is reported, not fatal.  Two or more
    candidates are timed in turns (gg_runtime.testing.time_in_turns); where
    `settle`, the turns are repeated until two in a row agree (settled_times).
    Where `graphs`, each is timed replayed from a CUDA graph where it can be
    captured (graphed; `graph` says whether it was)."""
    runs, passing = {}, {}
    for name, fn in candidates.items():
        try:
            error = check(fn())
        except Exception as exc:
            runs[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        if error > tolerance:
            runs[name] = {"error": f"wrong result: relative error {error:.2e}"}
            continue
        runs[name] = {"rel_error": error}
        replay = graphed(fn) if graphs else None
        if graphs:
            runs[name]["graph"] = replay is not None
        passing[name] = replay or fn
    turns = 5 if len(passing) > 1 else 1
    times = settled_times(passing, turns) if settle else time_in_turns(passing, turns)
    for name, ms in times.items():
        runs[name].update(ms=ms, tflops=flops / ms / 1e9)
    return runs


def graphed(fn, stream=None):
    """A replay of a CUDA graph that captured a call of fn (after one call
    outside it), or None where fn cannot be captured: how a server runs a
    decode step, its GPU time without the host's launches in it.  The
    replay holds fn, and so whatever buffers fn's closure made outside the
    capture: the graph reads and writes them.  `stream`: the stream the
    capture runs on (None: torch's capture stream); a green context's keeps
    the graph's kernels on that context's SMs."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return None

    def replay():
        graph.replay()
        return fn
    return replay


# settled_times: how closely two runs of turns must agree, and how many runs at most.
SETTLED_WITHIN = 0.03
SETTLE_ATTEMPTS = 4


def settled_times(fns: dict, turns: int) -> dict:
    """time_in_turns, repeated until two runs in a row agree within
    SETTLED_WITHIN (relative) for every fn, or SETTLE_ATTEMPTS runs: the last.  Some
    GPU times run slow for a while after the inputs are made (seen on
    decode-sized fp8 forwards right after a model's weights, the SM clock
    steady, cause not found); one run's median of turns then takes the slow
    ones for the steady time."""
    times = time_in_turns(fns, turns)
    for _ in range(SETTLE_ATTEMPTS - 1):
        again = time_in_turns(fns, turns)
        if all(abs(again[name] / times[name] - 1) <= SETTLED_WITHIN for name in fns):
            return again
        times = again
    return times


def ratio(runs: dict, faster: str, slower: str):
    """runs[slower]'s ms / runs[faster]'s: how many times faster `faster` ran;
    None where either did not run."""
    ours, theirs = (runs.get(name, {}).get("ms") for name in (faster, slower))
    return theirs / ours if ours and theirs else None


def peak_gb(fn) -> float:
    """GB allocated at the peak of fn() above what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 1e9
