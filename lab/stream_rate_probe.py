"""How fast a few programs stream fp8 weights from DRAM, by how a program's
bytes lie: the decode kernels' units at T = 1 are few (24 on Qwen3-30B-A3B's
TP2 shard, a program an SM), and each unit's program reads its weights at
about 25-30 GB/s (docs/notes/2026-11-29-fp8-decode-units-split-over-h.md).
A JIT-compiled kernel where each of P programs reads its own slab and sums
its bytes (nothing else), timed replayed with the L2 flushed:

- `rows`: the slab is R rows of a row-major [*, H] weight, read in boxes
  [BR, BC] (BC bytes of BR rows a step), as the decode kernels read w13;
- `tiled`: the same bytes laid out box after box (a box's bytes contiguous),
  as a weight pre-arranged at load would be;
- `pointers`: the `rows` slab by 16-byte pointer loads (Triton's cp.async
  pipeline) in [BR, BC] steps.

    PYTHONPATH=<wheel>:. python -m lab.stream_rate_probe [--programs P ...]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from gg_runtime.testing import time_ms

# (R rows a slab, H bytes a row): Qwen3's unit (256 rows of H 2048) and
# DeepSeek-V3's (256 rows of H 7168).
SLABS = ((256, 2048), (256, 7168))
# (BR, BC): boxes of BR rows, BC bytes a row.
BOXES = ((128, 128), (64, 256), (256, 128))
STAGES = (3, 4, 6)


@triton.jit
def rows_kernel(w_ptr, out_ptr, R, H, BR: tl.constexpr, BC: tl.constexpr,
                STAGES: tl.constexpr, TILED: tl.constexpr):
    pid = tl.program_id(0)
    steps_k = H // BC
    if TILED:
        # the slab as boxes one after another: [R * H / (BR * BC) * BR, BC]
        desc = tl.make_tensor_descriptor(w_ptr, [tl.num_programs(0) * R * steps_k, BC], [BC, 1],
                                         [BR, BC])
    else:
        desc = tl.make_tensor_descriptor(w_ptr, [tl.num_programs(0) * R, H], [H, 1], [BR, BC])
    acc = tl.zeros([BR, BC], dtype=tl.int32)
    steps = (R // BR) * steps_k
    for i in tl.range(0, steps, num_stages=STAGES):
        if TILED:
            box = desc.load([(pid * steps + i) * BR, 0])
        else:
            box = desc.load([pid * R + (i // steps_k) * BR, (i % steps_k) * BC])
        acc += box.to(tl.int32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def pointers_kernel(w_ptr, out_ptr, R, H, BR: tl.constexpr, BC: tl.constexpr,
                    STAGES: tl.constexpr):
    pid = tl.program_id(0)
    steps_k = H // BC
    rows = tl.arange(0, BR)
    cols = tl.max_contiguous(tl.multiple_of(tl.arange(0, BC), 16), 16)
    acc = tl.zeros([BR, BC], dtype=tl.int32)
    base = w_ptr + pid.to(tl.int64) * R * H
    for i in tl.range(0, (R // BR) * steps_k, num_stages=STAGES):
        at = base + ((i // steps_k) * BR + rows[:, None]) * H + (i % steps_k) * BC + cols[None, :]
        acc += tl.load(at).to(tl.int32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, 1), 0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, nargs="*", default=[24, 48, 132, 264])
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    for rows, hidden in SLABS:
        for programs in args.programs:
            w = torch.randint(0, 127, (programs * rows, hidden), dtype=torch.uint8, device="cuda")
            out = torch.empty(programs, dtype=torch.int32, device="cuda")
            expected = w.view(programs, -1).int().sum(1)
            found = {}
            for br, bc in BOXES:
                for stages in STAGES:
                    runs = {"rows": lambda: rows_kernel[(programs,)](
                                w, out, rows, hidden, br, bc, stages, False),
                            "tiled": lambda: rows_kernel[(programs,)](
                                w, out, rows, hidden, br, bc, stages, True),
                            "pointers": lambda: pointers_kernel[(programs,)](
                                w, out, rows, hidden, br, bc, stages)}
                    for layout, run in runs.items():
                        out.fill_(-1)
                        run()
                        assert torch.equal(out, expected), (layout, br, bc, stages)
                        found[f"{layout} {br}x{bc} s{stages}"] = time_ms(run) * 1e3
            per_program = rows * hidden / 1e3  # KB
            print(f"\nslab {rows} x {hidden} ({per_program:.0f} KB) x {programs} programs:")
            for label, us in sorted(found.items(), key=lambda item: item[1]):
                print(f"  {label:24s} {us:7.1f} µs  {per_program / us:6.1f} GB/s a program  "
                      f"{programs * per_program / us / 1e3:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
