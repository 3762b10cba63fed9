"""Where the split decode forward's time goes: the wheel's kernel
(aot/kernels/experts_decode_split.py), JIT-compiled with some of its helpers
replaced, each forward replayed from a CUDA graph (the counters' memset in
it) with the L2 flushed, µs, in turns.  Phases:

    full      the kernel as the wheel has it;
    no_wait   down tickets do not wait for h (a wrong output: the cost of
              the wait and of what it orders);
    polite    the wait polls with ld.acquire and a nanosleep between polls
              (not an atomic on the counters' line);
    up_only   down tickets do nothing;
    down_only up tickets only arrive (no weights read), down tickets do not
              wait;
    tickets   neither reads anything: the launch and the tickets.

Each variant is a new JITFunction made after its helpers are replaced in the
kernel's module, with the module's functions' memoized hashes dropped and a
Triton cache directory of its own, so that no cache hands it another's
binary.  The grid is the probe's estimate of the resident wave from the
JIT build's registers and shared memory (the wheel's build may fit more).
--splits: the full kernel and up_only with each unit's H in more parts
than the runtime's rule gives; --stages: the up tickets' K stages.  Run
from build/ with the wheel on PYTHONPATH
(docs/notes/2026-11-30-fp8-decode-split-down-steps.md):

    python -m lab.decode_split_phases_probe [--splits] [--stages N]
"""
from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

import aot.kernels.experts_decode_split as split_module
from aot.kernels.experts_decode import CHUNK_COLUMNS
from aot.kernels.glu import CONCATENATED
from aot.kernels.scaled import BLOCKWISE
import gg_runtime
from bench.measure import graphed
from gg_runtime.testing import rel_error, time_in_turns
from lab.decode_split_probe import make_case

# shape, the runtime's splits, BN, warps; more splits to try (--splits).
SHAPES = {"deepseek_v3_tp16": ((7168, 128, 256, 8), 14, 32, 8, (28, 56)),
          "deepseek_v3_tp8": ((7168, 256, 256, 8), 14, 32, 8, (28,)),
          "qwen3_30b_a3b_tp2": ((2048, 384, 128, 8), 4, 8, 8, (8, 16)),
          "qwen3_30b_a3b_tp4": ((2048, 192, 128, 8), 4, 16, 4, (8, 16))}
UNSPECIALIZED = ["k", "has_b13", "has_b2", "activation", "T", "G", "splits"]
ORIGINAL = {name: getattr(split_module, name) for name in ("wait_for_every_h", "up_part",
                                                            "down_rows")}


@triton.jit
def no_wait(counters_ptr, units):
    tl.debug_barrier()


@triton.jit
def polite_wait(counters_ptr, units):
    done = tl.inline_asm_elementwise("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l",
                                     [counters_ptr + 1], dtype=tl.int32, is_pure=False, pack=1)
    while done < units:
        tl.inline_asm_elementwise("nanosleep.u32 64; mov.u32 $0, $1;", "=r,r", [units],
                                  dtype=tl.int32, is_pure=False, pack=1)
        done = tl.inline_asm_elementwise("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l",
                                         [counters_ptr + 1], dtype=tl.int32, is_pure=False,
                                         pack=1)
    tl.debug_barrier()


@triton.jit
def arrive_only(ticket, tokens, w13, biases, scratch, H, N, G, splits, units,
                SCALING: tl.constexpr, GLU: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    gu_ptr, h_ptr, h_scale_ptr, counters_ptr = scratch
    unit = ticket // splits
    tl.debug_barrier()
    arrived = tl.atomic_add(counters_ptr + 2 + unit, 1, sem="acq_rel", scope="gpu")
    if arrived == splits - 1:
        tl.atomic_add(counters_ptr + 1, 1, sem="release", scope="gpu")


@triton.jit
def no_down(d, routing, w2, biases, scratch, out_ptr, H, inter, G, w2_group_stride, ld2, units,
            SCALING: tl.constexpr, BN: tl.constexpr):
    pass


PHASES = {"full": {}, "no_wait": {"wait_for_every_h": no_wait},
          "polite": {"wait_for_every_h": polite_wait}, "up_only": {"down_rows": no_down},
          "down_only": {"up_part": arrive_only, "wait_for_every_h": no_wait},
          "tickets": {"up_part": arrive_only, "down_rows": no_down}}


def kernel_for(phase: str):
    """A fresh JITFunction of the wheel's kernel with `phase`'s helpers."""
    for name, fn in {**ORIGINAL, **PHASES[phase]}.items():
        setattr(split_module, name, fn)
    for value in vars(split_module).values():
        if isinstance(value, triton.JITFunction):
            value.hash = None
    os.environ["TRITON_CACHE_DIR"] = f"/tmp/triton_cache_{phase}"
    return triton.JITFunction(split_module.scaled_decode_split_kernel.fn,
                              do_not_specialize=UNSPECIALIZED)


def forward(kernel, case, splits, bn, warps, stages=3):
    """The kernel over the case as the runtime launches it (scratch, counters
    zeroed, the grid capped at the resident wave), as a closure."""
    x, ids, weights = case["x"], case["topk_ids"].reshape(-1), case["topk_weights"]
    (w13, w13_scale, _), (w2, w2_scale, _) = case["w13"], case["w2"]
    T, H = x.shape
    E, N, _ = w13.shape
    k = case["topk_ids"].shape[1]
    units = T * k * triton.cdiv(N // 2, CHUNK_COLUMNS.value)
    gu = torch.empty(splits, units, 256, device="cuda")
    h = torch.empty(units, 128, device="cuda", dtype=torch.float8_e4m3fn)
    h_scale = torch.empty(units, device="cuda")
    counters = torch.zeros(2 + units, device="cuda", dtype=torch.int32)
    out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
    tickets = units * splits + T * triton.cdiv(H, bn)
    args = (x, x, x, ids, weights, k, w13, w13_scale, w2, w2_scale, x, 0, x, 0, 0, gu, h, h_scale,
            counters, out, T, H, N, E, splits, w13.stride(0), w13.stride(1), w2.stride(0),
            w2.stride(1))
    options = dict(SCALING=BLOCKWISE, GLU=CONCATENATED, USE_TMA=True, BM=16, BN=bn, BK=128,
                   CHUNK=128, PRECISION=0, num_warps=warps, num_stages=stages)
    compiled = kernel.warmup(*args, **options, grid=(1,))
    compiled._init_handles()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    by_registers = 65536 // (max(compiled.n_regs, 1) * 32 * warps)
    by_shared = (228 * 1024) // (compiled.metadata.shared + 1024)
    grid = (min(tickets, sms * max(1, min(by_registers, by_shared))),)
    print(f"  splits {splits}, {tickets} tickets, {grid[0]} programs", flush=True)

    def run():
        counters.zero_()
        kernel[grid](*args, **options)
        return out
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", action="store_true",
                        help="the full kernel and up_only at more splits, not the phases")
    parser.add_argument("--stages", type=int, default=3, help="the up tickets' K stages")
    args = parser.parse_args()
    more_splits = args.splits
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    for name, (shape, splits, bn, warps, more) in SHAPES.items():
        torch.manual_seed(0)
        case = make_case(*shape, 1)
        want = gg_runtime.moe_experts(**case).float()
        runs, errors = {}, {}
        tries = [(phase, p, f"{phase}/{p}") for phase in ("full", "up_only")
                 for p in (splits, *more)] if more_splits else \
            [(phase, splits, phase) for phase in PHASES]
        for phase, parts, label in tries:
            run = forward(kernel_for(phase), case, parts, bn, warps, args.stages)
            errors[label] = rel_error(run().float(), want)
            runs[label] = graphed(run)
        runs["wheel"] = graphed(lambda: gg_runtime.moe_experts(**case))
        times = time_in_turns(runs)
        print(name, " | ".join(f"{p} {1e3 * t:.1f}" for p, t in times.items()),
              "| errors", " ".join(f"{p} {e:.0e}" for p, e in errors.items()), flush=True)


if __name__ == "__main__":
    main()
