"""Where a program of the warp-specialised fp8 decode kernel spends its time
(aot/kernels/experts_decode_ws.py, scaled_experts_decode's `few_units`
kernel): the kernel with %globaltimer read at its phases, each program's
stamps stored, on the vllm_fp8 section's shapes (128 x 128 blocks, bf16
tokens, random routing), JIT-compiled by the host's Triton (at the family's
config and register count), replayed from a CUDA graph with the L2 flushed.

Stamps a program (ns), in order: entry; descriptors made; the MMA
partition's slot groups; its unit located; its first ring slot ready; its
up projection done; h stored; its down projection done; its end; the
loader's slot groups; the loader's last unit issued; its end; the MMA
partition's waits for slots in the up and in the down projection (sums);
the quantizer's slot groups, its last unit done and its end.  Printed: each
phase's median and largest span over the programs that had a unit, the
programs' start skew, the kernel's span (first entry to last end), the
graph replay's time as bench/ times it (events around a replay, L2 flushed)
and that of a graph of one empty kernel (the measurement's floor).
DRAIN (--drains): 0 the kernel's work; 1 the MMA partition only takes and
frees the slots (the producers' rate alone; a wrong output); 2 and 3 the
down projection a box at a time, with or without its stores
(down_projection_timed).

The kernel before its quantizer partition (the tokens quantized by the MMA
partition), and this probe's modes that took parts of that work away, are
at commit 81264f3 (lab/decode_timeline_probe.py); the note
docs/notes/2026-11-30-fp8-decode-tokens-quantized-beside-the-mmas.md has
what they measured.

    cd build && TRITON_ALWAYS_COMPILE=1 PYTHONPATH=<wheel>:.. \
        python -m lab.decode_timeline_probe [--filter NAME] [--tokens T ...]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                               warpgroup_mma, warpgroup_mma_wait)

import aot.kernels.experts_decode_ws as ws
from aot.families.scaled_experts_decode import CONFIGS
from aot.kernels.glu import CONCATENATED
from aot.kernels.scaled import BLOCKWISE, SCALE_BLOCK
from aot.kernels.ws import GATHER_WARPS, accumulator_layout, max_registers
from bench.measure import graphed
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_ms
from lab.decode_split_probe import SHAPES, make_case

(FEW_UNITS,) = [c for c in CONFIGS if c.ws]  # the warp-specialised kernel's config
MARKS = gl.constexpr(17)
PHASES = (("descriptors", 0, 1), ("mma: slot groups", 1, 2), ("mma: locate", 2, 3),
          ("mma: first slot", 3, 4), ("mma: rest of up", 4, 5), ("mma: h", 5, 6),
          ("mma: down", 6, 7), ("mma: to its end", 7, 8), ("loader: slot groups", 1, 9),
          ("loader: issue", 9, 10), ("quantizer: slot groups", 1, 14),
          ("quantizer: its steps", 14, 15), ("entry to mma end", 0, 8))


@gluon.jit
def now():
    """%globaltimer (ns), a [32] tensor of one value."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    lane = gl.arange(0, 32, layout)
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [lane],
                                     dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def store_mark(stamps_ptr, mark: gl.constexpr, value):
    """value (now()'s shape) into stamps[program, mark] (one lane stores)."""
    lane = gl.arange(0, 32, value.type.layout)
    gl.store(stamps_ptr + gl.program_id(0) * MARKS + mark + lane * 0, value, mask=lane == 0)


@gluon.jit
def stamp(stamps_ptr, mark: gl.constexpr):
    """%globaltimer into stamps[program, mark]."""
    store_mark(stamps_ptr, mark, now())


@gluon.jit
def up_projection_timed(boxes, x_bufs, x_scales, ready, empty, count, w_scales, j_ok, H,
                        stamps_ptr, BK: gl.constexpr, STAGES: gl.constexpr,
                        DRAIN: gl.constexpr, acc_layout: gl.constexpr):
    """ws.up_projection (BLOCKWISE) with mark 4 once the first slot is
    ready and mark 12 the ns it waited for slots; DRAIN: the slots only
    waited for and freed."""
    BM: gl.constexpr = x_bufs.shape[1]
    SUB: gl.constexpr = BK // SCALE_BLOCK
    columns: gl.constexpr = gl.SliceLayout(0, acc_layout)
    gate = gl.zeros([ws.CHUNK_COLUMNS, BM], gl.float32, acc_layout)
    up = gl.zeros([ws.CHUNK_COLUMNS, BM], gl.float32, acc_layout)
    waited = now() * 0
    for k0 in range(0, H, BK):
        slot = count % STAGES
        before = now()
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        waited += now() - before
        if k0 == 0:
            stamp(stamps_ptr, 4)
        for sub in gl.static_range(SUB * (DRAIN != 1)):
            x = x_bufs.index(slot * SUB + sub).permute((1, 0))
            block = k0 // SCALE_BLOCK + sub
            live = block * SCALE_BLOCK < H
            gate_scale = gl.load(w_scales[0] + block, mask=j_ok & live, other=0.0)
            up_scale = gl.load(w_scales[1] + block, mask=j_ok & live, other=0.0)
            x_scale = gl.expand_dims(x_scales.index(slot * SUB + sub).load(columns), 0)
            gate_step = warpgroup_mma(boxes.index(2 * slot * SUB + sub), x, gate, use_acc=False,
                                      is_async=True)
            up_step = warpgroup_mma(boxes.index((2 * slot + 1) * SUB + sub), x, up,
                                    use_acc=False, is_async=True)
            gate_step, up_step = warpgroup_mma_wait(0, deps=(gate_step, up_step))
            gate += gate_step * x_scale * gl.expand_dims(gate_scale, 1)
            up += up_step * x_scale * gl.expand_dims(up_scale, 1)
        mbarrier.arrive(empty.index(slot))
        count += 1
    store_mark(stamps_ptr, 12, waited)
    return gate, up, count


@gluon.jit
def down_projection_timed(w2_boxes, h_buf, ready, empty, count, w2_scale_ptr, h_scale, parts,
                          row_ok, g, column, chunks, H, stamps_ptr, SUB: gl.constexpr,
                          STAGES: gl.constexpr, DRAIN: gl.constexpr,
                          acc_layout: gl.constexpr):
    """ws.down_projection (BLOCKWISE, no b2) with mark 13 the ns it waited
    for slots.  DRAIN: 0, as the kernel (a slot's two boxes' MMAs issued
    before the first's part is stored, which overlaps the second's MMA); 1,
    as up_projection_timed's; 2, a box at a time (the kernel before
    5d4a2d3); 3, as 2 without stores (each box's part summed in registers,
    the sum stored once: a wrong output)."""
    BN: gl.constexpr = w2_boxes.shape[1]
    BM: gl.constexpr = h_buf.shape[1]
    g64 = g.to(gl.int64)
    acc = gl.zeros([BN, BM], gl.float32, acc_layout)
    column_scale = gl.expand_dims(h_scale, 0)
    h_blocks = (H + SCALE_BLOCK - 1) // SCALE_BLOCK
    waited = now() * 0
    total = gl.zeros([BN, BM], gl.float32, acc_layout)
    for n0 in range(0, H, BN * SUB):
        slot = count % STAGES
        before = now()
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        waited += now() - before
        if DRAIN == 2 or DRAIN == 3:
            for part in gl.static_range(SUB):
                ns = n0 + part * BN + gl.arange(0, BN, gl.SliceLayout(1, acc_layout))
                n_ok = ns < H
                at = (g64 * h_blocks + ns // SCALE_BLOCK) * chunks + column
                row_scale = gl.expand_dims(gl.load(w2_scale_ptr + at, mask=n_ok, other=0.0), 1)
                acc = warpgroup_mma(w2_boxes.index(slot * SUB + part), h_buf, acc,
                                    use_acc=False, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc, ))
                if DRAIN == 2:
                    gl.store(parts + gl.expand_dims(ns, 1), acc * column_scale * row_scale,
                             mask=gl.expand_dims(n_ok, 1) & gl.expand_dims(row_ok, 0))
                else:
                    total += acc * column_scale * row_scale
        elif DRAIN == 0:
            ns0 = n0 + gl.arange(0, BN, gl.SliceLayout(1, acc_layout))
            ns1 = ns0 + BN
            scale0 = gl.load(w2_scale_ptr + (g64 * h_blocks + ns0 // SCALE_BLOCK) * chunks + column,
                             mask=ns0 < H, other=0.0)
            scale1 = gl.load(w2_scale_ptr + (g64 * h_blocks + ns1 // SCALE_BLOCK) * chunks + column,
                             mask=ns1 < H, other=0.0)
            acc0 = warpgroup_mma(w2_boxes.index(slot * SUB), h_buf, acc, use_acc=False,
                                 is_async=True)
            acc1 = warpgroup_mma(w2_boxes.index(slot * SUB + 1), h_buf, acc, use_acc=False,
                                 is_async=True)
            acc0 = warpgroup_mma_wait(1, deps=(acc0, ))
            gl.store(parts + gl.expand_dims(ns0, 1),
                     acc0 * column_scale * gl.expand_dims(scale0, 1),
                     mask=gl.expand_dims(ns0 < H, 1) & gl.expand_dims(row_ok, 0))
            acc1 = warpgroup_mma_wait(0, deps=(acc1, ))
            gl.store(parts + gl.expand_dims(ns1, 1),
                     acc1 * column_scale * gl.expand_dims(scale1, 1),
                     mask=gl.expand_dims(ns1 < H, 1) & gl.expand_dims(row_ok, 0))
        mbarrier.arrive(empty.index(slot))
        count += 1
    if DRAIN == 3:
        gl.store(parts + gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(1, acc_layout)), 1),
                 total, mask=gl.expand_dims(row_ok, 0))
    store_mark(stamps_ptr, 13, waited)
    return count


@gluon.jit
def run_unit_timed(work, count, t, groups, stamps_ptr, BM: gl.constexpr, BK: gl.constexpr,
                   STAGES: gl.constexpr, DRAIN: gl.constexpr):
    """ws.run_unit (BLOCKWISE, CONCATENATED, no biases) with marks 3, 5, 6
    and 7."""
    bufs, ready, empty, scales, biases, tokens, parts_ptr, chunks, H, inter = work
    boxes, w2_boxes, x_bufs, x_scales, h_buf = bufs
    w13_scale_ptr, w2_scale_ptr = scales
    acc_layout: gl.constexpr = accumulator_layout(BM, gl.num_warps(), 8)
    g, slots, row_ok, column = ws.locate_unit(t, groups, chunks, BM,
                                              gl.SliceLayout(0, acc_layout))
    first = column * ws.CHUNK_COLUMNS
    j = first + gl.arange(0, ws.CHUNK_COLUMNS, gl.SliceLayout(1, acc_layout))
    j_ok = j < inter
    k_blocks = (H + SCALE_BLOCK - 1) // SCALE_BLOCK
    row_blocks = g.to(gl.int64) * ((2 * inter + SCALE_BLOCK - 1) // SCALE_BLOCK)
    w_scales = (
        w13_scale_ptr + (row_blocks + ws.w13_rows(j, 0, inter, CONCATENATED) // SCALE_BLOCK)
        * k_blocks,
        w13_scale_ptr + (row_blocks + ws.w13_rows(j, 1, inter, CONCATENATED) // SCALE_BLOCK)
        * k_blocks)
    stamp(stamps_ptr, 3)
    gate, up, count = up_projection_timed(boxes, x_bufs, x_scales, ready, empty, count, w_scales,
                                          j_ok, H, stamps_ptr, BK, STAGES, DRAIN, acc_layout)
    stamp(stamps_ptr, 5)
    h, h_scale = ws.unit_h(gate, up, w13_scale_ptr, biases, g, first, inter, 1.0, BLOCKWISE,
                           CONCATENATED)
    h_buf.store(h)
    fence_async_shared()
    stamp(stamps_ptr, 6)
    parts = gl.expand_dims(parts_ptr + (slots.to(gl.int64) * chunks + column) * H, 0)
    count = down_projection_timed(w2_boxes, h_buf, ready, empty, count, w2_scale_ptr, h_scale,
                                  parts, row_ok, g, column, chunks, H, stamps_ptr,
                                  BK // SCALE_BLOCK, STAGES, DRAIN, acc_layout)
    stamp(stamps_ptr, 7)
    return count


@gluon.jit
def mma_timed(walk, work, stamps_ptr, BM: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
              DRAIN: gl.constexpr):
    """ws.mma_partition with marks 2 and 8 (3-7: its last unit's)."""
    ids_ptr, S, G, chunks = walk
    groups = ws.slot_groups(ids_ptr, S, G, chunks, BM)
    stamp(stamps_ptr, 2)
    count = 0
    for t in range(gl.program_id(0), gl.sum(groups[2], 0), gl.num_programs(0)):
        count = run_unit_timed(work, count, t, groups, stamps_ptr, BM, BK, STAGES, DRAIN)
    stamp(stamps_ptr, 8)


@gluon.jit
def producer_timed(walk, work, stamps_ptr, visit: gl.constexpr, first: gl.constexpr,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """A producer partition (visit: ws.load_unit or ws.quantize_unit) with
    marks `first` (its slot groups), first + 1 (its last unit's steps done)
    and first + 2 (its end)."""
    ids_ptr, S, G, chunks = walk
    groups = ws.slot_groups(ids_ptr, S, G, chunks, BM)
    stamp(stamps_ptr, first)
    count = 0
    for t in range(gl.program_id(0), gl.sum(groups[2], 0), gl.num_programs(0)):
        count = visit(work, count, t, groups, BLOCKWISE, CONCATENATED, BM, BN, BK, STAGES)
        stamp(stamps_ptr, first + 1)
    stamp(stamps_ptr, first + 2)


@gluon.jit
def loader_timed(walk, work, stamps_ptr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                 STAGES: gl.constexpr):
    """The loader: marks 9, 10, 11."""
    producer_timed(walk, work, stamps_ptr, ws.load_unit, 9, BM, BN, BK, STAGES)


@gluon.jit
def quantizer_timed(walk, work, stamps_ptr, BM: gl.constexpr, BN: gl.constexpr,
                    BK: gl.constexpr, STAGES: gl.constexpr):
    """The quantizer: marks 14, 15 (its last unit's steps) and 16."""
    producer_timed(walk, work, stamps_ptr, ws.quantize_unit, 14, BM, BN, BK, STAGES)


@gluon.jit
def decode_timed_kernel(x_ptr, xq_ptr, x_scale_ptr, ids_ptr, k, w13_ptr, w13_scale_ptr, w2_ptr,
                        w2_scale_ptr, b13_ptr, has_b13, b2_ptr, has_b2, activation, parts_ptr, S,
                        H, N, G, w13_group_stride, ld13, w2_group_stride, ld2, stamps_ptr,
                        BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                        STAGES: gl.constexpr, DRAIN: gl.constexpr):
    """ws.scaled_experts_decode_ws_kernel (BLOCKWISE, CONCATENATED) with marks
    0 and 1 around its descriptors."""
    stamp(stamps_ptr, 0)
    inter = N // 2
    chunks = (inter + ws.CHUNK_COLUMNS - 1) // ws.CHUNK_COLUMNS
    w13_desc, w2_desc = ws.weight_descriptors(w13_ptr, w2_ptr, G, inter, H, w13_group_stride,
                                              ld13, w2_group_stride, ld2, CONCATENATED, BN)
    stamp(stamps_ptr, 1)
    bufs, ready, empty = ws.ring(w13_ptr.dtype.element_ty, BLOCKWISE, BM, BN, BK, STAGES)
    boxes, w2_boxes, x_bufs, x_scales, h_buf = bufs
    walk = (ids_ptr, S, G, chunks)
    tokens = (x_ptr, x_scale_ptr, k)
    mma_work = (bufs, ready, empty, (w13_scale_ptr, w2_scale_ptr), (b13_ptr, has_b13, activation),
                tokens, parts_ptr, chunks, H, inter)
    load_work = ((w13_desc, w2_desc), (boxes, w2_boxes, x_bufs), ready, empty, tokens, chunks,
                 H)
    gl.warp_specialize(
        [(mma_timed, (walk, mma_work, stamps_ptr, BM, BK, STAGES, DRAIN)),
         (loader_timed, (walk, load_work, stamps_ptr, BM, BN, BK, STAGES)),
         (quantizer_timed, (walk, (x_bufs, x_scales, ready, empty, tokens, chunks, H),
                            stamps_ptr, BM, BN, BK, STAGES))],
        [GATHER_WARPS, ws.QUANTIZER_WARPS], [ws.LOADER_REGISTERS, ws.QUANTIZER_REGISTERS])


@triton.jit
def nothing_kernel(x_ptr):
    """An empty kernel: a graph of it times the measurement's floor."""
    if tl.program_id(0) < 0:
        tl.store(x_ptr, 0)


def launcher(case, stamps=None, drain=0):
    """(fn() running the decode kernel on case's call at the family's
    few-unit config, the parts it writes): the wheel's kernel, or with
    stamps, decode_timed_kernel (DRAIN drain)."""
    w13, w2, ids = case["w13"], case["w2"], case["topk_ids"]
    experts, n, hidden = w13.values.shape
    slots, k = ids.numel(), ids.shape[1]
    parts = torch.empty(slots, triton.cdiv(n // 2, SCALE_BLOCK), hidden, device="cuda")
    units = (triton.cdiv(slots, FEW_UNITS.BM) + min(slots, experts)) * triton.cdiv(n, FEW_UNITS.BN)
    grid = (min(units, torch.cuda.get_device_properties(0).multi_processor_count),)
    flat_ids = ids.flatten().contiguous()
    bias = torch.empty(1, dtype=torch.bfloat16, device="cuda")
    args = (case["x"], w13.values, w13.scales, flat_ids, k, w13.values, w13.scales, w2.values,
            w2.scales, bias, 0, bias, 0, 0, parts, slots, hidden, n, experts,
            w13.values.stride(0), w13.values.stride(1), w2.values.stride(0), w2.values.stride(1))
    options = dict(BM=FEW_UNITS.BM, BN=FEW_UNITS.BN, BK=FEW_UNITS.BK, STAGES=FEW_UNITS.num_stages,
                   num_warps=FEW_UNITS.num_warps, maxnreg=max_registers(FEW_UNITS))
    if stamps is None:
        kernel = ws.scaled_experts_decode_ws_kernel[grid]
        options.update(SCALING=BLOCKWISE, GLU=CONCATENATED, USE_TMA=True, CHUNK=64,
                       PRECISION="bf16")
    else:
        kernel = decode_timed_kernel[grid]
        args += (stamps, )
        options.update(DRAIN=drain)
    return (lambda: kernel(*args, **options)), parts


def report(stamps):
    """Lines: each phase's median / largest µs over the programs that had a
    unit, the MMA partition's waits for slots, the start skew and the
    kernel's span."""
    s = stamps.double().cpu()
    s = s[s[:, 3] != 0]
    lines = []
    for name, a, b in PHASES:
        span = (s[:, b] - s[:, a]) / 1e3
        lines.append(f"  {name:22s} median {span.median().item():6.2f}  max "
                     f"{span.max().item():6.2f} µs")
    for name, mark in (("mma: up's waits", 12), ("mma: down's waits", 13)):
        lines.append(f"  {name:22s} median {s[:, mark].median().item() / 1e3:6.2f}  max "
                     f"{s[:, mark].max().item() / 1e3:6.2f} µs")
    ends = torch.maximum(torch.maximum(s[:, 8], s[:, 11]), s[:, 16])
    lines.append(f"  start skew {(s[:, 0].max() - s[:, 0].min()).item() / 1e3:.2f} µs, "
                 f"span {(ends.max() - s[:, 0].min()).item() / 1e3:.2f} µs over {len(s)} "
                 "programs with a unit")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--drains", type=int, nargs="*", default=[0, 1])
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dummy = torch.zeros(1, device="cuda")
    floor = 1e3 * time_ms(graphed(lambda: nothing_kernel[(sms,)](dummy)))
    print(f"a graph of one empty kernel: {floor:.1f} µs", flush=True)
    for name, shape in SHAPES.items():
        if args.filter not in name:
            continue
        for tokens in args.tokens:
            torch.manual_seed(tokens)
            case = make_case(*shape, tokens)
            plain, plain_parts = launcher(case)
            plain_us = 1e3 * time_ms(graphed(plain))
            print(f"{name} T={tokens}: kernel {plain_us:.1f} µs", flush=True)
            for drain in args.drains:
                stamps = torch.zeros(sms, MARKS.value, dtype=torch.int64, device="cuda")
                timed, parts = launcher(case, stamps, drain)
                timed_us = 1e3 * time_ms(graphed(timed))
                torch.cuda.synchronize()
                error = rel_error(parts.sum(1), plain_parts.sum(1))
                print(f" DRAIN {drain}: {timed_us:.1f} µs (parts vs the "
                      f"kernel's {error:.0e})", flush=True)
                print("\n".join(report(stamps)), flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()
