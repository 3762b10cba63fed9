"""GPU time of a call: the median of CUDA-event timings with the L2 cache
flushed before each, alone or in turns with the calls it is compared to."""
from __future__ import annotations

import statistics

import torch

_flush = None  # 256 MiB zeroed before each timed call: more than any GPU's L2


def flush_l2() -> None:
    """Evict the L2 cache: 256 MiB zeroed (an int32 fill kernel), more than
    any GPU's L2, so that the next call reads its operands from memory."""
    global _flush
    if _flush is None:
        _flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    _flush.zero_()


def time_in_turns(fns: dict, turns: int = 5) -> dict:
    """{name: median ms} of each fn over `turns` turns of time_ms, all the
    fns timed in each turn, in reverse order every other turn: the GPU's clock
    drifts within a run, and this spreads the drift over all of them alike."""
    times = {name: [] for name in fns}
    for turn in range(turns):
        for name in (list(fns) if turn % 2 == 0 else list(reversed(fns))):
            times[name].append(time_ms(fns[name]))
    return {name: statistics.median(values) for name, values in times.items()}


def time_ms(fn, warmup_ms=25.0, rep_ms=100.0) -> float:
    """Median ms of fn() over about rep_ms of repetitions, CUDA events around
    each, the L2 cache flushed before each."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    times = []
    for _ in range(max(10, min(1000, int(rep_ms / estimate)))):
        flush_l2()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
